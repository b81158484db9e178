"""ditgate's 8-bit attention operands in one read of Q, K and V: K's mean and V's channel scales carried from the
site's previous call.

``quant_passes.quantize`` reads K and V twice: K's mean and V's per-channel absmax are sums and maxima over the whole
sequence, so no key block can be written before every block has been read. At image lengths that second read is a
visible part of the form (``benchmarks/attention_parts.py``: about 0.07 ms of 0.65 at 24 x 8192 x 64 on an H100).
A diffusion model calls each attention site once per step on activations that change little between steps, so the
site's previous call knows both to within a small factor. This module uses them, as ``fp8_heads_carried`` does for
fa3_fp8:

- Q: per block, as ``quantize`` does (its scale needs nothing but the block).
- K: less the previous call's mean, then per block at the block's own absmax. Any vector subtracted from every key
  leaves the attention exact (the softmax cancels q . m), and the block's scale is exact for what it quantizes, so
  a stale mean costs only some of the smoothing: nothing is ever clamped and nothing needs repair. The pass sums
  K's columns per block, for the next call's mean (and for the sparse selector's pooled tiles, as before).
- V: at ``HEADROOM`` times the previous call's per-channel scale (e4m3 is floating point: a scale a few times too
  large costs range at the bottom, elements below amax * HEADROOM / 2**14.8, not precision). The pass records
  each block's channel maxima; ``_kv_scales_kernel`` turns them into this call's exact scales (the next call's
  carried ones); then ``_repair_v_kernel`` re-quantizes, on the device, every block of a head where some channel's
  carried scale did not hold (the channel's absmax above 448 times it: clamped; or the scale above
  ``MAX_OVERSCALE`` times the exact one), at the exact scale for those channels, and counts the heads. Where
  nothing needs repair its programs read 2 x D numbers and stop. Without synchronisation: a CUDA graph captured
  around an eager call replays on the statistics it captured, and the repair keeps those copies right.

Three launches, as ``quantize`` makes, but K and V are read once. A site's first call (no statistics yet) runs
``quantize`` with ``statistics=`` the buffer it leaves for the next call. The copies depend on the previous call's
statistics, so a site's outputs depend on the order of its calls; the same calls in the same order give the same
bits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from .quant_passes import (LOG2E, Quantized, _block_and_head, _quant_rows, _quant_v_block, check_statistics,
                           launch_kv_scales, outputs, workspace)

if TYPE_CHECKING:
    from .quant_attention import KernelConfig

HEADROOM = tl.constexpr(4.0)  # V's carried scale: the previous call's exact one times this
MAX_OVERSCALE = tl.constexpr(64.0)  # a carried scale more than this many times the exact one is repaired
NO_SCALE = tl.constexpr(1e-20)  # the least scale ``_kv_scales_kernel`` writes: a channel whose absmax is 0
CARRIED_PASS_WARPS = 4  # ``_quant_kv_kernel``'s: most of the pass, and all of a repair, is K's and V's blocks


def statistics_size(k: torch.Tensor) -> int:
    """float32 elements of one site's statistics: K's mean and V's exact channel scales, D each per batch and key
    head."""
    B, HK, _, D = k.shape
    return 2 * B * HK * D


def split_statistics(stats: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(K's mean, V's exact scales), each [B * HK, D], as views of ``stats`` (the layout ``quantize`` writes)."""
    B, HK, _, D = k.shape
    mean, exact = stats.view(2, B * HK, D)
    return mean, exact


@triton.jit
def _carried_v_scale(exact):
    return exact * HEADROOM


@triton.jit
def _carried_pass_kernel(Q, Q8, QS, Q_SUMS, K, K8, KS, K_SUMS, LAST, V, VT8, V_MAX, n_stat, sqb, sqh, sqs, sqd,
                         skb, skh, sks, skd, svb, svh, svs, svd, H, HK, SQ, SK, SQ_PAD, SK_PAD, n_m, n_n, q_programs,
                         kv_programs, mult, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         TO_INT8: tl.constexpr, QMAX: tl.constexpr, HAS_SUMS: tl.constexpr, PERMUTE: tl.constexpr):
    """Programs below ``q_programs``: a block of Q (as ``quantize``). The next ``kv_programs``: a block of K less the
    carried mean (``LAST``'s first ``n_stat`` numbers) at its own scale, its raw column sums into ``K_SUMS``. The
    rest: a block of V at the carried channel scales (from ``LAST``'s exact ones, after the mean), its channel maxima
    into ``V_MAX``."""
    pid = tl.program_id(0)
    if pid < q_programs:
        blk, bh = _block_and_head(pid, q_programs // n_m)
        _quant_rows(Q, Q8, QS, QS, Q_SUMS, blk, bh, sqb, sqh, sqs, sqd, H, SQ, SQ_PAD, n_m, mult,
                    D, BLOCK_M, False, TO_INT8, QMAX, HAS_SUMS)
    elif pid < q_programs + kv_programs:
        blk, bh = _block_and_head(pid - q_programs, kv_programs // n_n)
        _quant_rows(K, K8, KS, LAST, K_SUMS, blk, bh, skb, skh, sks, skd, HK, SK, SK_PAD, n_n, 1.0,
                    D, BLOCK_N, True, TO_INT8, QMAX, True)
    else:
        p = pid - q_programs - kv_programs
        blk, bh = _block_and_head(p, kv_programs // n_n)
        channels = tl.arange(0, D)
        scale = _carried_v_scale(tl.load(LAST + n_stat + bh * D + channels))
        vmax = _quant_v_block(V, VT8, scale, p, svb, svh, svs, svd, HK, SK, SK_PAD, D, BLOCK_N, PERMUTE,
                              kv_programs // n_n)
        tl.store(V_MAX + (bh * n_n + blk) * D + channels, vmax)


@triton.jit
def _repair_v_kernel(V, VT8, LAST, INTO, n_stat, V_SCALE, REPAIRED, svb, svh, svs, svd, HK, SK, SK_PAD, n_n,
                     kv_programs, D: tl.constexpr, BLOCK: tl.constexpr, PERMUTE: tl.constexpr):
    """A block of V per program: where some channel of its head did not hold its carried scale, the block again
    at the scale each channel then takes (the exact one where it did not hold, the carried one elsewhere); the
    head's block 0 writes the scales the kernel reads (``V_SCALE``) and counts a repaired head."""
    p = tl.program_id(0)
    blk, bh = _block_and_head(p, kv_programs // n_n)
    channels = tl.arange(0, D)
    carried = _carried_v_scale(tl.load(LAST + n_stat + bh * D + channels))
    exact = tl.load(INTO + n_stat + bh * D + channels)
    # a carried scale that is not a finite number (the last call's V held an inf or a NaN) never holds
    bad = (exact > NO_SCALE) & ((exact > carried) | (carried > exact * MAX_OVERSCALE) | ~(carried < float("inf")))
    repair = tl.max(bad.to(tl.int32), axis=0) > 0
    scale = tl.where(bad, exact, carried)
    if repair:
        _quant_v_block(V, VT8, scale, p, svb, svh, svs, svd, HK, SK, SK_PAD, D, BLOCK, PERMUTE, kv_programs // n_n)
    if blk == 0:
        tl.store(V_SCALE + bh * D + channels, scale)
        if repair:
            tl.atomic_add(REPAIRED, 1, sem="relaxed")


def quantize_carried(q, k, v, qk: str, scale: float, cfg: KernelConfig, last: torch.Tensor, into: torch.Tensor,
                     repaired: torch.Tensor, buffers=None, permute_v: bool = False, sums: bool = False) -> Quantized:
    """``quant_passes.quantize``'s copies (the same arguments, the same ``Quantized``) in one read of Q, K and V, at
    the K mean and V scales that ``last`` (the statistics the site's previous call left, ``statistics_size``
    float32 elements) carries; V's blocks repaired where a carried scale did not hold (module docstring).
    ``into`` (as large, not ``last``) receives this call's statistics; ``repaired`` (int32, one element) counts
    the heads whose V was quantized again."""
    B, H, SQ, D = q.shape
    HK, SK = k.shape[1], k.shape[2]
    n_stat = B * HK * D
    check_statistics("last", last, n_stat, q.device)
    check_statistics("into", into, n_stat, q.device)
    if last.data_ptr() == into.data_ptr():
        raise ValueError("into must not be last: the pass reads last while the next launch fills into")
    o = outputs(q, k, qk, cfg, buffers, sums)
    v_scale = workspace(buffers, q.device)((B * HK, D), torch.float32, "v_scale")
    q_programs, kv_programs = o.n_m * B * H, o.n_n * B * HK
    _carried_pass_kernel[(q_programs + 2 * kv_programs,)](
        q, o.q, o.q_scale, o.q_sums, k, o.k, o.k_scale, o.k_sums, last, v, o.vt, o.v_max, n_stat, *q.stride(),
        *k.stride(), *v.stride(), H, HK, SQ, SK, o.sq_pad, o.sk_pad, o.n_m, o.n_n, q_programs, kv_programs,
        scale * LOG2E, D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, TO_INT8=qk == "int8", QMAX=o.qmax,
        HAS_SUMS=sums, PERMUTE=permute_v, num_warps=CARRIED_PASS_WARPS)
    launch_kv_scales(o, into, n_stat, SK)
    _repair_v_kernel[(kv_programs,)](v, o.vt, last, into, n_stat, v_scale, repaired, *v.stride(), HK, SK, o.sk_pad,
                                     o.n_n, kv_programs, D=D, BLOCK=cfg.block_n, PERMUTE=permute_v,
                                     num_warps=CARRIED_PASS_WARPS)
    return Quantized(o.q, o.q_scale, o.k, o.k_scale, o.vt, v_scale, o.sq_pad, o.sk_pad, qk, float(scale), cfg.block_m,
                     cfg.block_n, permute_v, o.k_sums, o.q_sums if sums else None)
