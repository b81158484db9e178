"""Which calls the Hopper schedule (``hopper_attention``) serves, and which of its options each call gets.

A call is keyed by (mode, head dim, query rows per block of its block lists, or None for a dense call). Each option
is on only where it made that call faster than the same kernel without it; everywhere else it cost more than it
saved, and the option stays off. None of them changes a result's bits unless its entry says so.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# query rows per consumer warpgroup, and per Q scale of the quantized modes
HALF = gl.constexpr(64)
# key rows per stage: with 256 the overlapped step's registers ran short, it spilled and ptxas serialized its products
BLOCK_K = gl.constexpr(128)
ROWS_Q, ROWS_K = 128, BLOCK_K.value  # query rows of a two-warpgroup program, key rows per stage
ROWS_HALF = HALF.value
# consumer warpgroups per program: 128 or 192 query rows. Their registers per thread, 240 or 160, are what fits beside
# the 24-register load warpgroup in a multiprocessor's 64K; at 160 only head dim 64 compiles without spills
GROUPS = (2, 3)
# three at head dim 64, where the softmax outweighs the products most: each key block's loads serve 1.5 times the
# rows, and each scheduler has one more warp to issue from while another waits on its exp2s
DEFAULT_GROUPS = {64: 3, 128: 2}

# where this schedule is faster than the Triton one (``quant_attention``), so the forms run it there. Lists over
# 192 query rows beat 128-row ones at head dim 64 in plain and FP8 mode, so the sparse forms ask for them
# (``list_rows``); FP8 over 128-row lists at 64 lost to Triton; INT8 with lists stays on Triton, never measured here
FASTER_THAN_TRITON = frozenset({("plain", 64, None), ("plain", 128, None), ("plain", 64, 128), ("plain", 128, 128),
                                ("plain", 64, 192), ("fp8", 64, None), ("fp8", 128, None), ("fp8", 64, 192),
                                ("fp8", 128, 128), ("int8", 64, None), ("int8", 128, None)})

# The exp2s pinned above the P·V wait (``_overlapped_step``'s PIN): ptxas otherwise hoists that wait above every
# exp2, and the softmax no longer runs while P·V is on the tensor cores. Only plain mode's 192-row lists gain: where
# the exp2 unit is already the limit, the overlap inside a warpgroup gains nothing and the pin's store costs
PINNED = frozenset({("plain", 64, 192)})
# Each row's max as a tree of pairwise maxima (``_row_max``) instead of the compiler's chain of 31 dependent ones,
# the same bits: dense plain mode at head dim 64. Why the shorter chain slows the 8-bit modes is not known
TREE_MAXED = frozenset({("plain", 64, None)})
# The output rescaled only where a row's max rose past ``LAZY_TAU`` (``_rows_rescaled``): dense FP8 at head dim 64 and
# plain mode over 192-row lists. Where rows' maxima still move often (short lists) or the step is longer (INT8's
# integer adds, head dim 128's two votes per row), the vote, the branch and each row's compare cost more than the
# multiplies they skip. Not the same bits: a row's P may be taken from an older max
LAZY_RESCALED = frozenset({("fp8", 64, None), ("plain", 64, 192)})
# INT8's row max over the integer products (``_softmax_step``'s INT_MAX), the same bits: ptxas makes it three-input
# integer maxima, about half the instructions of the float chain. Dense only: INT8's lists run on Triton
INT_MAXED = frozenset({("int8", 64, None), ("int8", 128, None)})
# Plain mode's output channels gathered per thread before the store (``_consume``'s GATHER_O), so that each store
# writes 16 bytes where the accumulator's order allows 4, the same bits: at head dim 64, where the gather's shared
# memory fits beside three stages (at 128 it does not)
GATHERED = frozenset({("plain", 64, None), ("plain", 64, 192)})


@gluon.constexpr_function
def q_slots(groups):
    """Q's 64-row slots in shared memory: one per consumer warpgroup, rounded up to a power of two (shapes
    must be). Plain Python as well: ``default_stages`` calls it on the host."""
    return 1 << (groups - 1).bit_length()


def default_stages(head_dim: int, qk: str, groups: int = 2) -> int:
    """Key/value stages that fit beside Q (64 rows per consumer warpgroup) in 227 KB of shared memory."""
    elem = 2 if qk == "plain" else 1
    stage = 2 * ROWS_K * head_dim * elem
    return max(2, min(4, (227 * 1024 - ROWS_HALF * q_slots(groups) * head_dim * elem - 1024) // stage))


def list_rows(head_dim: int) -> int:
    """Query rows per block of the block lists this schedule runs fastest with: one per consumer
    warpgroup of ``DEFAULT_GROUPS`` (192 at head dim 64, 128 at 128). The selector makes lists of any
    height (``TileSelector.select(rows=...)``); the key blocks are always ``ROWS_K``."""
    return ROWS_HALF * DEFAULT_GROUPS[head_dim]
