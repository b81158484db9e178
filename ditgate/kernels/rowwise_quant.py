"""Row-wise 8-bit quantization of a linear layer's input in one launch: e4m3 or int8 values and a scale per row (and,
``quantize_delayed``, the delayed-scaling form's eager quantization in two: the absmax into its site's history, then
the cast at the history's scale).

The linear forms quantize each call's [M, K] activation before their 8-bit matrix product. In eager PyTorch that
is five to seven elementwise kernels (abs, amax, a float32 copy, divide, clamp, cast): about 33 bytes of memory
traffic per element, against the 3 that the work needs (read bf16, write one byte), which at video lengths costs
more than the product gains. Here one program takes a block of rows: a first loop over K finds each row's absolute
maximum, a second reads the rows again (from L2 or L1 at these row blocks) and writes the 8-bit values; the scale
per row goes out beside them. The numerics are those of ``forms.linear.quantize_fp8`` / ``quantize_int8``: scale =
max(amax / largest, 1e-12), values x / scale clamped to the format (e4m3: round to nearest even; int8: round half to
even), so the two paths give the same bits.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from .fp8_heads import _on_e4m3_grid

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # read when Triton reads it: at import
BLOCK_M = 1
BLOCK_K = 2048
MIN_SCALE = 1e-12
_E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)


@triton.jit
def _round_half_even(y):
    r = tl.floor(y + 0.5)
    tie = (r - y) == 0.5
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    return tl.where(tie & odd, r - 1.0, r)


@triton.jit
def _rowwise_kernel(X, Q, S, M, K, sxm, sxk, LARGEST: tl.constexpr, FP8: tl.constexpr, GRID_FIRST: tl.constexpr,
                    BM: tl.constexpr, BK: tl.constexpr):
    """The scale is torch's ``amax / largest`` on the tensors' device: on a GPU torch multiplies by the float32
    reciprocal of a scalar divisor, on a CPU (the interpreter, ``GRID_FIRST``) it divides."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    inside_rows = rows < M
    base = rows.to(tl.int64)[:, None] * sxm
    amax = tl.zeros([BM], dtype=tl.float32)
    for k0 in range(0, K, BK):
        cols = k0 + tl.arange(0, BK)
        inside = inside_rows[:, None] & (cols[None, :] < K)
        x = tl.load(X + base + cols[None, :].to(tl.int64) * sxk, mask=inside, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
    if GRID_FIRST:
        scale = tl.maximum(tl.math.div_rn(amax, LARGEST), 1e-12)  # IEEE division, as torch's on a CPU
    else:
        scale = tl.maximum(amax * (1.0 / LARGEST), 1e-12)
    tl.store(S + rows, scale, mask=inside_rows)
    out = rows.to(tl.int64)[:, None] * K
    for k0 in range(0, K, BK):
        cols = k0 + tl.arange(0, BK)
        inside = inside_rows[:, None] & (cols[None, :] < K)
        x = tl.load(X + base + cols[None, :].to(tl.int64) * sxk, mask=inside, other=0.0).to(tl.float32)
        y = tl.minimum(tl.maximum(tl.math.div_rn(x, scale[:, None]), -LARGEST), LARGEST)  # IEEE division, as torch
        if FP8:
            if GRID_FIRST:
                y = _on_e4m3_grid(y)
            tl.store(Q + out + cols[None, :], y.to(tl.float8e4nv, fp_downcast_rounding="rtne"), mask=inside)
        else:
            tl.store(Q + out + cols[None, :], _round_half_even(y).to(tl.int8), mask=inside)


def _known_zero(m) -> bool:
    """Whether ``m`` is 0, without a guard on a row count known only when the graph runs (an unbacked size): such a
    count is taken as not zero, and a launch over no rows writes nothing."""
    if isinstance(m, int):
        return m == 0
    try:
        from torch.fx.experimental.symbolic_shapes import guard_or_false
    except ImportError:  # an older torch: ask, with its guard
        return bool(m == 0)
    return guard_or_false(m == 0)


def quantize_rows(x: torch.Tensor, fp8: bool, block_m: int = BLOCK_M, block_k: int = BLOCK_K,
                  warps: int = 4, traceable: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [M, K] (any strides, bf16/fp16/fp32) -> (values [M, K] row-major e4m3 or int8, scales [M, 1] float32)
    with ``x ≈ values * scales``. ``traceable``: the launch goes through ``torch.library.wrap_triton``, so that
    inside a ``torch.library.triton_op`` a compiled graph launches the kernel itself (``forms.rowwise_op``). It is
    called by its bare name: torch finds an op's kernels (for its compile caches' keys) by reading the source for
    ``wrap_triton(<kernel>)``."""
    if x.dim() != 2:
        raise ValueError(f"quantize_rows takes [M, K], got {tuple(x.shape)}")
    m, k = x.shape
    values = torch.empty((m, k), dtype=torch.float8_e4m3fn if fp8 else torch.int8, device=x.device)
    scales = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if _known_zero(m):
        return values, scales
    largest = _E4M3_MAX if fp8 else 127.0
    kernel = wrap_triton(_rowwise_kernel) if traceable else _rowwise_kernel
    kernel[(triton.cdiv(m, block_m),)](x, values, scales, m, k, x.stride(0), x.stride(1), LARGEST=largest, FP8=fp8,
                                       GRID_FIRST=INTERPRETED, BM=block_m, BK=block_k, num_warps=warps)
    return values, scales


@triton.jit
def _absmax_into_kernel(X, STATE, M, K, sxm, sxk, BM: tl.constexpr, BK: tl.constexpr):
    """Each program's finite absmax of its rows into STATE[0] (an atomic maximum: the history takes this call's
    absmax), and into STATE[2] a 1 where its rows hold an inf or a NaN."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    inside_rows = rows < M
    base = rows.to(tl.int64)[:, None] * sxm
    amax = tl.zeros([BM], dtype=tl.float32)
    bad = tl.zeros([BM], dtype=tl.float32)
    for k0 in range(0, K, BK):
        cols = k0 + tl.arange(0, BK)
        inside = inside_rows[:, None] & (cols[None, :] < K)
        a = tl.abs(tl.load(X + base + cols[None, :].to(tl.int64) * sxk, mask=inside, other=0.0).to(tl.float32))
        finite = a < float("inf")  # False for an inf and for a NaN
        amax = tl.maximum(amax, tl.max(tl.where(finite, a, 0.0), axis=1))
        bad = tl.maximum(bad, tl.max(tl.where(finite, 0.0, 1.0), axis=1))
    tl.atomic_max(STATE, tl.max(amax, axis=0))
    tl.atomic_max(STATE + 2, tl.max(bad, axis=0))


@triton.jit
def _delayed_cast_kernel(X, Q, STATE, SCALE, M, K, sxm, sxk, MARGIN: tl.constexpr, LARGEST: tl.constexpr,
                         GRID_FIRST: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    """The cast at the history's scale, max(STATE[0] * MARGIN / LARGEST, 1e-12), written to SCALE by program 0,
    which also moves this call's inf-or-NaN flag (STATE[2]) into the count (STATE[1]); no other program reads them."""
    pid = tl.program_id(0)
    scale = tl.maximum(tl.math.div_rn(tl.load(STATE) * MARGIN, LARGEST), 1e-12)
    if pid == 0:
        tl.store(SCALE, scale)
        tl.store(STATE + 1, tl.load(STATE + 1) + tl.load(STATE + 2))
        tl.store(STATE + 2, 0.0)
    rows = pid * BM + tl.arange(0, BM)
    inside_rows = rows < M
    base = rows.to(tl.int64)[:, None] * sxm
    out = rows.to(tl.int64)[:, None] * K
    for k0 in range(0, K, BK):
        cols = k0 + tl.arange(0, BK)
        inside = inside_rows[:, None] & (cols[None, :] < K)
        x = tl.load(X + base + cols[None, :].to(tl.int64) * sxk, mask=inside, other=0.0).to(tl.float32)
        # IEEE division (Triton's "/" is an approximate one on a GPU) and clamps that keep a NaN, as torch's do
        y = tl.math.div_rn(x, scale)
        y = tl.minimum(tl.maximum(y, -LARGEST, propagate_nan=tl.PropagateNan.ALL), LARGEST,
                       propagate_nan=tl.PropagateNan.ALL)
        if GRID_FIRST:
            y = _on_e4m3_grid(y)
        tl.store(Q + out + cols[None, :], y.to(tl.float8e4nv, fp_downcast_rounding="rtne"), mask=inside)


AMAX_BLOCK_M, AMAX_BLOCK_K = 16, 256  # a [16, 256] float32 tile: 32 values per thread at 4 warps


def quantize_delayed(x: torch.Tensor, state: torch.Tensor, margin: float, block_m: int = BLOCK_M,
                     block_k: int = BLOCK_K, warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """An eager call of ``forms.linear_delayed`` in two launches, where torch ops take about a dozen: ``x`` [M, K]'s
    finite absmax into the site's ``state`` [largest seen, calls counted, scratch] (an input holding an inf or a NaN
    counted once), then ``x`` cast to e4m3 at ``margin`` times the largest absmax seen over e4m3's largest value.
    Returns (values [M, K] e4m3, scale [1] float32): the numerics of the form's torch ops."""
    if x.dim() != 2:
        raise ValueError(f"quantize_delayed takes [M, K], got {tuple(x.shape)}")
    if state.shape != (3,) or state.dtype != torch.float32 or state.device != x.device or not state.is_contiguous():
        raise ValueError(f"the state must be 3 contiguous float32 elements on {x.device}, got {tuple(state.shape)} "
                         f"{state.dtype} on {state.device}")
    m, k = x.shape
    values = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(1, dtype=torch.float32, device=x.device)
    if m:
        _absmax_into_kernel[(triton.cdiv(m, AMAX_BLOCK_M),)](x, state, m, k, x.stride(0), x.stride(1),
                                                             BM=AMAX_BLOCK_M, BK=AMAX_BLOCK_K, num_warps=warps)
    _delayed_cast_kernel[(max(triton.cdiv(m, block_m), 1),)](
        x, values, state, scale, m, k, x.stride(0), x.stride(1), MARGIN=float(margin), LARGEST=_E4M3_MAX,
        GRID_FIRST=INTERPRETED, BM=block_m, BK=block_k, num_warps=warps)
    return values, scale
