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


def compare(out: torch.Tensor, ref: torch.Tensor) -> Accuracy:
    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} differs from the host's {tuple(ref.shape)}")
    a = out.detach().reshape(-1).double()
    b = ref.detach().reshape(-1).double()
    finite = bool(torch.isfinite(a).all())
    if not finite:
        return Accuracy(float("nan"), float("inf"), float("-inf"), False)
    diff = a - b
    nb, na = torch.linalg.vector_norm(b), torch.linalg.vector_norm(a)
    denom = (na * nb).item()
    cosine = (a @ b).item() / denom if denom > 0 else (1.0 if na.item() == nb.item() else 0.0)
    rel = (torch.linalg.vector_norm(diff) / nb).item() if nb.item() > 0 else float(torch.linalg.vector_norm(diff) > 0)
    mse = (diff * diff).mean().item()
    span = (b.max() - b.min()).item()
    psnr = float("inf") if mse == 0 else (10 * math.log10(span * span / mse) if span > 0 else float("-inf"))
    return Accuracy(cosine=cosine, rel_l2=rel, psnr_db=psnr, finite=True)
