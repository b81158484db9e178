"""FA3's FP8 operands in one pass over Q, K and V: the scales and K's mean carried from the site's previous call.

``fp8_heads.quantize_heads`` must read the inputs twice, because a head's scale needs that head's absolute maximum
before any of its elements can be written. At image lengths that second read is what the quantization costs
beyond the least it could: at Flux's 24 x 4608 x 128 on an H100 both launches take 0.076 ms beside FA3's FP8
kernel's 0.294, the quantizing launch alone 0.047 (``benchmarks/attention_parts.py``). A diffusion model calls
each attention site once per step on activations that change little from one step to the next, so the site's
previous call already knows each head's scale to within a small factor. This pass uses it:

- Scale: the previous call's absmax of the head times ``HEADROOM``, over 448. e4m3 is floating point, so a scale
  a few times too large costs no precision, only range at the bottom: the elements that fall below e4m3's normal
  range are those under amax * HEADROOM / 2**14.8 (of amax / 7000 at a headroom of 4), and their absolute
  error stays under amax * HEADROOM / 2**16.8.
- K's mean: the previous call's. Any vector subtracted from every key leaves attention exact (the softmax cancels
  q . m), so the smoothing needs a mean only near the current one; the pass sums K's columns for the next call.
- Check: the pass takes each head's absmax of what it quantized (K's less the mean it used). A head whose absmax
  exceeds 448 times its scale (something was clamped) or lies more than ``MAX_OVERSCALE`` times below it (the
  scale was far too large) is quantized again by ``_repair_kernel`` with its exact scale, and its descale factor
  replaced. The check runs on the device, with no synchronisation. Where nothing needs repair, the repair launch's
  programs (``REPAIR_SPLIT`` per head of Q, K and V) read two numbers and stop. A CUDA graph captured around an
  eager call replays both launches on the statistics the captured call read (the host picks the buffers once, at
  capture); the repair keeps those copies right.
- After a site's first call (two passes), K's carried absmax is that of the raw keys, not of the keys less their
  mean; so the second call's K scale is too large by the keys' offset, and a head whose offset exceeds about 16
  times its spread is repaired once, at that call. From then on the pass records the smoothed absmax.

A call without statistics (a site's first call) runs ``quantize_heads`` with accumulators the caller keeps: they are
this module's ``last`` at the next call. Each call's statistics go into the other of two buffers (``into``), zeroed
first. The copies depend on the previous call's statistics, so a site's outputs depend on the order of its calls;
the same calls in the same order give the same bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .fp8_heads import (FIXED_LIMIT, FIXED_ONE, FP8_MAX, WARPS, _INTERPRETED, Buffers, HeadScaledFp8, _absmax,
                        _check, _kv_slot, _leads_group, _scale_of, _store_e4m3, _tile, _where, accumulator_size,
                        copies, programs, split_accumulators)

HEADROOM = tl.constexpr(4.0)  # the carried scale: the last absmax times this, over 448
MAX_OVERSCALE = tl.constexpr(64.0)  # a scale more than this many times the exact one is repaired
REPAIR_SPLIT = 16  # programs per head of the repair launch, each taking every REPAIR_SPLIT-th block of rows


@triton.jit
def _carried_scale(last_amax):
    return tl.where(last_amax > 0, last_amax * (HEADROOM / FP8_MAX), 1.0)


@triton.jit
def _needs_repair(amax, scale):
    """The head's copy lost values to the clamp, or its scale lies too far above the exact one (an all-zero head is
    exact at any scale)."""
    return (amax > 0) & ((amax > scale * FP8_MAX) | (amax * MAX_OVERSCALE < scale * FP8_MAX))


@triton.jit
def _carried_kernel(Q, K, V, Q8, K8, V8, LAST_AMAX, LAST_KSUM, AMAX, KSUM, DESCALE, sqb, sqh, sqs, sqd, skb, skh, sks,
                    skd, svb, svh, svs, svd, HQ, HKV, SQ, SKV, n_q, n_k, bh_q, bh_kv, D: tl.constexpr,
                    DP: tl.constexpr, BLOCK: tl.constexpr, GRID_FIRST: tl.constexpr):
    """A block of rows of one head into e4m3 at its carried scale (K less the carried mean); its absmax (of what was
    quantized) into AMAX, and for K its raw column sums in fixed point into KSUM, for the repair and the next call."""
    which, blk, bh = _where(tl.program_id(0), n_q, n_k, bh_q, bh_kv)
    if which == 0:
        x, rows, cols, inside = _tile(Q, blk, bh, sqb, sqh, sqs, sqd, HQ, SQ, D, DP, BLOCK)
        slot = _kv_slot(bh, HQ, HKV)
        scale = _carried_scale(tl.load(LAST_AMAX + slot))
        _store_e4m3(Q8, x * (1.0 / scale), rows, cols, inside, bh, HQ, SQ, D, GRID_FIRST)
        tl.atomic_max(AMAX + slot, _absmax(x), sem="relaxed")
        if (blk == 0) & _leads_group(bh, HQ, HKV):
            tl.store(DESCALE + slot, scale)
    elif which == 1:
        x, rows, cols, inside = _tile(K, blk, bh, skb, skh, sks, skd, HKV, SKV, D, DP, BLOCK)
        mean = tl.load(LAST_KSUM + bh * D + cols, mask=cols < D, other=0).to(tl.float32) * (1.0 / (FIXED_ONE * SKV))
        y = tl.where(inside, x - mean[None, :], 0.0)
        scale = _carried_scale(tl.load(LAST_AMAX + bh_kv + bh))
        _store_e4m3(K8, y * (1.0 / scale), rows, cols, inside, bh, HKV, SKV, D, GRID_FIRST)
        tl.atomic_max(AMAX + bh_kv + bh, _absmax(y), sem="relaxed")
        fixed = tl.minimum(tl.maximum(tl.sum(x, axis=0) * FIXED_ONE, -FIXED_LIMIT), FIXED_LIMIT).to(tl.int64)
        tl.atomic_add(KSUM + bh * D + cols, fixed, mask=cols < D, sem="relaxed")
        if blk == 0:
            tl.store(DESCALE + bh_kv + bh, scale)
    else:
        x, rows, cols, inside = _tile(V, blk, bh, svb, svh, svs, svd, HKV, SKV, D, DP, BLOCK)
        scale = _carried_scale(tl.load(LAST_AMAX + 2 * bh_kv + bh))
        _store_e4m3(V8, x * (1.0 / scale), rows, cols, inside, bh, HKV, SKV, D, GRID_FIRST)
        tl.atomic_max(AMAX + 2 * bh_kv + bh, _absmax(x), sem="relaxed")
        if blk == 0:
            tl.store(DESCALE + 2 * bh_kv + bh, scale)


@triton.jit
def _repair_kernel(Q, K, V, Q8, K8, V8, LAST_AMAX, LAST_KSUM, AMAX, DESCALE, REPAIRED, sqb, sqh, sqs, sqd, skb, skh,
                   sks, skd, svb, svh, svs, svd, HQ, HKV, SQ, SKV, bh_kv, n_blk_q, n_blk_kv, D: tl.constexpr,
                   DP: tl.constexpr, BLOCK: tl.constexpr, SPLIT: tl.constexpr, GRID_FIRST: tl.constexpr):
    """Program (which * B * Hkv + slot, r): if that head's carried scale did not hold (``_needs_repair``), its blocks
    r, r + SPLIT, ... again at the exact scale (Q: every query head of the kv head's group), and (r == 0) the new
    descale factor, and one more in REPAIRED."""
    p = tl.program_id(0)
    r = tl.program_id(1)
    which = p // bh_kv
    slot = p % bh_kv
    amax = tl.load(AMAX + p)
    if _needs_repair(amax, _carried_scale(tl.load(LAST_AMAX + p))):
        scale = _scale_of(amax)
        if which == 0:
            group = HQ // HKV
            first = (slot // HKV) * HQ + (slot % HKV) * group  # b * HQ + the group's first query head
            for i in range(r, group * n_blk_q, SPLIT):
                bh = first + i // n_blk_q
                x, rows, cols, inside = _tile(Q, i % n_blk_q, bh, sqb, sqh, sqs, sqd, HQ, SQ, D, DP, BLOCK)
                _store_e4m3(Q8, x * (1.0 / scale), rows, cols, inside, bh, HQ, SQ, D, GRID_FIRST)
        elif which == 1:
            cols = tl.arange(0, DP)
            mean = tl.load(LAST_KSUM + slot * D + cols, mask=cols < D, other=0).to(tl.float32) * (
                1.0 / (FIXED_ONE * SKV))
            for blk in range(r, n_blk_kv, SPLIT):
                x, rows, cols, inside = _tile(K, blk, slot, skb, skh, sks, skd, HKV, SKV, D, DP, BLOCK)
                y = tl.where(inside, x - mean[None, :], 0.0)
                _store_e4m3(K8, y * (1.0 / scale), rows, cols, inside, slot, HKV, SKV, D, GRID_FIRST)
        else:
            for blk in range(r, n_blk_kv, SPLIT):
                x, rows, cols, inside = _tile(V, blk, slot, svb, svh, svs, svd, HKV, SKV, D, DP, BLOCK)
                _store_e4m3(V8, x * (1.0 / scale), rows, cols, inside, slot, HKV, SKV, D, GRID_FIRST)
        if r == 0:
            tl.store(DESCALE + p, scale)
            tl.atomic_add(REPAIRED, 1, sem="relaxed")


def quantize_heads_carried(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, last: torch.Tensor, into: torch.Tensor,
                           repaired: torch.Tensor, buffers: Buffers | None = None) -> HeadScaledFp8:
    """e4m3 copies of B, H, S, D ``q``, ``k``, ``v`` with per-(batch, kv head) descale factors, as
    ``quantize_heads`` makes them, in one pass at the scales and K mean that ``last`` (the accumulators the site's
    previous call left, ``accumulator_size`` int64 elements) implies, any head where they did not hold repaired
    (module docstring). ``into`` (as large, not ``last``) is zeroed and receives this call's accumulators;
    ``repaired`` (int32, one element) counts the heads repaired."""
    _check(q, k, v)
    size = accumulator_size(q, k)
    for name, acc in (("last", last), ("into", into)):
        if acc.dtype != torch.int64 or acc.numel() != size or acc.device != q.device:
            raise ValueError(f"{name} must be {size} int64 elements on {q.device} (accumulator_size), got "
                             f"{acc.numel()} {acc.dtype} on {acc.device}")
    if last.data_ptr() == into.data_ptr():
        raise ValueError("into must not be last: the pass reads last while it fills into")
    B, HQ, SQ, D = q.shape
    HKV, SKV = k.shape[1], k.shape[2]
    q8, k8, v8, descale = copies(q, k, buffers)
    into.zero_()
    last_sums, last_amax = split_accumulators(last, k)
    sums, amax = split_accumulators(into, k)
    p = programs(q, k, v)
    _carried_kernel[p.grid](q, k, v, q8, k8, v8, last_amax, last_sums, amax, sums, descale, *p.strides, *p.shapes,
                            D=D, DP=p.dp, BLOCK=p.block, GRID_FIRST=_INTERPRETED, num_warps=WARPS)
    n_blk_q, n_blk_kv = triton.cdiv(SQ, p.block), triton.cdiv(SKV, p.block)
    _repair_kernel[(3 * B * HKV, REPAIR_SPLIT)](q, k, v, q8, k8, v8, last_amax, last_sums, amax, descale, repaired,
                                               *p.strides, HQ, HKV, SQ, SKV, B * HKV, n_blk_q, n_blk_kv, D=D, DP=p.dp,
                                               BLOCK=p.block, SPLIT=REPAIR_SPLIT, GRID_FIRST=_INTERPRETED,
                                               num_warps=WARPS)
    return HeadScaledFp8(q8, k8, v8, descale)
