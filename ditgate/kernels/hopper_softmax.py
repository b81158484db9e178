"""The Hopper schedule's softmax: one key block's scores into P, P into the P·V operand, and the output's rescale,
all in the registers of one consumer warpgroup (``hopper_kernel._consume``).

In the 8-bit modes P's FP8 bytes are computed from the scores by two FMAs (``_byte_p``) instead of being cast from
exp2s: the exp2 unit (16 per clock per multiprocessor, against 128 FMAs) is the quantized softmax's narrowest part.
The bytes cross the loop already packed, four to a register, and P's row sums come from the tensor cores (P times a
tile of ones), since no float P is left to add. In plain mode P is exp2's, cast to the host's 16-bit type.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .hopper_config import BLOCK_K

BYTE_TOP = gl.constexpr(120.0)  # P's FP8 byte at the row max (``_byte_p``): 0x78, 256
# how far (log2 units) a row's max may rise above the reference its P is taken from before the output is
# rescaled (``LAZY``): P's byte then reaches at most 120 + 8 · 0.75 = 126, e4m3's largest finite (448)
LAZY_TAU = gl.constexpr(0.75)
# the same in plain mode, where P is bf16 or fp16 and its row sums fp32: P reaches at most 2^8, as in
# FlashAttention-4's rescaling threshold, far inside either type's range
LAZY_TAU_PLAIN = gl.constexpr(8.0)


@gluon.jit
def _softmax_step(s, j, m_i, l_i, c, n_n, S_K, MASK: gl.constexpr, QUANT: gl.constexpr, INT_QK: gl.constexpr,
                  TREE_MAX: gl.constexpr, LAZY: gl.constexpr = False, INT_MAX: gl.constexpr = False):
    """One block's scores into P and the running max (m_i, in log2 units) and, in plain mode, the running sum.

    ``c``: the score scale (quantized, the product of the blocks' scales, > 0, so max(raw · c) = max(raw) · c).
    Quantized, P comes back as floats whose lowest byte is P's FP8 byte (``_byte_p``), with no exp2 but alpha's, and
    l_i as it came (the tensor cores sum P). INT8 products become float by the magic-number add. ``MASK``: this may
    be the tail block (keys past S_K), masked where ``j`` is the last key block. Only ever the last visited block
    (the lists ascend), so the loop body stays free of the mask (ptxas turns the branch into selects on every
    element). ``TREE_MAX``: the row max as a tree (``_row_max``). ``LAZY``: a row keeps its reference max until the
    block's max passes it by ``LAZY_TAU`` (``LAZY_TAU_PLAIN`` unquantized), so alpha is exactly 1 on most rows and
    most blocks (``_rows_rescaled`` then skips the output's rescale); exact in real arithmetic, as any reference
    is, since P and its row sums share it. ``INT_MAX`` (INT8): the row max over the integer products, three-input
    integer maxima where the floats take a chain of two-input ones; not in the block that may be masked, where
    holding the products and their floats at once spilled. Every exp2 is MUFU's: computing some on the FMA units
    by a polynomial, as FlashAttention-4 does on Blackwell, was slower in every mode here."""
    if QUANT:
        TAU: gl.constexpr = LAZY_TAU
    else:
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
    if LAZY:  # keep the row's reference unless its max rose past TAU (``_rows_rescaled``)
        moved = m_new > m_i + TAU
        alpha = gl.where(moved, gl.exp2(m_i - m_new), 1.0)
        m_new = gl.where(moved, m_new, m_i)
    else:
        alpha = gl.exp2(m_i - m_new)
    if QUANT:
        p = _byte_p(raw, c, m_new, offset)
    else:
        p = gl.exp2(raw * c - (m_new + offset * c)[:, None])
        l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, m_new, l_i, alpha


@gluon.jit
def _byte_p(raw, c, m_new, offset: gl.constexpr):
    """FP8 P without exp2: each score's e4m3 byte computed as an integer, X = round(8 · (x + 15)) for
    x = (raw - offset) · c - m_new (log2 units, <= 0), clamped to [0, 128] by the FMA's saturation (scores
    15 octaves below the row max become 0), and left as the lowest byte of a float by a second FMA that adds
    1.5 · 2^23. An e4m3 byte read as a number, 8 · exponent + mantissa, is 8 · (log2 of its value + 7) with
    the mantissa taken linearly between powers of two (Schraudolph's exponent trick, at e4m3's three
    mantissa bits): P = 2^(x + 8) up to a factor between 1 and 1.06 that depends on the fraction of x, and
    the rounding to three bits the exp2's cast would make anyway; the cosine to exact attention moves by about
    1e-4 (``benchmarks/fp8_error_budget.py`` emulates it). Each row's shift is taken from m_new, as the exp2's
    is, so alpha stays exp2(m_i - m_new). INT8's magic-number offset is folded into it: the shift is then about
    offset · a, and its fp32 rounding moves every score of the row and block alike by at most 0.75 of a unit of
    the integer product (under 1e-3 of X at video lengths), where INT8's own rounding of Q and K moves each score
    by hundreds of such units."""
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


@gluon.constexpr_function
def _packed_bytes_ptx(first):
    """The opening of an asm that packs the lowest bytes of operands $first to $first + 3 (``_byte_p``'s
    floats) into $0, in that order: two byte permutes pair them, a third joins the pairs. The caller closes it."""
    a, b, c, d = (f"${first + i}" for i in range(4))
    return (f"{{ .reg .b32 lo, hi; prmt.b32 lo, {a}, {b}, 0x0040; prmt.b32 hi, {c}, {d}, 0x0040; "
            "prmt.b32 $0, lo, hi, 0x5410;")


@gluon.jit
def _reordered(p, o_layout: gl.constexpr):
    """P's keys reordered into the FP8 operand's order and laid out as that operand (registers renamed, nothing
    moves). The operand wants four neighbouring keys per register where the accumulator gives each thread pairs 8
    keys apart, which would be a move between threads (shuffles). Instead P's keys are reordered inside each group
    of 32 (keys 16h + 8a + 2t + b to place 16h + 4t + 2a + b) so that every thread already holds its operand's
    values, and V is stored in the same order (``quantize(permute_v=True)``): the product is unchanged."""
    M: gl.constexpr = p.shape[0]
    N: gl.constexpr = p.shape[1]
    p = gl.reshape(p, [M, N // 32, 2, 2, 4, 2])
    p = gl.reshape(gl.permute(p, (0, 1, 2, 4, 3, 5)), [M, N])
    return gl.convert_layout(p, gl.DotOperandLayout(0, o_layout, 4))


@gluon.jit
def _carried(p, pv_dtype: gl.constexpr, o_layout: gl.constexpr, QUANT: gl.constexpr):
    """What crosses the loop for the next step's P·V. 16-bit: the operand itself, P cast and laid out as the
    accumulator already is, one pack per pair. Quantized: the bytes of ``_byte_p``'s floats, in the operand's key
    order (``_reordered``), packed four to a register by byte permutes and carried as the first of each pair of
    float16 registers that an asm over four values gives back (the second holds nothing and is dead); the next step
    only renames them (``_operand``). An 8-bit operand crossing the loop one value per byte was unpacked and
    repacked every block, and fp32 floats carried at head dim 128 spilled."""
    if QUANT:
        x = gl.inline_asm_elementwise(_packed_bytes_ptx(2) + " mov.b32 $1, 0; }", "=r,=r,r,r,r,r",
                                      [_reordered(p, o_layout)], dtype=gl.float16, is_pure=True, pack=4)
    else:
        pc = p.to(pv_dtype)
        x = gl.convert_layout(pc, gl.DotOperandLayout(0, o_layout, 32 // pv_dtype.primitive_bitwidth))
    return x


@gluon.jit
def _operand(carried, QUANT: gl.constexpr):
    """The P·V operand from what ``_carried`` handed over the loop."""
    if QUANT:  # the packed bytes, renamed as FP8
        x = gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r,r", [carried], dtype=gl.float8e4nv, is_pure=True,
                                      pack=4)
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
