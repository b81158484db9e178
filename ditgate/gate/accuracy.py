"""Accuracy of a candidate's output against the host's: cosine, relative L2, PSNR (in float64)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Accuracy:
    cosine: float
    rel_l2: float
    psnr_db: float  # against the reference's peak-to-peak range; inf when identical
    finite: bool


CHUNK = 1 << 22  # elements per float64 slice: a few tens of MiB of temporaries however large the output


def compare(out: torch.Tensor, ref: torch.Tensor) -> Accuracy:
    """The three measures over every element, in float64, a slice at a time: the sums are exact enough in float64,
    and the float64 temporaries stay a slice's (a non-contiguous output is copied once in its own dtype to be
    sliced). Whole-tensor float64 copies of a HunyuanVideo attention output (207M elements) are 6-7 GB beside a
    26 GB model, which the allocator must find at every site a contest checks. One host synchronisation at the end.
    Not finite when either output holds a NaN or an infinity: a host output that does passes no form."""
    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} differs from the host's {tuple(ref.shape)}")
    if out.numel() == 0:
        raise ValueError("empty outputs: nothing to compare")
    a_all, b_all = out.detach().reshape(-1), ref.detach().reshape(-1)
    zero = torch.zeros((), dtype=torch.float64, device=a_all.device)
    dot, na2, nb2, d2 = zero.clone(), zero.clone(), zero.clone(), zero.clone()
    bmax = torch.full((), -math.inf, dtype=torch.float64, device=a_all.device)
    bmin = torch.full((), math.inf, dtype=torch.float64, device=a_all.device)
    finite = torch.ones((), dtype=torch.bool, device=a_all.device)
    for start in range(0, a_all.numel(), CHUNK):
        a = a_all[start:start + CHUNK].double()
        b = b_all[start:start + CHUNK].double()
        finite &= torch.isfinite(a).all() & torch.isfinite(b).all()
        dot += a @ b
        na2 += a @ a
        nb2 += b @ b
        diff = a - b
        d2 += diff @ diff
        bmax = torch.maximum(bmax, b.max())
        bmin = torch.minimum(bmin, b.min())
    is_finite, dot, na2, nb2, d2, bmax, bmin = torch.stack(
        [finite.double(), dot, na2, nb2, d2, bmax, bmin]).tolist()
    if not is_finite:
        return Accuracy(float("nan"), float("inf"), float("-inf"), False)
    na, nb = math.sqrt(na2), math.sqrt(nb2)
    denom = na * nb
    cosine = dot / denom if denom > 0 else (1.0 if na == nb else 0.0)
    rel = math.sqrt(d2) / nb if nb > 0 else float(d2 > 0)
    mse = d2 / a_all.numel()
    span = bmax - bmin
    psnr = float("inf") if mse == 0 else (10 * math.log10(span * span / mse) if span > 0 else float("-inf"))
    return Accuracy(cosine=cosine, rel_l2=rel, psnr_db=psnr, finite=True)
