"""fa3_fp8's quantization as plain torch ops, for compiled graphs (opt-in: ``DITGATE_FA3_FP8_GRAPH=traced``).

Eager calls quantize with ditgate's own Triton passes (``kernels.fp8_heads``): inside a compiled graph those are an
opaque custom op, so the graph first writes Q, K and V in bf16 (after the host's norms and rotary embeddings), then
the op reads them twice and writes the e4m3 copies. Written as torch ops instead, the absolute maxima and K's
per-channel statistics are reductions the compiler may fuse with the producers' pointwise work, and the casts their
epilogues. Measured at compiled Flux 1024 on an H100 it did not: each head's scale needs a reduction over its whole
sequence before any element is cast, and the path added about 11 kernels per attention site against the op's 2
(``benchmarks/results/h100/2026-12-07-round2k/``). So the op stays the default; this path is kept for other shapes
and GPUs.

The numbers are those of ``kernels.fp8_heads`` (one descale per (batch, kv head), Q's spanning its kv head's query
heads; 1 for an all-zero head; values clamped to +-448 before the cast, which rounds to nearest even), with one
difference: K's scale is the exact absolute maximum of K less its mean, taken from each channel's maximum and minimum
(``max(max_c - m_c, m_c - min_c)``), which one reduction gives beside the sums. The Triton passes use the bound
``amax(k) + max_c |m_c|`` instead (they have only the absolute maximum when the mean is known), so K's copies here
are at least as fine. Smoothing K is exact for attention (the softmax cancels ``q . m``); ``kernels.fp8_heads``
says why it helps.
"""

from __future__ import annotations

import torch

from .linear import FP8_MAX as E4M3_MAX


def descale_of(amax: torch.Tensor) -> torch.Tensor:
    """The descale factor FA3 wants (x ~ x8 * descale) for float32 absolute maxima: 1 where a head is all zero."""
    return torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))


def to_e4m3(x: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    """float32 ``x`` [B, H, S, D] over its per-head ``descale`` [B, H] into e4m3, clamped (never NaN)."""
    y = x * (1.0 / descale)[:, :, None, None]
    return y.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def quantize_heads_traced(q: torch.Tensor, k: torch.Tensor,
                          v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """e4m3 copies of B, H, S, D ``q``, ``k`` (less its mean over the sequence) and ``v``, with their descale factors
    float32 [3, B, Hkv] (Q's, K's, V's). The copies keep the inputs' layout (the compiler decides their storage)."""
    B, HQ, _, _ = q.shape
    HKV = k.shape[1]
    if HQ % HKV:
        raise ValueError(f"{HQ} query heads do not share {HKV} key/value heads evenly")
    group = HQ // HKV
    qf, kf, vf = q.float(), k.float(), v.float()
    q_descale = descale_of(qf.abs().amax(dim=(2, 3)).view(B, HKV, group).amax(dim=2))
    mean = kf.mean(dim=2, keepdim=True)
    spread = torch.maximum(kf.amax(dim=2, keepdim=True) - mean, mean - kf.amin(dim=2, keepdim=True))
    k_descale = descale_of(spread.amax(dim=(2, 3)))
    v_descale = descale_of(vf.abs().amax(dim=(2, 3)))
    q8 = to_e4m3(qf, q_descale.repeat_interleave(group, dim=1))
    k8 = to_e4m3(kf - mean, k_descale)
    v8 = to_e4m3(vf, v_descale)
    return q8, k8, v8, torch.stack((q_descale, k_descale, v_descale))
