"""Q, K and V as e4m3 copies with one scale per (batch, key/value head), for FlashAttention-3's FP8 kernel.

FA3's FP8 forward (``forms.fa3``) takes e4m3 Q, K, V in B, S, H, D (last dimension contiguous, V in the same
layout as K) and one float32 descale factor per (batch, key/value head) for each of them, shape (B, H_kv): it
multiplies Q's and K's into the softmax scale and V's into the output. So Q's scale spans every query head
that shares a key/value head, and each scale needs its head's absolute maximum over the whole sequence before
any element of that head can be written: two reads of the inputs are the least a bf16-to-FP8 pass can make.

Numerics:
- scale = amax / 448 (e4m3's largest finite value), the descale FA3 wants (x ~ x8 * scale); 1 for an all-zero
  head; values are clamped to +-448 before the cast (round to nearest even), so nothing saturates to NaN.
- K is smoothed: its mean over the sequence, per (batch, head, channel), is subtracted before quantizing. Exact
  for attention: q . (k - m) differs from q . k by q . m, the same for every key of a query's row, which the
  softmax cancels. What it buys: e4m3 is floating point, so its rounding error is relative to |k - m| rather
  than |k|, and keys that share a large per-channel offset lose far less.
- K's scale is (amax(k) + max_c |m_c|) / 448, a bound on amax(k - m) (not the exact figure, which would need
  the mean before the maximum: a third read). It never saturates and is at most about twice too large, which
  costs e4m3 one of its ~17 binades of range and no precision (rounding error is relative to each value).
- K's column sums are accumulated in fixed point (int64, 2**-16 units, each block's sum clamped to +-2**30):
  integer atomic adds are exact and order-free, so the same inputs give the same copies on every run (float
  atomics would not). The mean's error is below 2**-17 per block of rows; any error there still leaves the
  attention exact (see the smoothing), and the bound above holds for whatever mean was used.

Launches: the accumulators are zeroed (one fill), then ``_reduce_kernel`` (one program per block of rows of one
head of Q, K or V, all three in one launch: absmax and K's sums, into the accumulators by atomics), then
``_quantize_kernel`` (the same programs, writing the e4m3 copies and the descale factors). The second launch
takes its programs in reverse order by default (``reverse``), so that it starts on the blocks the first
launch read last, the likeliest still in L2 (at Flux's 24 x 4608 x 128 the three inputs are 85 MB against the
H100's 50 MB of L2). Programs take the same block of consecutive heads one after another, so the programs
running at once read whole token rows of diffusers' B, S, H, D storage and write whole rows of the copies.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

FP8_MAX = tl.constexpr(448.0)
FIXED_ONE = tl.constexpr(65536.0)  # 2**16: the unit of K's fixed-point column sums
FIXED_LIMIT = tl.constexpr(2.0 ** 46)  # each block's sum is clamped to +-2**30 in value: 2**17 blocks cannot overflow
ELEMENTS_PER_PROGRAM = 8192  # rows x padded head dim per program (64 rows at head dim 128)
WARPS = 2
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # read when Triton reads it: at import

Buffers = Callable[[tuple[int, ...], torch.dtype, str], torch.Tensor]


@dataclass(frozen=True)
class HeadScaledFp8:
    """FA3's FP8 operands: e4m3 copies in B, S, H, D (contiguous) and their descale factors."""

    query: torch.Tensor  # [B, Sq, Hq, D]
    key: torch.Tensor  # [B, Skv, Hkv, D], K less its per-channel mean over the sequence
    value: torch.Tensor  # [B, Skv, Hkv, D]
    descale: torch.Tensor  # float32 [3, B, Hkv]: Q's, K's and V's, each x ~ x8 * descale


@triton.jit
def _where(pid, n_q, n_k, bh_q, bh_kv):
    """Which tensor (0 Q, 1 K, 2 V), row block and batch * heads + head the ``pid``-th program takes: Q's
    programs first, then K's, then V's, each taking the same block of consecutive heads one after another."""
    which = (pid >= n_q).to(tl.int32) + (pid >= n_q + n_k).to(tl.int32)
    p = pid - tl.where(which == 0, 0, tl.where(which == 1, n_q, n_q + n_k))
    heads = tl.where(which == 0, bh_q, bh_kv)
    return which, p // heads, p % heads


@triton.jit
def _kv_slot(bh, HQ, HKV):
    """Where query head ``bh`` (b * HQ + h) keeps its scale: b * HKV + its kv head (Q's scale spans the query heads
    that share a kv head, as FA3's descale is per (batch, kv head))."""
    return (bh // HQ) * HKV + (bh % HQ) // (HQ // HKV)


@triton.jit
def _leads_group(bh, HQ, HKV):
    """Whether query head ``bh`` is the first of its kv head's group: the one that writes the group's descale."""
    return (bh % HQ) % (HQ // HKV) == 0


@triton.jit
def _tile(X, blk, bh, sb, sh, ss, sd, H, S, D: tl.constexpr, DP: tl.constexpr, BLOCK: tl.constexpr):
    """Rows ``blk * BLOCK ...`` of head ``bh`` (b * H + h) of a B, H, S, D view, as float32 (zeros outside)."""
    rows = blk * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, DP)
    inside = (rows[:, None] < S) & (cols[None, :] < D)
    base = (bh // H).to(tl.int64) * sb + (bh % H).to(tl.int64) * sh
    x = tl.load(X + base + rows[:, None].to(tl.int64) * ss + cols[None, :] * sd, mask=inside, other=0.0)
    return x.to(tl.float32), rows, cols, inside


@triton.jit
def _absmax(x):
    return tl.max(tl.max(tl.abs(x), axis=1), axis=0)


@triton.jit
def _reduce_kernel(Q, K, V, AMAX, KSUM, sqb, sqh, sqs, sqd, skb, skh, sks, skd, svb, svh, svs, svd, HQ, HKV, SQ, SKV,
                   n_q, n_k, bh_q, bh_kv, D: tl.constexpr, DP: tl.constexpr, BLOCK: tl.constexpr):
    """A block of rows of one head: its absmax into AMAX[which, b * HKV + kv head] (atomic max; Q's query heads
    of one kv head share a slot), and for K its column sums in fixed point into KSUM[b * HKV + h, :]."""
    which, blk, bh = _where(tl.program_id(0), n_q, n_k, bh_q, bh_kv)
    if which == 0:
        x, _, _, _ = _tile(Q, blk, bh, sqb, sqh, sqs, sqd, HQ, SQ, D, DP, BLOCK)
        tl.atomic_max(AMAX + _kv_slot(bh, HQ, HKV), _absmax(x), sem="relaxed")
    elif which == 1:
        x, _, cols, _ = _tile(K, blk, bh, skb, skh, sks, skd, HKV, SKV, D, DP, BLOCK)
        tl.atomic_max(AMAX + bh_kv + bh, _absmax(x), sem="relaxed")
        fixed = tl.minimum(tl.maximum(tl.sum(x, axis=0) * FIXED_ONE, -FIXED_LIMIT), FIXED_LIMIT).to(tl.int64)
        tl.atomic_add(KSUM + bh * D + cols, fixed, mask=cols < D, sem="relaxed")
    else:
        x, _, _, _ = _tile(V, blk, bh, svb, svh, svs, svd, HKV, SKV, D, DP, BLOCK)
        tl.atomic_max(AMAX + 2 * bh_kv + bh, _absmax(x), sem="relaxed")


@triton.jit
def _on_e4m3_grid(y):
    """``y`` (|y| <= 448) rounded to the nearest e4m3 value, ties to even, in float32 arithmetic: adding and taking
    away 1.5 * 2**23 times the e4m3 step at y's binade (2**-9 below the normal range) leaves y a multiple of it."""
    step = tl.maximum(((y.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 130, -9)
    c = (((step + 150) << 23) | (1 << 22)).to(tl.float32, bitcast=True)
    r = (y + c) - c
    return tl.where(r == 0, y * 0.0, r)  # a value that rounds to zero keeps its sign, as the cast's -0


@triton.jit
def _store_e4m3(OUT, y, rows, cols, inside, bh, H, S, D: tl.constexpr, GRID_FIRST: tl.constexpr):
    """``y`` (already divided by its scale) as e4m3 into rows of head ``bh`` of a contiguous [B, S, H, D] copy.
    ``GRID_FIRST``: round in float32 first (``_on_e4m3_grid``), so that the cast only meets e4m3 values: Triton's
    interpreter (3.6) rounds the cast's ties away from zero and drops carries into the exponent (7.9 became 4);
    the GPU's cast rounds correctly by itself."""
    y = tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX)
    if GRID_FIRST:
        y = _on_e4m3_grid(y)
    at = (((bh // H).to(tl.int64) * S + rows[:, None]) * H + bh % H) * D + cols[None, :]
    tl.store(OUT + at, y.to(tl.float8e4nv, fp_downcast_rounding="rtne"), mask=inside)


@triton.jit
def _scale_of(amax):
    return tl.where(amax > 0, amax / FP8_MAX, 1.0)


@triton.jit
def _quantize_kernel(Q, K, V, Q8, K8, V8, AMAX, KSUM, DESCALE, sqb, sqh, sqs, sqd, skb, skh, sks, skd, svb, svh, svs,
                     svd, HQ, HKV, SQ, SKV, n_q, n_k, bh_q, bh_kv, D: tl.constexpr, DP: tl.constexpr,
                     BLOCK: tl.constexpr, REVERSE: tl.constexpr, GRID_FIRST: tl.constexpr):
    """The blocks of ``_reduce_kernel`` over their head's scale into e4m3 (K less its mean); each head's first
    block writes the descale factor (for Q, the first query head of each kv head)."""
    pid = tl.program_id(0)
    if REVERSE:
        pid = tl.num_programs(0) - 1 - pid
    which, blk, bh = _where(pid, n_q, n_k, bh_q, bh_kv)
    if which == 0:
        x, rows, cols, inside = _tile(Q, blk, bh, sqb, sqh, sqs, sqd, HQ, SQ, D, DP, BLOCK)
        slot = _kv_slot(bh, HQ, HKV)
        scale = _scale_of(tl.load(AMAX + slot))
        _store_e4m3(Q8, x * (1.0 / scale), rows, cols, inside, bh, HQ, SQ, D, GRID_FIRST)
        if (blk == 0) & _leads_group(bh, HQ, HKV):
            tl.store(DESCALE + slot, scale)
    elif which == 1:
        x, rows, cols, inside = _tile(K, blk, bh, skb, skh, sks, skd, HKV, SKV, D, DP, BLOCK)
        mean = tl.load(KSUM + bh * D + cols, mask=cols < D, other=0).to(tl.float32) * (1.0 / (FIXED_ONE * SKV))
        scale = _scale_of(tl.load(AMAX + bh_kv + bh) + tl.max(tl.abs(mean), axis=0))
        _store_e4m3(K8, (x - mean[None, :]) * (1.0 / scale), rows, cols, inside, bh, HKV, SKV, D, GRID_FIRST)
        if blk == 0:
            tl.store(DESCALE + bh_kv + bh, scale)
    else:
        x, rows, cols, inside = _tile(V, blk, bh, svb, svh, svs, svd, HKV, SKV, D, DP, BLOCK)
        scale = _scale_of(tl.load(AMAX + 2 * bh_kv + bh))
        _store_e4m3(V8, x * (1.0 / scale), rows, cols, inside, bh, HKV, SKV, D, GRID_FIRST)
        if blk == 0:
            tl.store(DESCALE + 2 * bh_kv + bh, scale)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D (B, H, S, D views), got {q.dim()}, {k.dim()}, {v.dim()} dimensions")
    (B, HQ, _, D), (Bk, HKV, SKV, Dk) = q.shape, k.shape
    if v.shape != k.shape or Bk != B or Dk != D:
        raise ValueError(f"shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
                         "(want q [B, Hq, Sq, D], k and v [B, Hkv, Skv, D])")
    if HQ % HKV:
        raise ValueError(f"{HQ} query heads are not a multiple of {HKV} key/value heads")
    if D > 256:
        raise ValueError(f"head dim {D} > 256")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"q, k, v must share one of float16, bfloat16, float32; got {q.dtype}, {k.dtype}, {v.dtype}")


def accumulator_size(q: torch.Tensor, k: torch.Tensor) -> int:
    """int64 elements of the accumulators (K's fixed-point column sums, then the float32 absmax per head of Q, K and
    V) for B, H, S, D ``q`` and ``k``: the statistics a call leaves for ``fp8_heads_carried``'s next call."""
    B, HKV, D = k.shape[0], k.shape[1], k.shape[3]
    return B * HKV * D + (3 * B * HKV + 1) // 2


def split_accumulators(acc: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(K's column sums [B * Hkv * D] int64, the absmax [3 * B * Hkv] float32) as views of ``acc``."""
    B, HKV, D = k.shape[0], k.shape[1], k.shape[3]
    n_sums = B * HKV * D
    return acc[:n_sums], acc[n_sums:].view(torch.float32)[:3 * B * HKV]


@dataclass(frozen=True)
class Programs:
    """How a pass over Q, K and V is cut into programs: ``BLOCK`` rows of one head each (``_where``)."""

    grid: tuple[int]
    shapes: tuple[int, ...]  # HQ, HKV, SQ, SKV, n_q, n_k, B * HQ, B * HKV
    strides: tuple[int, ...]
    dp: int
    block: int


def programs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Programs:
    B, HQ, SQ, D = q.shape
    HKV, SKV = k.shape[1], k.shape[2]
    dp = max(16, triton.next_power_of_2(D))
    block = ELEMENTS_PER_PROGRAM // dp
    n_q, n_k = triton.cdiv(SQ, block) * B * HQ, triton.cdiv(SKV, block) * B * HKV
    return Programs((n_q + 2 * n_k,), (HQ, HKV, SQ, SKV, n_q, n_k, B * HQ, B * HKV),
                    (*q.stride(), *k.stride(), *v.stride()), dp, block)


def _getter(buffers: Buffers | None, device: torch.device) -> Buffers:
    return buffers or (lambda shape, dtype, name: torch.empty(shape, dtype=dtype, device=device))


def copies(q: torch.Tensor, k: torch.Tensor, buffers: Buffers | None) -> tuple[torch.Tensor, ...]:
    """The e4m3 copies of Q, K, V (B, S, H, D) and the descale factors [3, B, Hkv], from ``buffers``."""
    B, HQ, SQ, D = q.shape
    HKV, SKV = k.shape[1], k.shape[2]
    get = _getter(buffers, q.device)
    return (get((B, SQ, HQ, D), torch.float8_e4m3fn, "q"), get((B, SKV, HKV, D), torch.float8_e4m3fn, "k"),
            get((B, SKV, HKV, D), torch.float8_e4m3fn, "v"), get((3, B, HKV), torch.float32, "descale"))


def quantize_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, buffers: Buffers | None = None,
                   reverse: bool = True, accumulators: torch.Tensor | None = None) -> HeadScaledFp8:
    """e4m3 copies of ``q``, ``k``, ``v`` (B, H, S, D views through any strides; no copy of the inputs is made)
    with per-(batch, kv head) descale factors, K smoothed (module docstring). ``buffers(shape, dtype, name)``
    supplies the copies (a form's workspace; fresh tensors by default). ``reverse``: the quantizing launch takes
    its programs in reverse order (module docstring); the copies are the same either way. ``accumulators``
    (``accumulator_size`` int64 elements): where the absmax and K's column sums go, kept by a caller that passes
    them to ``fp8_heads_carried`` at its next call (a buffer from ``buffers`` by default)."""
    _check(q, k, v)
    D = q.shape[3]
    q8, k8, v8, descale = copies(q, k, buffers)
    acc = accumulators
    if acc is None:
        acc = _getter(buffers, q.device)((accumulator_size(q, k),), torch.int64, "accumulators")
    acc.zero_()
    k_sums, amax = split_accumulators(acc, k)
    p = programs(q, k, v)
    _reduce_kernel[p.grid](q, k, v, amax, k_sums, *p.strides, *p.shapes, D=D, DP=p.dp, BLOCK=p.block,
                           num_warps=WARPS)
    _quantize_kernel[p.grid](q, k, v, q8, k8, v8, amax, k_sums, descale, *p.strides, *p.shapes, D=D, DP=p.dp,
                             BLOCK=p.block, REVERSE=reverse, GRID_FIRST=_INTERPRETED, num_warps=WARPS)
    return HeadScaledFp8(q8, k8, v8, descale)
