"""The same attention as ``quant_attention`` (FP8, INT8 or plain Q·Kᵀ; block-sparse lists), scheduled by
hand for Hopper in Gluon, Triton's explicit-layout dialect.

Why a second schedule: Triton's compiler runs the loads, both products and the softmax of a key block in
one instruction stream, so the tensor cores wait while the softmax runs. Here, as in FlashAttention-3,
the work is split across warps (``gl.warp_specialize``): one producer partition issues every load
through the bulk tensor copy engine (TMA) into a ring of shared-memory stages guarded by mbarriers, and
two or three consumer warpgroups, 64 query rows each, run the products and the softmax on the same key
blocks. While one warpgroup is in its softmax another's products keep the tensor cores busy. Three
(192 query rows, ``groups``) at head dim 64, where the softmax outweighs the products most: each key
block's loads then serve 1.5 times the rows, and each scheduler has one more warp to issue from.

Numerics are those of ``quant_attention``: the same quantized copies (``quantize``), the same score
scale folded into one FMA with the row max, INT8 products turned into floats by the magic-number add. One
difference where ``BYTE_PS`` says (the dense 8-bit modes, FP8 block lists): P's FP8 bytes are computed from
the scores by two FMAs instead of cast from exp2s (``_byte_p``: the mantissa linear between powers of two,
about 1e-4 of cosine), and P's row sums are the tensor cores'. The tail block (keys past the end) is masked
only where it is visited, last (the lists ascend).

Layouts: the host tensors are read in place through 2-D descriptors when they are either contiguous
[B, H, S, D] or [B, S, H, D] storage seen as [B, H, S, D] (diffusers' ``view(...).transpose(1, 2)``);
``host_layout`` says which, or None. Rows past a head's end belong to the next head or batch, so the
scores of keys past S_K are masked and query rows past S_Q are never stored.

Only for Hopper (sm_90): ``ready`` says whether a call can run here, and why not.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .quant_attention import LOG2E, QK_MODES, KernelConfig, Quantized, checked_prepared, quantize

HALF = gl.constexpr(64)
# key rows per stage. 256 (dense quantized calls, two warpgroups; commit 4dcb3b0) lost on the H200 in one run
# (benchmarks/results/2026-12-03-h200-s9, call a): FP8 at LTX 10.82-10.89 ms against 9.94-10.02 with 128 (three
# warpgroups), INT8 11.95 against 11.04; at Wan-14B only the serial schedule fits 256 keys in registers (the
# overlapped ones spill and serialize their products), FP8 27.02-28.50 against 27.60-27.70
BLOCK_K = gl.constexpr(128)
ROWS_Q, ROWS_K = 128, BLOCK_K.value  # query rows of a block list's block (two warpgroups), key rows per stage
ROWS_HALF = HALF.value  # query rows per consumer warpgroup, and per Q scale of the quantized modes
GROUPS = (2, 3)  # consumer warpgroups per program: 128 or 192 query rows (registers per consumer thread: 240
# or 160, what fits beside the 24-register load warpgroup in a multiprocessor's 64K; at 160 only head dim 64
# compiles without spills, hopper_compile)
SCHEDULES = (0, 1, 2, 3, 4)  # see _consume
# fastest per mode on the H200 (benchmarks/results/2026-12-03-h200-s5, A/B run, one session): the overlap with
# the output rescaled before the P·V issue (3). Plain 33.6 ms at Wan-14B (1: 33.9, 2: 34.7, 4: 34.6) and 13.7
# at LTX (13.8-13.9); FP8 27.2 at Wan (1: 26.9, 2: 28.1) and 11.9 at LTX (1: 13.4, 2: 12.9, 4: 12.8); INT8
# (an earlier run of the same code) 28.4 at Wan and 13.7 at LTX, its fastest there too
DEFAULT_SCHEDULE = {"plain": 3, "fp8": 3, "int8": 3}
# consumer warpgroups per program by head dim (benchmarks/results/2026-12-03-h200-s6, e and g; at LTX's 32 x
# 27588 x 64, three against two, two runs): plain 12.38-12.44 ms against 13.87-13.92, FP8 10.40-10.81 against
# 11.76-12.05, INT8 11.36-11.70 against 13.72-13.76. At head dim 128 three spill and lose (h: FP8 27.37 against
# 26.76 ms at Wan-14B, plain 75.1 against 33.2)
DEFAULT_GROUPS = {64: 3, 128: 2}
# One program per tile (query block, batch · head). Persistent programs (one per multiprocessor taking the tiles in
# turn, the next tile's first keys and values loading while the last finishes; commit b973516, removed after it)
# gave the same bits and lost in one run (benchmarks/results/2026-12-03-h200-s10, call c, two rounds): LTX FP8
# 9.76-9.77 ms against 9.55-9.61, INT8 11.25-11.28 against 10.62-10.63, plain 12.38-12.94 against 12.00; Wan-14B
# FP8 27.38-27.86 against 27.46-27.48; LTX lists of 16 blocks 1.255 against 1.267 (FP8), 65 blocks 3.599
# against 3.559. Its restructuring alone (one tile function called once) had cost INT8 at LTX 10.62-10.63
# against 10.33-10.35 and FP8 lists of 216 blocks 10.57 against 10.07 in that run, so none of it was kept
# (mode, head dim, query rows per block of the block lists or None for dense calls) where this schedule
# measured faster than the Triton one in the same runs, so ditgate's forms run it there. Dense: plain 34.7 / 13.9
# ms against 44.4 / 14.5 (Wan-14B / LTX); FP8 27.3 against 27.5 and 27.6 against 27.7 at Wan in two runs; INT8
# 28.4 against 29.9 at Wan. At LTX (head dim 64) with three warpgroups (s6, g): FP8 10.81 against 11.96, INT8
# 11.70 against 12.62 (with two they tied or lost). Lists of 128 query rows from the selector at budget 0.3:
# plain 11.4 / 4.6 ms against 14.0 / 4.8; FP8 lost at LTX (4.7 against 4.4) and at Wan at budget 0.15 (6.5
# against 5.5), so it keeps those on Triton. Lists of 192 rows (three warpgroups, head dim 64; LTX, s7): plain
# 4.08 ms at budget 0.3 against 4.49 with 128-row lists and 4.61 on Triton; FP8 4.11 against Triton's 4.41
# (0.5: 5.83 against 6.96; 0.15: 2.61 against 2.61). INT8 with lists stays on Triton (not measured here). FP8 over
# 128-row lists at head dim 128 with P's bytes from FMAs (``byte_p``), Wan-14B, the selector's lists, selection
# included (benchmarks/results/2026-12-03-h200-s11, calls e and f): budget 0.5 / 0.3 / 0.15 12.85 / 8.45 / 5.38 ms
# against Triton's 15.16 / 9.52 / 5.45, and 12.63 / 8.56 / 5.36 against 15.17 / 9.69 / 5.61.
# (mode, head dim, list rows or None) where the exp2s pinned above the P·V wait (``_overlapped_step``'s PIN)
# measured faster than left where ptxas puts them, both from the same kernel in one run
# (benchmarks/results/2026-12-03-h200-s8, call a, benchmarks/experiments/pin_ab.py): plain over 192-row lists at
# LTX, random lists of 16 / 65 / 108 / 216 key blocks: 1.098 / 3.726 / 6.277 / 12.425 ms pinned against 1.115 /
# 3.929 / 6.484 / 12.788. Everywhere else it lost or tied: dense FP8 10.19-10.23 against 9.99-10.00 at LTX and
# 27.67-28.03 against 27.35-27.49 at Wan-14B; INT8 11.57 against 11.02 at LTX; FP8 lists 3.61 against 3.49
# (65 blocks); dense plain 12.06-12.48 against 12.41-12.43 at LTX, 35.5-35.6 against 34.9-37.1 at Wan. The
# overlap inside a warpgroup that it makes possible gains nothing where the exp2 units are already the limit.
PINNED = frozenset({("plain", 64, 192)})
# (mode, head dim, list rows or None) where P's row sums from the tensor cores (``_consume``'s TC_SUM: 51 fewer
# instructions per step in the SASS of FP8 at head dim 64, 430 to 379) measured faster than the softmax's adds, both
# from the same kernel in one run (benchmarks/results/2026-12-03-h200-s9, call d, pin_ab.py, two rounds): dense at
# LTX (head dim 64, three warpgroups) FP8 9.29-9.41 ms against 9.90-9.99, INT8 10.56-10.57 against 11.00-11.02,
# cosines unchanged (0.99845, 0.99925). Elsewhere it tied or was mixed: plain at LTX 12.16-12.59 against 12.34-12.42;
# at Wan-14B (head dim 128) FP8 26.82-27.49 against 27.33-27.38, INT8 27.88-28.47 against 27.97-28.07, plain
# 35.90-35.97 against 34.58-35.87; lists of 65 blocks (192 rows) 3.47 against 3.49 (FP8), 3.75 against 3.75 (plain).
# FP8 lists in call h: 16 / 65 / 108 / 216 blocks 1.260 / 3.491 / 5.385 / 10.192 against 1.267 / 3.491 / 5.358 /
# 10.085 (dense in that run 9.22 against 9.94), though their SASS step is as short as dense's (379 instructions)
TC_SUMMED = frozenset({("fp8", 64, None), ("int8", 64, None)})
# (mode, head dim, list rows or None) where each row's max as a tree of pairwise maxima (``_row_max``) measured
# faster than the compiler's chain of dependent maxima, both from the same kernel in one run (bit-identical outputs;
# benchmarks/results/2026-12-03-h200-s10, call b, pin_ab.py, two rounds): plain at LTX 11.89-11.90 ms against
# 12.28-12.37. Everywhere else it lost or tied: FP8 at LTX 9.75-9.82 against 9.30-9.33, INT8 10.52 against
# 10.36-10.38; at Wan-14B FP8 27.82-28.10 against 27.25-27.47, INT8 28.14-28.55 against 28.00, plain 34.36-34.48
# against 34.46-34.53; LTX lists of 16 / 65 blocks FP8 1.293 / 3.552 against 1.264 / 3.509, plain 1.088 / 3.682
# against 1.082 / 3.686. Why a shorter chain before the first exp2 slows the 8-bit modes is not measured
TREE_MAXED = frozenset({("plain", 64, None)})
# (mode, head dim, list rows or None) where FP8 P's bytes come from two FMAs instead of an exp2 (``_byte_p``), faster
# than the exp2 everywhere it was measured, in one run (benchmarks/results/2026-12-03-h200-s11, call a, pin_ab.py, two
# rounds, ms exp2 -> bytes): LTX FP8 9.30-9.34 -> 8.60-8.64 (cosine 0.99856 -> 0.99840), INT8 10.35-10.36 -> 9.08-9.09
# (0.99924 -> 0.99907); Wan-14B FP8 27.31-27.38 -> 23.32-24.29, INT8 28.03-28.07 -> 24.16-24.48 (0.99922 -> 0.99906);
# FP8 lists of 27 / 54 / 108 of 216 blocks at LTX 1.797 / 2.997 / 5.371 -> 1.523 / 2.503 / 4.537; FP8 over 128-row
# lists at Wan-14B (budget 0.3, selection included): 10.50 ms in call d, 8.45-8.56 in calls e and f
BYTE_PS = frozenset({("fp8", 64, None), ("fp8", 128, None), ("int8", 64, None), ("int8", 128, None), ("fp8", 64, 192),
                     ("fp8", 128, 128)})
# (mode, head dim, list rows or None) where the output is rescaled only when a row's max rose past LAZY_TAU
# (``_rows_rescaled``, with P's bytes), against every block, both from the same kernel in one run
# (benchmarks/results/2026-12-04-h200-s14, calls a, b and e, pin_ab.py, two rounds each): dense FP8 at LTX
# 8.275-8.408 ms against 8.462-8.582, faster in all six pairs by 1.1-2.2 %, the cosine unchanged (0.99830-0.99832).
# Everywhere else it lost (call a): INT8 at LTX 9.025-9.027 against 8.985-9.006; FP8 lists
# at LTX of 27 / 65 blocks 1.439 / 2.848 against 1.432 / 2.826; at Wan-14B FP8 23.12-25.51 against 22.80-22.94,
# INT8 24.63-25.65 against 23.76-23.95. The vote, the branch and each row's compare and select cost more than
# the 32 (64) multiplies they skip wherever the rows' maxima still move often (short lists) or the step is
# longer (INT8's integer adds, head dim 128's two votes)
# In plain mode (P in bf16, 8 octaves of headroom: ``LAZY_TAU_PLAIN``), with the output gathered (``GATHERED``), in
# the same kind of run (s17, call a): LTX lists of 27 / 65 / 108 blocks 1.624 / 3.696 / 6.081 -> 1.600 / 3.671 / 5.948
# ms, dense 11.876 -> 11.757; the outputs' cosine to the eager rescale's 0.999995. Not its bits: where a row's P is
# taken from an older max, its largest value is rounded to bf16 too (under the eager rescale it is exactly 1); on keys
# grown six-fold, a softmax that sharp, that took the error to exact attention from 0.0017 to 0.0020 (GPU test)
LAZY_RESCALED = frozenset({("fp8", 64, None), ("plain", 64, 192)})
# (mode, head dim, list rows or None) where INT8's row max is taken over the integer products (``_softmax_step``'s
# INT_MAX) rather than over their floats, the same bits: ptxas makes it three-input integer maxima (VIMNMX3), about
# half the instructions of the float chain, and the step's SASS shrinks from 428 to 400 instructions at head dim 64
# (three warpgroups) and from 474 to 441 at 128 (``python -m ditgate.kernels.hopper_compile --int-max``). On the H200
# in one run (benchmarks/results/2026-12-04-h200-s16, call a, pin_ab.py, three rounds, ms float max -> integer max):
# INT8 at LTX 9.02-9.24 -> 8.47-8.64, at Wan-14B 24.08-24.38 -> 23.17-24.30, the same bits. Dense only: INT8 lists
# stay on Triton (``FASTER_THAN_TRITON``), where the option was not timed
INT_MAXED = frozenset({("int8", 64, None), ("int8", 128, None)})
# (mode, head dim, list rows or None) where plain mode's output channels are gathered per thread for 16-byte stores
# (``plan_launch``'s gather_out: a layout conversion through shared memory in the epilogue, 6 KB more of it at head dim
# 64; at 128 it does not fit beside three stages), against the accumulator's four-byte stores, both from the same
# kernel in one run (benchmarks/results/2026-12-04-h200-s17, call a, fixed_costs.py --mode plain, three turned rounds,
# medians, the same bits): LTX lists of 27 / 65 / 108 key blocks (192 rows) 1.682 / 3.780 / 6.243 -> 1.624 / 3.696 /
# 6.081 ms, the fixed cost per program 4.19 -> 3.75 us per SM; dense 11.913 -> 11.876
GATHERED = frozenset({("plain", 64, None), ("plain", 64, 192)})
FASTER_THAN_TRITON = frozenset({("plain", 64, None), ("plain", 128, None), ("plain", 64, 128), ("plain", 128, 128),
                                ("plain", 64, 192), ("fp8", 64, None), ("fp8", 128, None), ("fp8", 64, 192),
                                ("fp8", 128, 128), ("int8", 64, None), ("int8", 128, None)})


@gluon.constexpr_function
def _q_slots(groups):
    """Q's 64-row slots in shared memory: one per consumer warpgroup, rounded up to a power of two (shapes
    must be). Plain Python as well: ``default_stages`` calls it on the host."""
    return 1 << (groups - 1).bit_length()


@gluon.constexpr_function
def _mma_layout(bits, n):
    """Hopper's warpgroup accumulator layout for a 64 x n tile (four warps, 16 rows each)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 256 // bits])


@gluon.jit
def _produce(loads, STAGES: gl.constexpr, SPARSE: gl.constexpr, V_T: gl.constexpr, GROUPS: gl.constexpr,
             TC_SUM: gl.constexpr):
    """The load partition: Q once (64 rows per consumer warpgroup) and, where the row sums are the tensor
    cores' (``TC_SUM``), the tile of ones they multiply P by; then each listed key block's K and V into
    the next free stage. A list's next index is loaded before the wait for a free stage, not after it,
    so that its latency does not delay the copy into that stage. Q's copies are issued before the list's
    count is read (``_list_start``)."""
    (q_desc, k_desc, v_desc, ones_desc, q_smem, k_bufs, v_bufs, ones_smem, q_ready, kv_ready, kv_empty, row, counts,
     n_n, max_list, q_row, q_col, k_row, k_col, v_row, v_col) = loads
    if TC_SUM:
        mbarrier.expect(q_ready, q_desc.block_type.nbytes * GROUPS + ones_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(ones_desc, [0, 0], q_ready, ones_smem)
    else:
        mbarrier.expect(q_ready, q_desc.block_type.nbytes * GROUPS)
    for g in gl.static_range(GROUPS):
        tma.async_copy_global_to_shared(q_desc, [q_row + g * HALF, q_col], q_ready, q_smem.index(g))
    nbytes: gl.constexpr = k_desc.block_type.nbytes + v_desc.block_type.nbytes
    count, j_next, _ = _list_start(counts, row, n_n, max_list, SPARSE)
    for i in range(count):
        if SPARSE:  # this block's index came a block ago; the next one's load runs while this stage frees
            j = j_next
            j_next = gl.load(row + gl.minimum(i + 1, count - 1))
        else:
            j = i
        st = i % STAGES
        mbarrier.wait(kv_empty.index(st), ((i // STAGES) & 1) ^ 1)  # a fresh barrier passes phase 1
        bar = kv_ready.index(st)
        mbarrier.expect(bar, nbytes)
        tma.async_copy_global_to_shared(k_desc, [k_row + j * BLOCK_K, k_col], bar, k_bufs.index(st))
        if V_T:
            tma.async_copy_global_to_shared(v_desc, [v_row, v_col + j * BLOCK_K], bar, v_bufs.index(st))
        else:
            tma.async_copy_global_to_shared(v_desc, [v_row + j * BLOCK_K, v_col], bar, v_bufs.index(st))


@gluon.jit
def _softmax_step(s, j, m_i, l_i, c, n_n, S_K, MASK: gl.constexpr, QUANT: gl.constexpr, INT_QK: gl.constexpr,
                  SUM: gl.constexpr, TREE_MAX: gl.constexpr, BYTE_P: gl.constexpr = False, LAZY: gl.constexpr = False,
                  INT_MAX: gl.constexpr = False):
    """One block's scores into P (fp32, unnormalized) and the running max and sum (m_i in log2 units).

    ``c``: the score scale (quantized, the product of the blocks' scales, > 0, so max(raw · c) = max(raw) · c).
    Quantized, exp2 is shifted by log2 of P's FP8 scale so that P lands in [0, 448] (l_i carries the same
    factor). INT8 products become float by the magic-number add. ``MASK``: this may be the tail block (keys past
    S_K), masked where ``j`` is the last key block. Only ever the last visited block (the lists ascend), so the
    loop body stays free of the mask (ptxas turns the branch into selects on every element). ``TREE_MAX``: the
    row max as a tree (``_row_max``). ``BYTE_P``: P comes back as floats whose lowest byte is P's FP8 byte
    (``_byte_p``), with no exp2 but alpha's. ``LAZY`` (with ``BYTE_P``, or in plain mode): a row keeps its
    reference max until the block's max passes it by ``LAZY_TAU`` (``LAZY_TAU_PLAIN`` unquantized), so alpha is
    exactly 1 on most rows and most blocks (``_rows_rescaled`` then skips the output's rescale); exact in real
    arithmetic, as any reference is, since P and its row sums share it. ``INT_MAX`` (INT8): the row max over the integer products, three-input integer maxima where the
    floats take a chain of two-input ones (``INT_MAXED``); not in the block that may be masked, where holding the
    products and their floats at once spilled. Otherwise every exp2 is MUFU's: one in 8 (or 4) by a polynomial on
    the FMA units, as FlashAttention-4 does on Blackwell, was slower in every mode on the H200 (at 02611ce;
    benchmarks/results/2026-12-03-h200-s8, call e: plain 12.56-13.05 against 12.24-12.30 ms at LTX, FP8
    10.15-10.24 against 9.86-9.95, INT8 12.45-12.55 against 11.07-11.09)."""
    if QUANT:
        LOG2_P_SCALE: gl.constexpr = 8.807354922057604  # log2(448): P in [0, 448] for the FP8 cast
        TAU: gl.constexpr = LAZY_TAU
    else:
        LOG2_P_SCALE: gl.constexpr = 0.0
        TAU: gl.constexpr = LAZY_TAU_PLAIN
    if INT_QK:
        raw = (s + 0x4B400000).to(gl.float32, bitcast=True)  # 12582912 + product, exactly
        offset: gl.constexpr = 12582912.0
    else:
        raw = s
        offset: gl.constexpr = 0.0
    if MASK:
        if j == n_n - 1:
            cols = j * BLOCK_K + gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, s.type.layout))
            raw = gl.where((cols < S_K)[None, :], raw, float("-inf"))
    if INT_QK and INT_MAX and not MASK:  # the products' own max, exact in fp32 (|s| < 2^22) as raw's minus the offset
        m_new = gl.maximum(m_i, _row_max(s, TREE_MAX).to(gl.float32) * c)
    else:
        m_new = gl.maximum(m_i, (_row_max(raw, TREE_MAX) - offset) * c)
    if LAZY:  # keep the row's reference unless its max rose past LAZY_TAU (``_rows_rescaled``)
        moved = m_new > m_i + TAU
        alpha = gl.where(moved, gl.exp2(m_i - m_new), 1.0)
        m_new = gl.where(moved, m_new, m_i)
    else:
        alpha = gl.exp2(m_i - m_new)
    if BYTE_P:
        p = _byte_p(raw, c, m_new, offset)
    else:
        p = gl.exp2(raw * c - (m_new + offset * c - LOG2_P_SCALE)[:, None])
    if SUM:  # otherwise the tensor cores sum P (``TC_SUM``) and l_i stays as it came
        l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, m_new, l_i, alpha


BYTE_TOP = gl.constexpr(120.0)  # P's FP8 byte at the row max (``_byte_p``): 0x78, 256
# how far (log2 units) a row's max may rise above the reference its P is taken from before the output is
# rescaled (``LAZY``): P's byte then reaches at most 120 + 8 · 0.75 = 126, e4m3's largest finite (448)
LAZY_TAU = gl.constexpr(0.75)
# the same in plain mode, where P is bf16 or fp16 and its row sums fp32: P reaches at most 2^8, as in
# FlashAttention-4's rescaling threshold, far inside either type's range
LAZY_TAU_PLAIN = gl.constexpr(8.0)


@gluon.jit
def _byte_p(raw, c, m_new, offset: gl.constexpr):
    """FP8 P without exp2: each score's e4m3 byte computed as an integer, X = round(8 · (x + 15)) for
    x = (raw - offset) · c - m_new (log2 units, <= 0), clamped to [0, 128] by the FMA's saturation (scores
    15 octaves below the row max become 0), and left as the lowest byte of a float by a second FMA that adds
    1.5 · 2^23. An e4m3 byte read as a number, 8 · exponent + mantissa, is 8 · (log2 of its value + 7) with
    the mantissa taken linearly between powers of two (Schraudolph's exponent trick, at e4m3's three
    mantissa bits): P = 2^(x + 8) up to a factor between 1 and 1.06 that depends on the fraction of x, and
    the rounding to three bits the exp2's cast would make anyway (``benchmarks/fp8_error_budget.py``, float64,
    at LTX's shape: 1 - cosine 1.65e-3 against 1.49e-3 in FP8 mode, 0.92e-3 against 0.77e-3 in INT8 mode; on
    the H200 0.99840 against 0.99856 and 0.99907 against 0.99924). Why: the exp2 unit, 16 per clock per
    multiprocessor, is the quantized softmax's narrowest part (46 % of FP8's stall samples at LTX's shape,
    benchmarks/results/2026-12-03-h200-s10); FMAs run at 128. The row sums must be the
    tensor cores' (``TC_SUM``), of the bytes the product uses. Each row's shift is taken from m_new, as the
    exp2's is, so alpha stays exp2(m_i - m_new). INT8's magic-number offset is folded into it: the shift is then
    about offset · a, and its fp32 rounding moves every score of the row and block alike by at most 0.75 of a
    unit of the integer product (under 1e-3 of X at the issue's shapes), where INT8's own rounding of Q and K
    moves each score by hundreds of such units."""
    a = c * 0.0625  # X / 128 per unit of raw
    shift = (BYTE_TOP - 8.0 * m_new) * 0.0078125 - offset * a
    return gl.inline_asm_elementwise(
        "{ .reg .f32 t; fma.rn.sat.f32 t, $1, $2, $3; fma.rn.f32 $0, t, 0f43000000, 0f4B400000; }", "=r,r,r,r",
        [raw, gl.full(raw.shape, a, gl.float32, raw.type.layout), gl.broadcast(shift[:, None], raw)[0]],
        dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _max_of_halves(x):
    """The elementwise max of x's two column halves (split at the highest column bit)."""
    M: gl.constexpr = x.shape[0]
    N: gl.constexpr = x.shape[1]
    a, b = gl.permute(gl.reshape(x, [M, 2, N // 2]), (0, 2, 1)).split()
    return gl.maximum(a, b)


@gluon.jit
def _row_max(x, TREE: gl.constexpr):
    """Each row's max. ``TREE``: pairwise, halving the columns four times at the highest column bit (a
    register bit of the accumulator layout, so nothing moves between threads) and once more at the lowest,
    then across the four threads of a row; otherwise ``gl.max``, which the compiler makes one chain of 31
    dependent maxima per row and thread."""
    layout: gl.constexpr = x.type.layout
    if TREE:
        x = _max_of_halves(_max_of_halves(_max_of_halves(_max_of_halves(x))))
        a, b = gl.reshape(x, [x.shape[0], x.shape[1] // 2, 2]).split()
        x = gl.maximum(a, b)
    return gl.convert_layout(gl.max(x, axis=1), gl.SliceLayout(1, layout))


@gluon.jit
def _ahead(row, KS, ks_base, i, count, j_next, SPARSE: gl.constexpr, QUANT: gl.constexpr):
    """What step i fetches for the steps after it, so that no step waits on memory: block i+1's K scale
    (its index was fetched by step i-1) and block i+2's index (clamped to the list). Read at its use,
    the K scale was a load from memory in the middle of every quantized step; fetched ahead, FP8 at
    LTX's shape went from 14.0-14.6 to 12.0 ms on the H200 (no change at Wan-14B's)."""
    if QUANT:
        ks_next = gl.load(KS + ks_base + j_next)
    else:
        ks_next = 1.0
    after = gl.maximum(gl.minimum(i + 2, count - 1), 0)
    if SPARSE:
        j_after = gl.load(row + after)
    else:
        j_after = after
    return ks_next, j_after


@gluon.constexpr_function
def _packed_bytes_ptx(first):
    """The opening of an asm that packs the lowest bytes of operands $first to $first + 3 (``_byte_p``'s
    floats) into $0, in that order: two byte permutes pair them, a third joins the pairs. The caller closes it."""
    a, b, c, d = (f"${first + i}" for i in range(4))
    return (f"{{ .reg .b32 lo, hi; prmt.b32 lo, {a}, {b}, 0x0040; prmt.b32 hi, {c}, {d}, 0x0040; "
            "prmt.b32 $0, lo, hi, 0x5410;")


@gluon.jit
def _as_operand(p, pv_dtype: gl.constexpr, o_layout: gl.constexpr, BYTE_P: gl.constexpr = False):
    """P cast for the P·V product and laid out as its register operand.

    16-bit: the accumulator layout already is the operand's, one pack per pair. FP8: the operand wants
    four neighbouring keys per register where the accumulator gives each thread pairs 8 keys apart, a
    move between threads (shuffles). Instead P's keys are reordered inside each group of 32 (keys
    16h + 8a + 2t + b to place 16h + 4t + 2a + b) so that every thread already holds its operand's
    values, and V is stored in the same order (``quantize(permute_v=True)``): the
    product is unchanged. Four values go into one register by two paired conversions in one asm (the
    compiler's own cast keeps one register per byte and repacks them: byte moves in the SASS)."""
    if BYTE_P:  # the low bytes of four floats (``_byte_p``) into one register
        return gl.inline_asm_elementwise(_packed_bytes_ptx(1) + " }", "=r,r,r,r,r", [_reordered(p, o_layout)],
                                         dtype=gl.float8e4nv, is_pure=True, pack=4)
    if pv_dtype.primitive_bitwidth == 8:
        p = _reordered(p, o_layout)
        if p.dtype == gl.float16:  # P carried at 16 bits (``_carried``, NARROW 1)
            return gl.inline_asm_elementwise(
                "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f16x2 lo, $1; cvt.rn.satfinite.e4m3x2.f16x2 hi, $2;"
                " mov.b32 $0, {lo, hi}; }", "=r,r,r", [p], dtype=gl.float8e4nv, is_pure=True, pack=4)
        return gl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;"
            " mov.b32 $0, {lo, hi}; }", "=r,r,r,r,r", [p], dtype=gl.float8e4nv, is_pure=True, pack=4)
    pc = p.to(pv_dtype)
    return gl.convert_layout(pc, gl.DotOperandLayout(0, o_layout, 32 // pv_dtype.primitive_bitwidth))


@gluon.jit
def _hold(x):
    """An empty asm that reads ``x``: its registers stay x's until here. An in-flight product reads its
    register operand (P) asynchronously; once P is dead to the compiler, ptxas may hand its registers to
    the next softmax and must then wait for the product first, which undoes the overlap (it did)."""
    return gl.inline_asm_elementwise("", "=r,0", [x], dtype=x.dtype, is_pure=False,
                                     pack=32 // x.dtype.primitive_bitwidth)


@gluon.jit
def _v_operand(v_bufs, st, V_T: gl.constexpr):
    if V_T:
        return v_bufs.index(st).permute((1, 0))
    else:
        return v_bufs.index(st)


@gluon.jit
def _list_start(counts, row, n_n, max_list, SPARSE: gl.constexpr):
    """A program's list: its count, first index and second index (the first again where the count is
    under two), as each partition reads them for itself. The three loads are independent, so their
    latencies overlap. Read once before the partitions split and handed over through shared memory, the
    count had delayed Q's and the first K's copies by a load and a barrier in every listed program.
    Every list has a first slot, used or not; a second only if ``max_list`` > 1. Dense: ``n_n`` blocks."""
    if SPARSE:
        count = gl.load(counts)
        first = gl.load(row)
        second = gl.load(row + 1, mask=max_list > 1, other=0)
        return count, first, gl.where(count > 1, second, first)
    else:
        return n_n, 0, gl.maximum(gl.minimum(1, n_n - 1), 0)


@gluon.jit
def _reordered(p, o_layout: gl.constexpr):
    """P's keys reordered into the FP8 operand's order and laid out as that operand (see ``_as_operand``:
    registers renamed, nothing moves)."""
    M: gl.constexpr = p.shape[0]
    N: gl.constexpr = p.shape[1]
    p = gl.reshape(p, [M, N // 32, 2, 2, 4, 2])
    p = gl.reshape(gl.permute(p, (0, 1, 2, 4, 3, 5)), [M, N])
    return gl.convert_layout(p, gl.DotOperandLayout(0, o_layout, 4))


def default_narrowing(groups: int, qk: str, byte_p: bool = False) -> int:
    """How an 8-bit P crosses the loop (``_carried``) unless the call says: 0 as fp32 (two warpgroups, 240
    registers each), 2 (packed FP8 bytes) at three (160 registers, where fp32 P spilled). On the H200 at
    LTX's 32 x 27588 x 64, two rounds: FP8 packed 9.94-9.99 ms against 10.13-10.17 as float16 (1)
    (benchmarks/results/2026-12-03-h200-s7, call f); INT8, with the row sums on the tensor cores, 10.33-10.34
    against 10.54-10.56, cosine 0.99924 both (results 2026-12-03-h200-s10, call a; without them, in s7, it had
    lost, 12.05-12.13 against 11.03-11.05). At head dim 128 packing lengthens the step (FP8: 477 SASS
    instructions against 462, 426 against 413 with the row sums on the tensor cores), so two warpgroups keep 0.
    P's bytes made without exp2 (``byte_p``) are packed already: 2 (fp32 floats carried spill, 1192 bytes at head
    dim 128)."""
    if byte_p:
        return 2
    if groups != 3 or qk == "plain":
        return 0
    return 2


@gluon.jit
def _carried(p, pv_dtype: gl.constexpr, o_layout: gl.constexpr, NARROW: gl.constexpr, BYTE_P: gl.constexpr = False):
    """What crosses the loop for the next step's P·V: at 16 bits the operand itself (half the registers
    of fp32 P), at 8 bits fp32 P, made the operand at the next step (an 8-bit operand crossed the loop
    one value per byte and was unpacked and repacked every block: about 200 byte moves, PRMT and LOP3,
    per step in the SASS). ``NARROW`` (``default_narrowing``) 1: P as float16, cast to FP8 by pairs at the next
    step. 2: the FP8 operand's bytes already converted, four to a register, carried as the first of each
    pair of float16 registers that an asm over four values gives back (the second holds nothing and is
    dead); the next step only renames them (``_operand``): one conversion per pair of values where 1
    takes two (430 instructions per step against 462 in the SASS of FP8 at head dim 64)."""
    if BYTE_P and NARROW == 2:  # the bytes of ``_byte_p``'s floats, packed as 2 packs converted ones
        x = gl.inline_asm_elementwise(_packed_bytes_ptx(2) + " mov.b32 $1, 0; }", "=r,=r,r,r,r,r",
                                      [_reordered(p, o_layout)], dtype=gl.float16, is_pure=True, pack=4)
    elif pv_dtype.primitive_bitwidth == 8 and NARROW == 2:
        x = gl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $3, $2; cvt.rn.satfinite.e4m3x2.f32 hi, $5, $4;"
            " mov.b32 $0, {lo, hi}; mov.b32 $1, 0; }", "=r,=r,r,r,r,r", [_reordered(p, o_layout)],
            dtype=gl.float16, is_pure=True, pack=4)
    elif pv_dtype.primitive_bitwidth == 8 and NARROW == 1:
        x = p.to(gl.float16)
    elif pv_dtype.primitive_bitwidth == 8:
        x = p
    else:
        x = _as_operand(p, pv_dtype, o_layout, BYTE_P)
    return x


@gluon.jit
def _operand(carried, pv_dtype: gl.constexpr, o_layout: gl.constexpr, NARROW: gl.constexpr,
             BYTE_P: gl.constexpr = False):
    if pv_dtype.primitive_bitwidth == 8 and NARROW == 2:  # the bytes packed by ``_carried``
        x = gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r,r", [carried], dtype=gl.float8e4nv, is_pure=True,
                                      pack=4)
    elif pv_dtype.primitive_bitwidth == 8:
        x = _as_operand(carried, pv_dtype, o_layout, BYTE_P)
    else:
        x = carried
    return x


@gluon.jit
def _rescaled(x, alpha):
    """x's rows (the output or the row sums) times alpha, one per row, brought into x's layout."""
    return x * gl.convert_layout(alpha, gl.SliceLayout(1, x.type.layout))[:, None]


@gluon.constexpr_function
def _rows_rescaled_ptx(n):
    """The asm of ``_rows_rescaled`` over ``n`` values: $0.. the values (tied to their inputs), $2n.. their rows'
    factors, of which values 0 and 2 hold the thread's two rows."""
    muls = " ".join(f"mul.f32 ${i}, ${i + n}, ${i + 2 * n};" for i in range(n))
    return (f"{{ .reg .pred moved, any; setp.ne.f32 moved, ${2 * n}, 0f3F800000; "
            f"setp.ne.or.f32 moved, ${2 * n + 2}, 0f3F800000, moved; vote.sync.any.pred any, moved, 0xffffffff; "
            f"@!any bra.uni KEPT; {muls} KEPT: }}")


@gluon.constexpr_function
def _rows_rescaled_constraints(n):
    """``n`` outputs, each tied to its value's input, then ``n`` factors."""
    return ",".join(["=r"] * n + [str(i) for i in range(n)] + ["r"] * n)


@gluon.jit
def _rows_rescaled(x, alpha):
    """``_rescaled`` for an accumulator of Hopper's warpgroup layout, skipped by every warp none of whose rows
    has a factor other than 1 (``LAZY``: most blocks once a row's max has settled). A warp's 16 rows are two per
    thread, values 0 and 2 of each group of 32 in that layout's register order (a row's pairs of columns, then
    the row 8 below's); the multiplies run for the whole warp or not at all, behind one vote and branch."""
    n: gl.constexpr = 32
    a = gl.broadcast(gl.convert_layout(alpha, gl.SliceLayout(1, x.type.layout))[:, None], x)[0]
    return gl.inline_asm_elementwise(_rows_rescaled_ptx(n), _rows_rescaled_constraints(n), [x, a],
                                     dtype=gl.float32, is_pure=True, pack=n)


@gluon.jit
def _scaled_output(acc, alpha, LAZY: gl.constexpr):
    if LAZY:
        return _rows_rescaled(acc, alpha)
    return _rescaled(acc, alpha)


@gluon.jit
def _sum_product(pv, ones_smem, lacc):
    """P·1 for P's row sums (``TC_SUM``), issued: a fresh 64 x 8 accumulator, every column the block's sum."""
    return warpgroup_mma(pv, ones_smem.permute((1, 0)), gl.zeros_like(lacc), use_acc=False, is_async=True)


@gluon.jit
def _serial_step(q_part, k_bufs, v_bufs, kv_ready, kv_empty, row, i, count, j, ksc, j_next, acc, m_i, l_i, c_q, KS,
                 ks_base, n_n, S_K, s_zero, o_layout: gl.constexpr, STAGES: gl.constexpr, SPARSE: gl.constexpr,
                 MASK: gl.constexpr, QUANT: gl.constexpr, INT_QK: gl.constexpr, V_T: gl.constexpr, lacc, ones_smem,
                 TC_SUM: gl.constexpr, TREE_MAX: gl.constexpr, BYTE_P: gl.constexpr, LAZY: gl.constexpr,
                 INT_MAX: gl.constexpr):
    """Schedule 0's block i (index j, K scale ksc): Q·Kᵀ, softmax, P·V (and P·1, ``TC_SUM``), each waited for."""
    ks_next, j_after = _ahead(row, KS, ks_base, i, count, j_next, SPARSE, QUANT)
    st = i % STAGES
    mbarrier.wait(kv_ready.index(st), (i // STAGES) & 1)
    s = warpgroup_mma(q_part, k_bufs.index(st).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    p, m_i, l_i, alpha = _softmax_step(s, j, m_i, l_i, c_q * ksc, n_n, S_K, MASK, QUANT, INT_QK, not TC_SUM,
                                       TREE_MAX, BYTE_P, LAZY, INT_MAX)
    acc = _scaled_output(acc, alpha, LAZY)
    pv = _as_operand(p, v_bufs.dtype, o_layout, BYTE_P)
    acc = warpgroup_mma(pv, _v_operand(v_bufs, st, V_T), acc, is_async=True)
    if TC_SUM:
        lacc = _rescaled(lacc, alpha)
        lstep = _sum_product(pv, ones_smem, lacc)
        acc, lstep = warpgroup_mma_wait(num_outstanding=0, deps=(acc, lstep))
        lacc = lacc + lstep
    else:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.arrive(kv_empty.index(st), count=1)
    return acc, lacc, m_i, l_i, j_next, ks_next, j_after


@gluon.jit
def _overlapped_step(q_part, k_bufs, v_bufs, kv_ready, kv_empty, turn, row, i, count, j, ksc, j_next, acc, carried,
                     alpha, m_i, l_i, c_q, KS, ks_base, n_n, S_K, s_zero, o_layout: gl.constexpr, PART: gl.constexpr,
                     STAGES: gl.constexpr, SPARSE: gl.constexpr, MASK: gl.constexpr, QUANT: gl.constexpr,
                     INT_QK: gl.constexpr, V_T: gl.constexpr, TURNS: gl.constexpr, EARLY: gl.constexpr,
                     GROUPS: gl.constexpr, sums, PIN: gl.constexpr, lacc, ones_smem, TC_SUM: gl.constexpr,
                     NARROW: gl.constexpr, TREE_MAX: gl.constexpr, BYTE_P: gl.constexpr, LAZY: gl.constexpr,
                     INT_MAX: gl.constexpr):
    """Schedules 1 to 4: block i's Q·Kᵀ and block i-1's P·V (from ``carried``, see ``_carried``) issued
    together, so that block i's softmax could run while P·V is on the tensor cores. The new P (fp32;
    the wait takes no 8-bit values) and row sum go through the P·V wait as its dependencies, which
    keeps Triton from sinking the softmax below the wait (it did: every exp2 came after it). ptxas
    still places that wait right after the row max, before the first exp2 (seen in the SASS of every
    variant here, with or without the dependencies, the stage release or the rescale after it), so
    the overlap that remains is between the two warpgroups. TURNS: take this warpgroup's turn to
    issue, then hand it to the other. EARLY: rescale the output for block i-1 (``alpha``) between the
    two issues, under Q·Kᵀ, as FlashAttention-3 does; otherwise for block i after the P·V wait. PIN: the
    row sums are stored to ``sums`` (shared memory nobody reads) before the P·V wait. The sums need every
    exp2, and ptxas keeps the wait below a shared-memory store, so the exp2s run under P·V. Without it
    ptxas fills the row max's shuffle latency with the wait and every exp2 comes after it
    (``hopper_compile.loop_shape``: at head dim 128, FP8, the wait at 174 of 462 instructions, the exp2s
    at 228-424; pinned, the wait at 431, the exp2s at 193-415; the same in every mode, and at three
    warpgroups)."""
    ks_next, j_after = _ahead(row, KS, ks_base, i, count, j_next, SPARSE, QUANT)
    st = i % STAGES
    prev = (i - 1) % STAGES
    pd = _operand(carried, v_bufs.dtype, o_layout, NARROW, BYTE_P)
    mbarrier.wait(kv_ready.index(st), (i // STAGES) & 1)
    if TURNS:
        mbarrier.wait(turn.index(PART), (i - 1) & 1)
    s_tok = warpgroup_mma(q_part, k_bufs.index(st).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    if EARLY:
        acc = _scaled_output(acc, alpha, LAZY)
        if TC_SUM:
            lacc = _rescaled(lacc, alpha)
    o_tok = warpgroup_mma(pd, _v_operand(v_bufs, prev, V_T), acc, is_async=True)
    if TC_SUM:
        l_tok = _sum_product(pd, ones_smem, lacc)
    if TURNS:
        mbarrier.arrive(turn.index((PART + 1) % GROUPS), count=1)
    if TC_SUM:
        s = warpgroup_mma_wait(num_outstanding=2, deps=(s_tok,))
    else:
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
    p, m_i, l_i, alpha = _softmax_step(s, j, m_i, l_i, c_q * ksc, n_n, S_K, MASK, QUANT, INT_QK, not TC_SUM,
                                       TREE_MAX, BYTE_P, LAZY, INT_MAX)
    if PIN:
        sums.store(l_i)
    if TC_SUM:
        acc, lstep, p = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, l_tok, p))
        lacc = lacc + lstep
    else:
        acc, p, l_i = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p, l_i))
    _hold(pd)
    mbarrier.arrive(kv_empty.index(prev), count=1)
    if not EARLY:
        acc = _scaled_output(acc, alpha, LAZY)
        if TC_SUM:
            lacc = _rescaled(lacc, alpha)
    return (acc, lacc, _carried(p, v_bufs.dtype, o_layout, NARROW, BYTE_P), alpha, m_i,
            l_i, j_next, ks_next, j_after)


@gluon.jit
def _consume(shared, PART: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, SPARSE: gl.constexpr,
             EVEN_K: gl.constexpr, QUANT: gl.constexpr, INT_QK: gl.constexpr, V_T: gl.constexpr,
             SCHEDULE: gl.constexpr, GROUPS: gl.constexpr, PIN: gl.constexpr, TC_SUM: gl.constexpr,
             NARROW: gl.constexpr, TREE_MAX: gl.constexpr, BYTE_P: gl.constexpr, LAZY: gl.constexpr,
             INT_MAX: gl.constexpr, O_ALIGNED: gl.constexpr, GATHER_O: gl.constexpr):
    """A math partition: 64 query rows against every listed key block, then the normalized store.
    ``shared``: what every math partition takes alike (see ``_hopper_attn_kernel``).

    SCHEDULE 0: per block, Q·Kᵀ, softmax, P·V, each waited for (``_serial_step``). 1: FlashAttention-3's
    intra-warpgroup overlap (``_overlapped_step``). 2: as 1, with the two warpgroups taking turns to issue
    their products (``turn``: one mbarrier per warpgroup), so that one's softmax falls under the other's
    products instead of both competing for the exp2 units at once. 3 and 4: 1 and 2 with the output
    rescaled before the P·V issue (``_overlapped_step``'s EARLY). The last visited block is stepped
    apart, the only one that may need the tail mask. Each step carries the block index and K scale of
    the next (``_ahead``). ``TC_SUM``: the row sums of P come from the tensor cores, as P times a tile of
    ones (64 x 8, every column the sum) issued with each P·V, instead of from 62 adds and 4 shuffles per
    thread and step in the softmax. Each block's sum starts from zero and is added to the running one
    (``lacc``) in fp32 registers: accumulated across blocks inside the 8-bit product, the running sum
    lost precision (on the H200 the cosine fell from 0.99849 to 0.99808 in FP8 mode and from 0.99921 to
    0.99880 in INT8 mode at LTX's shape; Hopper's FP8 products keep about 14 bits of their sums, as
    DeepSeek-V3's report measured)."""
    (q_smem, k_bufs, v_bufs, q_ready, kv_ready, kv_empty, turn, row, counts, max_list, O, QS, KS, VS, c_plain, o_base,
     sos, sod, q_start, S_Q, S_K, n_n, qs_index, qs_left, ks_base, vs_base, sums_smem, ones_smem) = shared
    sums = sums_smem.index(PART)
    qk_bits: gl.constexpr = q_smem.dtype.primitive_bitwidth
    pv_dtype: gl.constexpr = v_bufs.dtype
    s_layout: gl.constexpr = _mma_layout(qk_bits, BLOCK_K)
    o_layout: gl.constexpr = _mma_layout(pv_dtype.primitive_bitwidth, D)
    if INT_QK:
        s_zero = gl.zeros([HALF, BLOCK_K], gl.int32, s_layout)
    else:
        s_zero = gl.zeros([HALF, BLOCK_K], gl.float32, s_layout)
    q_part = q_smem.index(PART)
    if QUANT:
        c_q = gl.load(QS + qs_index + PART, mask=PART < qs_left, other=1.0)  # one Q scale per warpgroup's 64 rows
    else:
        c_q = c_plain
    m_i = gl.full([HALF], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([HALF], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([HALF, D], gl.float32, o_layout)
    l_layout: gl.constexpr = _mma_layout(pv_dtype.primitive_bitwidth, 8)
    lacc = gl.zeros([HALF, 8], gl.float32, l_layout)
    count, j, j_next = _list_start(counts, row, n_n, max_list, SPARSE)
    if QUANT:
        ksc = gl.load(KS + ks_base + j, mask=count > 0, other=1.0)
    else:
        ksc = 1.0
    mbarrier.wait(q_ready, 0)
    if SCHEDULE == 0:
        for i in range(count - 1):
            acc, lacc, m_i, l_i, j, ksc, j_next = _serial_step(
                q_part, k_bufs, v_bufs, kv_ready, kv_empty, row, i, count, j, ksc, j_next, acc, m_i, l_i, c_q, KS,
                ks_base, n_n, S_K, s_zero, o_layout, STAGES, SPARSE, False, QUANT, INT_QK, V_T, lacc, ones_smem,
                TC_SUM, TREE_MAX, BYTE_P, LAZY, INT_MAX)
        if count > 0:
            acc, lacc, m_i, l_i, j, ksc, j_next = _serial_step(
                q_part, k_bufs, v_bufs, kv_ready, kv_empty, row, count - 1, count, j, ksc, j_next, acc, m_i, l_i, c_q,
                KS, ks_base, n_n, S_K, s_zero, o_layout, STAGES, SPARSE, not EVEN_K, QUANT, INT_QK, V_T, lacc,
                ones_smem, TC_SUM, TREE_MAX, BYTE_P, LAZY, INT_MAX)
    elif count > 0:
        ks_next, j_after = _ahead(row, KS, ks_base, 0, count, j_next, SPARSE, QUANT)
        mbarrier.wait(kv_ready.index(0), 0)
        s = warpgroup_mma(q_part, k_bufs.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        p, m_i, l_i, alpha = _softmax_step(s, j, m_i, l_i, c_q * ksc, n_n, S_K, not EVEN_K, QUANT, INT_QK,
                                           not TC_SUM, TREE_MAX, BYTE_P, LAZY, INT_MAX)
        carried = _carried(p, pv_dtype, o_layout, NARROW, BYTE_P)
        j, ksc, j_next = j_next, ks_next, j_after
        for i in range(1, count - 1):
            acc, lacc, carried, alpha, m_i, l_i, j, ksc, j_next = _overlapped_step(
                q_part, k_bufs, v_bufs, kv_ready, kv_empty, turn, row, i, count, j, ksc, j_next, acc, carried, alpha,
                m_i, l_i, c_q, KS, ks_base, n_n, S_K, s_zero, o_layout, PART, STAGES, SPARSE, False, QUANT, INT_QK, V_T,
                SCHEDULE % 2 == 0, SCHEDULE >= 3, GROUPS, sums, PIN, lacc, ones_smem, TC_SUM, NARROW, TREE_MAX, BYTE_P,
                LAZY, INT_MAX)
        if count > 1:
            acc, lacc, carried, alpha, m_i, l_i, j, ksc, j_next = _overlapped_step(
                q_part, k_bufs, v_bufs, kv_ready, kv_empty, turn, row, count - 1, count, j, ksc, j_next, acc, carried,
                alpha, m_i, l_i, c_q, KS, ks_base, n_n, S_K, s_zero, o_layout, PART, STAGES, SPARSE, not EVEN_K, QUANT,
                INT_QK, V_T, SCHEDULE % 2 == 0, SCHEDULE >= 3, GROUPS, sums, PIN, lacc, ones_smem, TC_SUM, NARROW,
                TREE_MAX, BYTE_P, LAZY, INT_MAX)
        last = (count - 1) % STAGES
        if SCHEDULE >= 3:
            acc = _scaled_output(acc, alpha, LAZY)
            if TC_SUM:
                lacc = _rescaled(lacc, alpha)
        pv = _operand(carried, pv_dtype, o_layout, NARROW, BYTE_P)
        acc = warpgroup_mma(pv, _v_operand(v_bufs, last, V_T), acc, is_async=True)
        if TC_SUM:
            lstep = _sum_product(pv, ones_smem, lacc)
            acc, lstep = warpgroup_mma_wait(num_outstanding=0, deps=(acc, lstep))
            lacc = lacc + lstep
        else:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(kv_empty.index(last), count=1)
    if TC_SUM:
        l_i = gl.convert_layout(gl.max(lacc, axis=1), gl.SliceLayout(1, s_layout))  # every column holds the sum
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    out = acc / gl.where(l_o > 0, l_o, 1.0)[:, None]
    if V_T:  # our copy of V, its channels in the order the accumulator stores them in
        out = _ordered_output(out)
    elif GATHER_O:  # the host's V: each thread's eight neighbouring channels gathered from its quad, in O's dtype
        out = gl.convert_layout(out.to(O.dtype.element_ty), _stored_layout(HALF, D))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, out.type.layout))
    if QUANT:
        out = out * gl.load(VS + vs_base + offs_d)[None, :]  # acc and l_i both carry P's scale
    rows = q_start + PART * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(1, out.type.layout))
    if O_ALIGNED:  # told, since the partition's arguments carry no divisibility: every row starts on 16 bytes
        ptrs = O + gl.multiple_of(o_base + rows * sos, 8)[:, None] + offs_d[None, :]
    else:
        ptrs = O + o_base + rows[:, None] * sos + offs_d[None, :] * sod
    gl.store(ptrs, out.to(O.dtype.element_ty), mask=(rows < S_Q)[:, None])


@gluon.constexpr_function
def _stored_layout(rows, cols):
    """The accumulator's layout (``_mma_layout``) with its columns renamed by ``_ordered_output``: each thread's
    eight neighbouring channels first among its registers, so that they go out in one 16-byte store. One consumer
    warpgroup's tile: 64 rows over four warps, as ``_mma_layout``."""
    if rows != 64 or cols % 32:
        raise ValueError(f"a consumer's output tile is 64 rows by a multiple of 32 channels, not {rows} x {cols}")
    reg = [[0, 1], [0, 2], [0, 4], [8, 0]] + [[0, 32 << i] for i in range((cols // 32).bit_length() - 1)]
    return gl.DistributedLinearLayout(reg, [[0, 8], [0, 16], [1, 0], [2, 0], [4, 0]], [[16, 0], [32, 0]], [],
                                      [rows, cols])


@gluon.jit
def _ordered_output(x):
    """The output's columns in channel order, where V's channels were ordered for it
    (``quantize(permute_v=True)``, ``quant_attention._output_channel``): the accumulator's column
    32a + 8b + 2c + e holds channel 32a + 8c + 2b + e, so renaming registers (nothing moves) puts channels
    32a + 8c to 32a + 8c + 7 in thread c's registers in order. In the accumulator's own order a thread holds pairs
    of channels eight apart, at most four bytes per store. On the H200 (benchmarks/results/2026-12-04-h200-s15) the
    stores had been the programs' fixed cost: with empty lists at LTX's shape, where each value left in a store of
    its own, the launch took 0.22 ms with the L2 81.9 % busy and DRAM 14.7 % (Nsight Compute, call b). In one run
    (call c), empty lists took 0.098 ms against 0.140 with 4- or 2-byte stores at LTX and 0.209 against 0.354 at
    Wan-14B, 27 key blocks 1.121 against 1.162-1.169 ms at LTX; the same bits."""
    M: gl.constexpr = x.shape[0]
    N: gl.constexpr = x.shape[1]
    y = gl.reshape(gl.permute(gl.reshape(x, [M, N // 32, 4, 4, 2]), (0, 1, 3, 2, 4)), [M, N])
    return gl.convert_layout(y, _stored_layout(M, N))


@gluon.jit
def _hopper_attn_kernel(q_desc, k_desc, v_desc, ones_desc, O, QS, KS, VS, KV_INDEX, KV_COUNT, sob, soh, sos, sod,
                        q_rb, q_rh, q_ch, k_rb, k_rh, k_ch, v_rb, v_rh, v_ch,
                        H, H_KV, S_Q, S_K, n_m, n_n, n_qs, max_list, c_plain,
                        D: gl.constexpr, STAGES: gl.constexpr, SPARSE: gl.constexpr, EVEN_K: gl.constexpr,
                        QUANT: gl.constexpr, INT_QK: gl.constexpr, V_T: gl.constexpr,
                        SCHEDULE: gl.constexpr, GROUPS: gl.constexpr, PIN: gl.constexpr, TC_SUM: gl.constexpr,
                        NARROW: gl.constexpr, TREE_MAX: gl.constexpr, BYTE_P: gl.constexpr, LAZY: gl.constexpr,
                        INT_MAX: gl.constexpr, O_ALIGNED: gl.constexpr, GATHER_O: gl.constexpr):
    # One program per (64·GROUPS-row query block, batch · head). A descriptor row is b·rb + h·rh + s, its first
    # column h·ch: the caller picks rb, rh, ch for the storage (see hopper_attention).
    pid_m = gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // (H // H_KV)
    bhk = b * H_KV + hk
    q_start = pid_m * HALF * GROUPS
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [_q_slots(GROUPS), HALF, D], q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_K, D], k_desc.layout)
    if V_T:
        v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, D, BLOCK_K], v_desc.layout)
    else:
        v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_K, D], v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [GROUPS, 1], mbarrier.MBarrierLayout())
    sums = gl.allocate_shared_memory(gl.float32, [GROUPS, HALF], gl.SwizzledSharedLayout(1, 1, 1, [0]))  # PIN
    if TC_SUM:
        ones_smem = gl.allocate_shared_memory(ones_desc.dtype, [8, BLOCK_K], ones_desc.layout)
    else:
        ones_smem = sums  # not read
    mbarrier.init(q_ready, count=1)
    for g in gl.static_range(GROUPS):
        mbarrier.init(turn.index(g), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(kv_ready.index(s), count=1)
        mbarrier.init(kv_empty.index(s), count=GROUPS)  # every consumer releases a stage
    counts = KV_COUNT + bh * n_m + pid_m  # read in each partition (_list_start), not here
    row = KV_INDEX + (bh * n_m + pid_m) * max_list
    if SCHEDULE % 2 == 0 and SCHEDULE > 0:
        mbarrier.arrive(turn.index(0), count=1)  # the first warpgroup issues first
    o_base = b * sob + h * soh
    qs_index = bh * n_qs + pid_m * GROUPS  # the Q scales are per 64 rows, n_qs of them per head
    qs_left = n_qs - pid_m * GROUPS
    ks_base = bhk * n_n
    vs_base = bhk * D
    q_row = b * q_rb + h * q_rh + q_start
    k_row = b * k_rb + hk * k_rh
    v_row = b * v_rb + hk * v_rh
    produce = (q_desc, k_desc, v_desc, ones_desc, q_smem, k_bufs, v_bufs, ones_smem, q_ready, kv_ready, kv_empty, row,
               counts, n_n, max_list, q_row, h * q_ch, k_row, hk * k_ch, v_row, hk * v_ch)
    shared = (q_smem, k_bufs, v_bufs, q_ready, kv_ready, kv_empty, turn, row, counts, max_list, O, QS, KS, VS, c_plain,
              o_base, sos, sod, q_start, S_Q, S_K, n_n, qs_index, qs_left, ks_base, vs_base, sums, ones_smem)
    if GROUPS == 3:
        gl.warp_specialize([
            (_produce, (produce, STAGES, SPARSE, V_T, GROUPS, TC_SUM)),
            (_consume, (shared, 0, D, STAGES, SPARSE, EVEN_K, QUANT, INT_QK, V_T, SCHEDULE, GROUPS, PIN, TC_SUM, NARROW,
                        TREE_MAX, BYTE_P, LAZY, INT_MAX, O_ALIGNED, GATHER_O)),
            (_consume, (shared, 1, D, STAGES, SPARSE, EVEN_K, QUANT, INT_QK, V_T, SCHEDULE, GROUPS, PIN, TC_SUM, NARROW,
                        TREE_MAX, BYTE_P, LAZY, INT_MAX, O_ALIGNED, GATHER_O)),
            (_consume, (shared, 2, D, STAGES, SPARSE, EVEN_K, QUANT, INT_QK, V_T, SCHEDULE, GROUPS, PIN, TC_SUM, NARROW,
                        TREE_MAX, BYTE_P, LAZY, INT_MAX, O_ALIGNED, GATHER_O)),
        ], [4, 4, 4], [160, 160, 160])
    else:
        gl.warp_specialize([
            (_produce, (produce, STAGES, SPARSE, V_T, GROUPS, TC_SUM)),
            (_consume, (shared, 0, D, STAGES, SPARSE, EVEN_K, QUANT, INT_QK, V_T, SCHEDULE, GROUPS, PIN, TC_SUM, NARROW,
                        TREE_MAX, BYTE_P, LAZY, INT_MAX, O_ALIGNED, GATHER_O)),
            (_consume, (shared, 1, D, STAGES, SPARSE, EVEN_K, QUANT, INT_QK, V_T, SCHEDULE, GROUPS, PIN, TC_SUM, NARROW,
                        TREE_MAX, BYTE_P, LAZY, INT_MAX, O_ALIGNED, GATHER_O)),
        ], [4, 4], [240, 240])


@dataclass(frozen=True)
class RowView:
    """A [B, H, S, D] tensor as the 2-D [rows, columns] matrix a descriptor reads: row b·rb + h·rh + s,
    first column h·ch."""

    matrix: torch.Tensor
    rb: int
    rh: int
    ch: int


def host_layout(t: torch.Tensor) -> RowView | None:
    """The 2-D view of a [B, H, S, D] tensor stored [B, H, S, D] or [B, S, H, D], or None."""
    B, H, S, D = t.shape
    sb, sh, ss, sd = t.stride()
    size = t.element_size()
    if sd != 1 or t.data_ptr() % 16 or (ss * size) % 16:
        return None
    if H == 1 or sh == S * ss:  # heads apart: [B, H, S, D] (any row stride, heads S rows apart)
        if B == 1 or sb == H * S * ss:
            return RowView(t.as_strided((B * H * S, D), (ss, 1)), H * S, S, 0)
    if sh == D and ss >= H * D and (B == 1 or sb == S * ss):  # heads side by side: [B, S, H, D] storage
        return RowView(t.as_strided((B * S, H * D), (ss, 1)), S, 0, D)
    return None


def rows_aligned(t: torch.Tensor) -> bool:
    """Whether every row of ``t`` ([B, H, S, D], D innermost) starts on 16 bytes, so that stores of 16 bytes can
    write it (``_consume``'s ``O_ALIGNED``)."""
    size = t.element_size()
    return t.stride(3) == 1 and t.data_ptr() % 16 == 0 and all((st * size) % 16 == 0 for st in t.stride()[:3])


def list_rows(head_dim: int) -> int:
    """Query rows per block of the block lists this schedule runs fastest with: one per consumer
    warpgroup of ``DEFAULT_GROUPS`` (192 at head dim 64, 128 at 128). The selector makes lists of any
    height (``TileSelector.select(rows=...)``); the key blocks are always ``ROWS_K``."""
    return ROWS_HALF * DEFAULT_GROUPS[head_dim]


def serves(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qk: str,
           lists: tuple[int, int] | None = None) -> bool:
    """Whether ditgate's forms should run this call here rather than through the Triton schedule: on
    Hopper, where it measured faster (``FASTER_THAN_TRITON``: mode, head dim, and the query rows per
    block of the block lists that come with the call, ``lists`` being their (query rows, key rows) per
    block), and in plain mode from storage a descriptor can read (the quantized modes read their own
    copies)."""
    if ready(q, k, v):
        return False
    if lists is not None and lists[1] != ROWS_K:
        return False
    if (qk, q.shape[3], None if lists is None else lists[0]) not in FASTER_THAN_TRITON:
        return False
    return qk != "plain" or all(host_layout(t) is not None for t in (q, k, v))


def ready(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """None where this schedule can take the call; otherwise why not."""
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device)[0] != 9:
        return "the warp-specialized schedule is written for Hopper (sm_90)"
    if q.shape[3] not in (64, 128):
        return f"head dim {q.shape[3]} (64 or 128)"
    return None


def _descriptor(view: torch.Tensor, block: list[int]) -> TensorDescriptor:
    dtype = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float8_e4m3fn: gl.float8e4nv,
             torch.int8: gl.int8}[view.dtype]
    layout = gl.NVMMASharedLayout.get_default_for(block, dtype)
    return TensorDescriptor(view, list(view.shape), list(view.stride()), block, layout)


Memo = Callable[[Hashable, Callable[[], Any]], Any]


def _kept_descriptor(view: torch.Tensor, block: list[int], memo: Memo | None) -> TensorDescriptor:
    """``_descriptor``, made once per address, shape, strides and block where ``memo`` keeps it (a form's
    workspace, whose buffers hold the quantized copies at the same addresses call after call). Building the
    four descriptors took about three quarters of ``plan_launch``'s host time (96 us on a CI core)."""
    if memo is None:
        return _descriptor(view, block)
    key = ("descriptor", view.data_ptr(), tuple(view.shape), tuple(view.stride()), view.dtype, tuple(block))
    return memo(key, lambda: _descriptor(view, block))


def _ones_descriptor(dtype: torch.dtype, device: torch.device, memo: Memo | None) -> TensorDescriptor:
    """The tile of ones P is multiplied by for its row sums (``TC_SUM``), read by TMA with Q; kept in ``memo``
    where given, so that a call neither allocates nor fills it."""
    def make():
        return _descriptor(torch.ones(8, ROWS_K, dtype=dtype, device=device), [8, ROWS_K])

    return make() if memo is None else memo(("ones", dtype, str(device)), make)


def default_stages(head_dim: int, qk: str, groups: int = 2) -> int:
    """Key/value stages that fit beside Q (64 rows per consumer warpgroup) in 227 KB of shared memory."""
    elem = 2 if qk == "plain" else 1
    stage = 2 * ROWS_K * head_dim * elem
    return max(2, min(4, (227 * 1024 - ROWS_HALF * _q_slots(groups) * head_dim * elem - 1024) // stage))


@dataclass(frozen=True)
class Launch:
    """Everything one call of the kernel takes: grid, positional arguments, compile-time flags."""

    grid: tuple[int, int]
    args: tuple
    flags: dict

    def run(self) -> None:
        """Issue the kernel (one warpgroup's four warps per partition, as every partition is written for)."""
        _hopper_attn_kernel[self.grid](*self.args, **self.flags, num_warps=4)


def plan_launch(q, k, v, qk: str, scale: float, out: torch.Tensor, qz=None, kv_index=None, kv_count=None,
                stages: int | None = None, schedule: int | None = None, groups: int = 2,
                pin: bool | None = None, tc_sum: bool | None = None, narrow: int | None = None,
                tree_max: bool | None = None, byte_p: bool | None = None, memo: Memo | None = None,
                lazy: bool | None = None, int_max: bool | None = None, gather_out: bool | None = None) -> Launch:
    """The kernel's arguments for validated inputs; ``qz`` the quantized copies (``quantize``, Q scales per
    64 rows) unless plain; ``groups`` consumer warpgroups of 64 query rows per program; ``pin``: keep the
    exp2s above the P·V wait (``_overlapped_step``), by default where that measured faster (``PINNED``);
    ``tc_sum``: P's row sums from the tensor cores (``TC_SUMMED``); ``narrow``: how an 8-bit P crosses the
    loop (``default_narrowing``; 1 rounds P twice, through float16); ``tree_max``: each row's max as a tree
    (``TREE_MAXED``), the same bits as without; ``byte_p``: FP8 P's bytes from two FMAs instead of an exp2
    (``_byte_p``; ``BYTE_PS``), with the row sums from the tensor cores; ``lazy``: with P's bytes or in plain mode, the
    output rescaled only where a row's max rose past ``LAZY_TAU`` (``LAZY_TAU_PLAIN`` in plain mode;
    ``_rows_rescaled``; ``LAZY_RESCALED``); ``int_max``: INT8's row max over the integer products (``INT_MAXED``),
    the same bits; ``gather_out``: in plain mode, each thread's eight neighbouring output channels gathered from the
    other threads of its row before the store, so that they leave in one 16-byte store (``GATHERED``), the same bits;
    the quantized modes order V's channels for that instead (``_ordered_output``). ``memo``: where the descriptors of
    ``qz``'s copies and the tile of ones are kept between calls (the workspace that ``qz``'s buffers came from;
    the host's own tensors, read in plain mode, are never kept)."""
    B, H, SQ, D = q.shape
    HK, SK = k.shape[1], k.shape[2]
    rows_q = ROWS_HALF * groups
    n_m, n_n = -(-SQ // rows_q), -(-SK // ROWS_K)
    if qz is not None:
        q_desc = _kept_descriptor(qz.q.view(-1, D), [ROWS_HALF, D], memo)
        k_desc = _kept_descriptor(qz.k.view(-1, D), [ROWS_K, D], memo)
        v_desc = _kept_descriptor(qz.vt.view(-1, qz.sk_pad), [D, ROWS_K], memo)
        rows = (H * qz.sq_pad, qz.sq_pad, 0, HK * qz.sk_pad, qz.sk_pad, 0, HK * D, D, 0)
        scales = (qz.q_scale, qz.k_scale, qz.v_scale)
    else:
        views = [host_layout(t) for t in (q, k, v)]
        if any(view is None for view in views):
            raise ValueError("plain mode reads [B, H, S, D] or [B, S, H, D] storage with 16-byte aligned rows")
        q_desc = _descriptor(views[0].matrix, [ROWS_HALF, D])
        k_desc = _descriptor(views[1].matrix, [ROWS_K, D])
        v_desc = _descriptor(views[2].matrix, [ROWS_K, D])
        rows = tuple(x for view in views for x in (view.rb, view.rh, view.ch))
        scales = (out, out, out)  # unused placeholders
    sparse = kv_index is not None
    where = (qk, D, rows_q if sparse else None)
    if byte_p is None:  # by default, unless the call asks for what the bytes exclude: the softmax's sums or a float16 P
        byte_p = where in BYTE_PS and tc_sum is not False and narrow != 1 and not pin
    if byte_p and qk == "plain":
        raise ValueError("byte_p makes P's FP8 bytes: FP8 or INT8 mode only")
    if tc_sum is None:
        tc_sum = where in TC_SUMMED or bool(byte_p)
    if byte_p and not tc_sum:
        raise ValueError("byte_p leaves no float P to sum: its row sums are the tensor cores' (tc_sum)")
    if pin is None:
        pin = where in PINNED and not tc_sum
    if pin and tc_sum:
        raise ValueError("pin stores the softmax's row sums, which tc_sum leaves to the tensor cores")
    if tree_max is None:
        tree_max = where in TREE_MAXED
    if lazy is None:
        lazy = where in LAZY_RESCALED and (bool(byte_p) or qk == "plain")
    if lazy and not byte_p and qk != "plain":
        raise ValueError("lazy keeps a row's reference max within P's bytes' headroom: it needs byte_p")
    if int_max is None:
        int_max = where in INT_MAXED
    if int_max and qk != "int8":
        raise ValueError("int_max takes each row's max over INT8's integer products: INT8 mode only")
    aligned = rows_aligned(out)
    if gather_out is None:
        gather_out = where in GATHERED
    if gather_out and (qz is not None or not aligned or D != 64):
        raise ValueError("gather_out is for plain mode's output at head dim 64 (at 128 its shared memory does not fit "
                         "beside three stages), with every row on 16 bytes")
    if narrow is None:
        narrow = default_narrowing(groups, qk, bool(byte_p))
    if narrow not in (0, 1, 2) or (byte_p and narrow == 1):
        raise ValueError(f"narrow must be 0, 1 or 2 (0 or 2 with byte_p), not {narrow!r}")
    if tc_sum:  # the tile of ones P is multiplied by; otherwise V's descriptor stands in, never read
        ones_desc = _ones_descriptor(v_desc.base.dtype, q.device, memo)
    else:
        ones_desc = v_desc
    if sparse:
        lists = (kv_index, kv_count, kv_index.shape[3])
    else:
        lists = (out, out, 0)
    args = (q_desc, k_desc, v_desc, ones_desc, out, *scales, lists[0], lists[1], *out.stride(), *rows,
            H, HK, SQ, SK, n_m, n_n, 0 if qz is None else qz.q_scale.shape[1], lists[2], scale * LOG2E)
    flags = dict(D=D, STAGES=stages or default_stages(D, qk, groups), SPARSE=sparse, EVEN_K=SK % ROWS_K == 0,
                 QUANT=qz is not None, INT_QK=qk == "int8", V_T=qz is not None,
                 SCHEDULE=DEFAULT_SCHEDULE[qk] if schedule is None else schedule, GROUPS=groups, PIN=pin,
                 TC_SUM=tc_sum, NARROW=narrow, TREE_MAX=bool(tree_max), BYTE_P=bool(byte_p),
                 LAZY=bool(lazy), INT_MAX=bool(int_max), O_ALIGNED=aligned, GATHER_O=bool(gather_out))
    return Launch((n_m, B * H), args, flags)


def quantize_for_schedule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qk: str, scale: float, buffers=None,
                          sums: bool = False, kv_stream: torch.cuda.Stream | None = None) -> Quantized:
    """The quantized copies this schedule reads: Q scales per 64 rows (one per consumer warpgroup), K per
    128 keys, V in P's key order; ``sums``: Q's column sums too; ``kv_stream``: K and V quantized there
    (``quantize``)."""
    return quantize(q, k, v, qk, scale, KernelConfig(ROWS_HALF, ROWS_K), buffers, permute_v=True, sums=sums,
                    kv_stream=kv_stream)


def hopper_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, qk: str = "fp8",
                     scale: float | None = None, kv_index: torch.Tensor | None = None,
                     kv_count: torch.Tensor | None = None, stages: int | None = None,
                     schedule: int | None = None, groups: int | None = None, buffers=None,
                     out: torch.Tensor | None = None, pin: bool | None = None,
                     tc_sum: bool | None = None, narrow: int | None = None,
                     tree_max: bool | None = None, byte_p: bool | None = None,
                     prepared: Quantized | None = None, memo: Memo | None = None,
                     lazy: bool | None = None, int_max: bool | None = None,
                     gather_out: bool | None = None) -> torch.Tensor:
    """``quant_attention``'s contract (B, H, S, D inputs; key blocks of 128 rows in the lists) on Hopper.
    ``prepared``: the quantized copies made already (``quantize_for_schedule``), checked, not remade.
    ``memo``: keeps host-side launch objects between calls (``plan_launch``); give it only with ``buffers`` of
    the same workspace, so that the copies it describes stay where it saw them.
    ``groups``: consumer warpgroups per program, 2 (128 query rows) or 3 (192; head dim 64 only); by
    default ``DEFAULT_GROUPS`` for the head dim. With block lists, their query blocks are the program's
    rows: lists per 128 query rows take 2 (the default with lists), per 192 rows 3."""
    if qk not in QK_MODES:
        raise ValueError(f"qk must be one of {QK_MODES}, not {qk!r}")
    if (kv_index is None) != (kv_count is None):
        raise ValueError("kv_index and kv_count go together")
    if memo is not None and buffers is None:  # fresh copies at fresh addresses: every call would keep one more
        raise ValueError("memo keeps descriptors of a workspace's buffers: give that workspace's buffers too")
    why = ready(q, k, v)
    if why:
        raise ValueError(why)
    B, H, SQ, D = q.shape
    HK = k.shape[1]
    if H % HK:
        raise ValueError(f"{H} query heads are not a multiple of {HK} key/value heads")
    if groups is None:
        groups = 2 if kv_index is not None else DEFAULT_GROUPS[D]
    if groups not in GROUPS or (groups != 2 and D != 64):
        raise ValueError(f"groups must be one of {GROUPS} (3 only at head dim 64), not {groups!r}")
    scale = D ** -0.5 if scale is None else float(scale)
    if out is None:
        out = torch.empty((B, SQ, H, D), dtype=q.dtype, device=q.device).transpose(1, 2)
    if kv_index is not None:
        rows = ROWS_HALF * groups
        n_m = -(-SQ // rows)
        if kv_index.shape[:3] != (B, H, n_m) or kv_count.shape != (B, H, n_m):
            raise ValueError(f"kv_index must be [B, H, {n_m}, L] and kv_count [B, H, {n_m}] for {rows}-row query "
                             f"blocks ({groups} warpgroups)")
        kv_index = kv_index.to(torch.int32).contiguous()
        kv_count = kv_count.to(torch.int32).contiguous()
    qz = None
    if qk != "plain":
        qz = checked_prepared(prepared, qk, scale, ROWS_HALF, ROWS_K, True) or quantize_for_schedule(
            q, k, v, qk, scale, buffers)
    if schedule is not None and schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, not {schedule!r}")
    launch = plan_launch(q, k, v, qk, scale, out, qz, kv_index, kv_count, stages, schedule, groups, pin, tc_sum,
                         narrow, tree_max, byte_p, memo, lazy, int_max, gather_out)
    launch.run()
    return out
