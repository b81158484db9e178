"""INT8/FP8 attention for Hopper, with block-sparse key lists, in Triton.

Why our own kernel: no library on the package index does FP8 Q·Kᵀ *and* FP8 P·V with per-query-block
key lists (sageattention 1.0.6 is INT8 Q·Kᵀ with FP16 P·V and no sparsity; flash-attn-4 is exact).

Numerics (SageAttention-style):
- K is smoothed by subtracting its mean over the sequence (exact for softmax: it shifts every score of a
  query row by the same amount).
- Q and K are quantized per block of rows (BLOCK_M query rows, BLOCK_N key rows) to INT8 or FP8 e4m3
  with one absmax scale per block; ``sm_scale · log2(e)`` is folded into the Q scale so the softmax runs
  on ``exp2``.
- P·V: P is computed as 448 · exp2(s - max) (e4m3's largest finite value; the factor rides in the
  exponent and cancels against the row sum) and cast to FP8; V is quantized per channel (absmax over
  the sequence) to FP8; both products accumulate in FP32.

Layout: the quantization kernels read Q, K, V through their strides (B, H, S, D views of whatever
the host gave; no copy), and write FP8/INT8 copies padded to whole blocks, V transposed (B, H, D, S)
so that P·V's second operand is K-major as Hopper's FP8 matrix instructions want (for the Hopper schedule,
``permute_v``, with its keys and channels reordered as that schedule's registers hold them). Those copies are the
form's workspace (1 byte per element, no full-precision copy is kept).

Sparsity: ``kv_index[b, h, m, :kv_count[b, h, m]]`` lists the key blocks query block ``m`` visits, in
ascending order (so a partial tail block can only come last, the one block the kernel masks). The dense
kernel is the same code with the list implied (``j = i``), so listing every block in order gives the
dense result bit for bit; an empty list gives zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .lists import KeyBlockLists  # noqa: F401  (the sparse input, re-exported)

FP8_MAX = 448.0
INT8_MAX = 127.0
LOG2E = 1.4426950408889634


@triton.jit
def _load_rows(X, rows, bh, sxb, sxh, sxs, sxd, H, S, D: tl.constexpr):
    """Rows ``rows`` of head ``bh`` (b·H + h) as float32 through the caller's strides (zeros past S)."""
    cols = tl.arange(0, D)
    valid = rows[:, None] < S
    x = tl.load(X + (bh // H) * sxb + (bh % H) * sxh + rows[:, None] * sxs + cols[None, :] * sxd, mask=valid,
                other=0.0)
    return x.to(tl.float32), cols, valid


@triton.jit
def _load_row_block(X, blk, bh, sxb, sxh, sxs, sxd, H, S, D: tl.constexpr, BLOCK: tl.constexpr):
    """Block ``blk`` of rows of head ``bh`` (``_load_rows``)."""
    rows = blk * BLOCK + tl.arange(0, BLOCK)
    x, cols, valid = _load_rows(X, rows, bh, sxb, sxh, sxs, sxd, H, S, D)
    return x, rows, cols, valid


@triton.jit
def _quant_rows(X, OUT, SCALE, MEAN, SUMS, blk, bh, sxb, sxh, sxs, sxd, H, S, S_PAD, n_blocks, mult,
                D: tl.constexpr, BLOCK: tl.constexpr, HAS_MEAN: tl.constexpr, TO_INT8: tl.constexpr,
                QMAX: tl.constexpr, HAS_SUMS: tl.constexpr):
    """One block of rows: absmax scale, quantize, store padded contiguous rows. ``HAS_SUMS``: also the
    block's column sums in float32 (the selector's pooled tiles, from this read)."""
    x, rows, cols, valid = _load_row_block(X, blk, bh, sxb, sxh, sxs, sxd, H, S, D, BLOCK)
    if HAS_SUMS:
        tl.store(SUMS + (bh * n_blocks + blk) * D + cols, tl.sum(x, axis=0))
    if HAS_MEAN:
        mean = tl.load(MEAN + bh * D + cols)
        x = tl.where(valid, x - mean[None, :], 0.0)
    amax = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
    scale = tl.where(amax > 0, amax / QMAX, 1.0)
    y = x / scale
    out_ptrs = OUT + (bh * S_PAD + rows[:, None]) * D + cols[None, :]
    if TO_INT8:
        y = tl.where(y >= 0, y + 0.5, y - 0.5)
        tl.store(out_ptrs, y.to(tl.int8))
    else:
        tl.store(out_ptrs, y.to(tl.float8e4nv, fp_downcast_rounding="rtne"))
    tl.store(SCALE + bh * n_blocks + blk, scale * mult)


@triton.jit
def _block_and_head(p, n_blocks, heads, HEADS_INNER: tl.constexpr):
    """(row block, batch · head) of the ``p``-th program of a pass over ``heads`` heads of ``n_blocks`` blocks each.
    ``HEADS_INNER``: consecutive programs take the same block of consecutive heads, so that the programs running at
    once read whole token rows of diffusers' [B, S, H, D] storage (H · D contiguous elements per token), not one
    head's slice of each token's row; otherwise one head's blocks in turn. The same results either way. On the
    H200 (benchmarks/results/2026-12-04-h200-s18, calls c-d, ``program_order.py``), heads inner against outer:
    ``_first_pass_kernel`` 0.113 against 0.115 ms at LTX's 32 x 27588 x 64 and 0.301 against 0.325 at Wan-14B's
    40 x 32760 x 128, ``_quant_kv_kernel`` 0.089 against 0.090 and 0.246 against 0.242, ``quantize`` as a whole
    0.203 against 0.204 and 0.550 against 0.569 (faster in each of three rounds at both shapes)."""
    if HEADS_INNER:
        return p // heads, p % heads
    return p % n_blocks, p // n_blocks


@triton.jit
def _first_pass_kernel(Q, Q8, QS, Q_SUMS, K, V, K_SUMS, V_MAX, sqb, sqh, sqs, sqd, skb, skh, sks, skd,
                       svb, svh, svs, svd, H, HK, SQ, SK, SQ_PAD, n_m, n_n, q_programs, mult,
                       D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TO_INT8: tl.constexpr,
                       QMAX: tl.constexpr, HAS_SUMS: tl.constexpr, HEADS_INNER: tl.constexpr):
    """What needs nothing computed first, in one launch: programs below ``q_programs`` quantize a block of Q
    (``_quant_rows``, Q needs no mean); the rest read a block of K and V for K's column sums (its mean, and the
    selector's pooled key tiles) and V's column absmax (V's per-channel scale). Why: launches cost the host
    more than these passes cost the GPU at short sequences. With this kernel and ``_kv_scales_kernel``,
    ``quantize`` makes three launches where it made five and seven torch operations; on the H200's
    machine its host time fell from 133-139 to 79-100 us, and its GPU time from 0.271 to 0.250 ms at LTX and
    from 0.668 to 0.657 at Wan-14B (benchmarks/results/2026-12-04-h200-s13, call e, same run); with the scales
    in one step per program (call g), 0.233 and 0.635 ms. Two or four blocks of Q per program changed nothing
    (0.131 ms at LTX with 1, 2 or 4; 0.344-0.346 at Wan-14B; results 2026-12-04-h200-s14, call a)."""
    pid = tl.program_id(0)
    if pid < q_programs:
        blk, bh = _block_and_head(pid, n_m, q_programs // n_m, HEADS_INNER)
        _quant_rows(Q, Q8, QS, QS, Q_SUMS, blk, bh, sqb, sqh, sqs, sqd, H, SQ, SQ_PAD, n_m, mult,
                    D, BLOCK_M, False, TO_INT8, QMAX, HAS_SUMS)
    else:
        kv_programs = tl.num_programs(0) - q_programs
        blk, bh = _block_and_head(pid - q_programs, n_n, kv_programs // n_n, HEADS_INNER)
        k, rows, cols, valid = _load_row_block(K, blk, bh, skb, skh, sks, skd, HK, SK, D, BLOCK_N)
        v, _, _, _ = _load_row_block(V, blk, bh, svb, svh, svs, svd, HK, SK, D, BLOCK_N)
        at = (bh * n_n + blk) * D + cols
        tl.store(K_SUMS + at, tl.sum(k, axis=0))
        tl.store(V_MAX + at, tl.max(tl.abs(v), axis=0))


@triton.jit
def _kv_scales_kernel(K_SUMS, V_MAX, K_MEAN, V_SCALE, n_n, SK, D: tl.constexpr, COLS: tl.constexpr,
                      CHUNK: tl.constexpr):
    """One program per key/value head and ``COLS`` channels: K's mean over the sequence from its block sums,
    and V's per-channel scale (absmax / 448, at least 1e-20) from its block maxima; one launch where torch
    took seven. ``CHUNK`` blocks per step: every block in one step up to 256 blocks (32768 keys), so the
    program waits for one load, not one per 32 blocks: 0.011 against 0.026 ms at LTX, 0.012 against 0.034 at
    Wan-14B (H200, benchmarks/results/2026-12-04-h200-s13, calls g and e)."""
    bh = tl.program_id(0)
    cols = tl.program_id(1) * COLS + tl.arange(0, COLS)
    total = tl.zeros([COLS], dtype=tl.float32)
    vmax = tl.zeros([COLS], dtype=tl.float32)
    for start in range(0, n_n, CHUNK):
        blocks = start + tl.arange(0, CHUNK)
        at = (bh * n_n + blocks[:, None]) * D + cols[None, :]
        inside = (blocks < n_n)[:, None]
        total += tl.sum(tl.load(K_SUMS + at, mask=inside, other=0.0), axis=0)
        vmax = tl.maximum(vmax, tl.max(tl.load(V_MAX + at, mask=inside, other=0.0), axis=0))
    tl.store(K_MEAN + bh * D + cols, total / SK)
    tl.store(V_SCALE + bh * D + cols, tl.maximum(vmax / 448.0, 1e-20))


@triton.jit
def _output_channel(j):
    """The channel of V (and of the output) that the Hopper schedule's P·V accumulator holds in its column ``j``
    where V's copy was made for that schedule (``quantize(permute_v=True)``): column 32a + 8b + 2c + e holds
    channel 32a + 8c + 2b + e, so that the accumulator's thread c holds channels 32a + 8c to 32a + 8c + 7, eight
    neighbours, for each a (``hopper_attention._ordered_output``). Its own inverse."""
    return (j & ~31) | (((j >> 1) & 3) << 3) | (((j >> 3) & 3) << 1) | (j & 1)


@triton.jit
def _quant_v_block(V, VT8, VSCALE, p, n_n, svb, svh, svs, svd, HK, SK, SK_PAD, D: tl.constexpr, BLOCK: tl.constexpr,
                   PERMUTE: tl.constexpr, HEADS_INNER: tl.constexpr, heads):
    """V's ``p``-th block (which block of which of ``heads`` heads: ``_block_and_head``) over its per-channel scale to
    FP8, written transposed: VT8[b·h, d, s]
    (padded columns are zero). PERMUTE: inside each group of 32 keys, key 16h + 8a + 2t + b goes to column
    16h + 4t + 2a + b, the order in which the Hopper schedule hands P to its P·V product
    (``hopper_attention._as_operand``). The permutation picks the rows each column is read from, so that the
    columns are written in order: permuted on the store side, the transposed store was one byte per
    instruction (64 ``st.global.b8`` per thread in the PTX for sm_90, where K's rows take 4 ``st.global.v4``).
    With PERMUTE, channel d also goes to row ``_output_channel(d)``, the P·V accumulator's column that holds it in
    that schedule, so that its output leaves in 16-byte stores (``hopper_attention._ordered_output``)."""
    blk, bh = _block_and_head(p, n_n, heads, HEADS_INNER)
    columns = blk * BLOCK + tl.arange(0, BLOCK)  # key positions in VT8, written in order
    channels = tl.arange(0, D)
    if PERMUTE:  # column 16h + 4t + 2a + b gets key 16h + 8a + 2t + b; channel d goes to row _output_channel(d)
        rows = (columns & ~15) | (((columns >> 1) & 1) << 3) | (((columns >> 2) & 3) << 1) | (columns & 1)
        at = _output_channel(channels)
    else:
        rows, at = columns, channels
    v, cols, _ = _load_rows(V, rows, bh, svb, svh, svs, svd, HK, SK, D)
    vs = tl.load(VSCALE + bh * D + cols)
    y = v / vs[None, :]
    tl.store(VT8 + (bh * D + at[None, :]) * SK_PAD + columns[:, None], y.to(tl.float8e4nv, fp_downcast_rounding="rtne"))


@triton.jit
def _quant_kv_kernel(K, K8, KS, K_MEAN, V, VT8, VSCALE, skb, skh, sks, skd, svb, svh, svs, svd, HK, SK, SK_PAD, n_n,
                     k_programs, D: tl.constexpr, BLOCK: tl.constexpr, TO_INT8: tl.constexpr, QMAX: tl.constexpr,
                     PERMUTE: tl.constexpr, PART: tl.constexpr, HEADS_INNER: tl.constexpr):
    """K (its mean subtracted, ``_quant_rows``) and V (``_quant_v_block``) quantized, a block per program.
    ``PART`` 0: both in one launch, K's blocks below ``k_programs`` (what ``quantize`` launches); 1: K only;
    2: V only, each compiled with that part's registers alone (``benchmarks/experiments/quantize_kernels.py``
    times the parts apart)."""
    pid = tl.program_id(0)
    if PART == 2:
        pid += k_programs  # V's programs follow K's, as in the one-launch grid
    heads = k_programs // n_n
    if PART == 1 or (PART == 0 and pid < k_programs):
        blk, bh = _block_and_head(pid, n_n, heads, HEADS_INNER)
        _quant_rows(K, K8, KS, K_MEAN, KS, blk, bh, skb, skh, sks, skd, HK, SK, SK_PAD, n_n, 1.0,
                    D, BLOCK, True, TO_INT8, QMAX, False)
    else:
        _quant_v_block(V, VT8, VSCALE, pid - k_programs, n_n, svb, svh, svs, svd, HK, SK, SK_PAD, D, BLOCK,
                       PERMUTE, HEADS_INNER, heads)


@triton.jit
def _attend_block(acc, l_i, m_i, q, c_q, K, V, KS, j, b, hk, k_base, v_base, ks_base, sks, skd, svs, svd, S_K,
                  offs_n, offs_d, D: tl.constexpr,
                  BLOCK_N: tl.constexpr, LOG2_P_SCALE: tl.constexpr, TMA: tl.constexpr, MASK: tl.constexpr,
                  QUANT: tl.constexpr, INT_QK: tl.constexpr):
    """One key block into the running softmax (m_i is the row max in log2 units).

    Quantized: K and V come from the padded INT8/FP8 copies (V transposed), the score scale is the
    product of the blocks' scales, and exp2 is shifted by log2 of P's FP8 scale so that P lands directly
    in [0, 448] (l_i carries the same factor). Plain (bf16/fp16): K and V are read through the host's
    strides and P is cast to their dtype. The scale is folded into one FMA with the row max; the tail
    mask (and, plain, the masked loads) only where ``MASK`` says the block may reach past the keys.
    Plain with TMA, K and V are 4-D descriptors over the host's [B, H, S, D] strides (rows past S come
    back as zeros, so no masked loads at all).
    INT8 products become float by the magic-number trick (one integer add: the exact value |i| < 2**22
    sits in the mantissa of 1.5 * 2**23) instead of a slower int-to-float conversion."""
    cols = j * BLOCK_N + offs_n
    if TMA and QUANT:
        k = K.load([k_base + j * BLOCK_N, 0])
    elif TMA:
        k = K.load([b, hk, j * BLOCK_N, 0]).reshape([BLOCK_N, D])
    elif QUANT or not MASK:
        k = tl.load(K + k_base + cols[:, None] * sks + offs_d[None, :] * skd)
    else:
        k = tl.load(K + k_base + cols[:, None] * sks + offs_d[None, :] * skd, mask=cols[:, None] < S_K, other=0.0)
    if QUANT:
        c = c_q * tl.load(KS + ks_base + j)  # > 0, so max(raw · c) = max(raw) · c
    else:
        c = c_q
    if INT_QK:
        raw = (tl.dot(q, tl.trans(k)) + 0x4B400000).to(tl.float32, bitcast=True)  # 12582912 + product
        offset = 12582912.0
    else:
        raw = tl.dot(q, tl.trans(k))
        offset = 0.0
    if MASK:
        raw = tl.where(cols[None, :] < S_K, raw, float("-inf"))
    m_new = tl.maximum(m_i, (tl.max(raw, axis=1) - offset) * c)
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(raw * c - (m_new + offset * c - LOG2_P_SCALE)[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if TMA and QUANT:
        v = tl.trans(V.load([v_base, j * BLOCK_N]))
    elif TMA:
        v = V.load([b, hk, j * BLOCK_N, 0]).reshape([BLOCK_N, D])
    elif QUANT or not MASK:
        v = tl.trans(tl.load(V + v_base + offs_d[:, None] * svd + cols[None, :] * svs))
    else:
        v = tl.trans(tl.load(V + v_base + offs_d[:, None] * svd + cols[None, :] * svs, mask=cols[None, :] < S_K,
                             other=0.0))
    if QUANT:
        pc = p.to(tl.float8e4nv, fp_downcast_rounding="rtne")
    elif TMA:
        pc = p.to(V.dtype)
    else:
        pc = p.to(V.dtype.element_ty)
    acc = tl.dot(pc, v, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def _attn_kernel(Q, K, V, QS, KS, VS, O, KV_INDEX, KV_COUNT, sqb, sqh, sqs, sqd, skb, skh, sks, skd,
                 svb, svh, svs, svd, sob, soh, sos, sod, H, H_KV, S_Q, S_K, SQ_PAD, SK_PAD, n_m, n_n, max_list,
                 c_plain, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPARSE: tl.constexpr,
                 TMA: tl.constexpr, EVEN_K: tl.constexpr, QUANT: tl.constexpr, INT_QK: tl.constexpr,
                 WARP_SPECIALIZE: tl.constexpr):
    # Quantized, Q / K / V are the padded copies ([B·H, S_PAD, D], V as [B·H, D, S_PAD]) as pointers or,
    # with TMA, 2-D tensor descriptors loaded by Hopper's bulk tensor copy engine. Plain, they are the
    # host's tensors, read through their strides.
    # Every visited block but the last is a whole block of real keys (lists ascend, so the partial tail
    # block can only come last): the loop runs unmasked and the last block is attended apart, masked.
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // (H // H_KV)
    bhk = b * H_KV + hk
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    if QUANT:
        LOG2_P_SCALE: tl.constexpr = 8.807354922057604  # log2(448): P in [0, 448] for the FP8 cast
        c_q = tl.load(QS + bh * n_m + pid_m)
        ks_base = bhk * n_n
        if TMA:
            q = Q.load([bh * SQ_PAD + pid_m * BLOCK_M, 0])
            k_base = bhk * SK_PAD
            v_base = bhk * D
        else:
            q = tl.load(Q + (bh * SQ_PAD + offs_m[:, None]) * D + offs_d[None, :])
            k_base = bhk * SK_PAD * D
            v_base = k_base
    else:
        LOG2_P_SCALE: tl.constexpr = 0.0
        c_q = c_plain
        ks_base = 0
        if TMA:
            q = Q.load([b, h, pid_m * BLOCK_M, 0]).reshape([BLOCK_M, D])
        else:
            q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :] * sqd,
                        mask=offs_m[:, None] < S_Q, other=0.0)
        k_base = b * skb + hk * skh
        v_base = b * svb + hk * svh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    if SPARSE:
        count = tl.load(KV_COUNT + bh * n_m + pid_m)
        row = KV_INDEX + (bh * n_m + pid_m) * max_list
    else:
        count = n_n
        row = KV_INDEX
    if SPARSE:
        j = tl.load(row)  # every row has at least one slot; an empty row never uses it
    else:
        j = 0
    for i in tl.range(0, count - 1, warp_specialize=WARP_SPECIALIZE):
        if SPARSE:
            j_next = tl.load(row + i + 1)  # fetched one block ahead, so its latency hides behind this block
        else:
            j_next = i + 1
        acc, l_i, m_i = _attend_block(acc, l_i, m_i, q, c_q, K, V, KS, j, b, hk, k_base, v_base, ks_base, sks, skd,
                                      svs, svd, S_K, offs_n, offs_d, D, BLOCK_N, LOG2_P_SCALE, TMA, False, QUANT, INT_QK)
        j = j_next
    if count > 0:
        acc, l_i, m_i = _attend_block(acc, l_i, m_i, q, c_q, K, V, KS, j, b, hk, k_base, v_base, ks_base, sks, skd,
                                      svs, svd, S_K, offs_n, offs_d, D, BLOCK_N, LOG2_P_SCALE, TMA, not EVEN_K, QUANT,
                                      INT_QK)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_safe[:, None]
    if QUANT:
        out = out * tl.load(VS + bhk * D + offs_d)[None, :]  # acc and l_i both carry P's scale
    o_ptrs = O + b * sob + h * soh + offs_m[:, None] * sos + offs_d[None, :] * sod
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=offs_m[:, None] < S_Q)


@dataclass(frozen=True)
class KernelConfig:
    block_m: int = 128
    block_n: int = 128
    num_warps: int = 8
    num_stages: int = 3
    tma: bool = False  # load Q/K/V tiles through tensor descriptors (Hopper's bulk copy engine)
    # Triton's automatic warp specialization of the key loop (producer warps issue the loads, consumer
    # warps the math, as FlashAttention-3 does by hand); a compiler pass for Hopper and Blackwell
    warp_specialize: bool = False


def default_config(head_dim: int, device_type: str, qk: str = "fp8", block: int | None = None,
                   tensors: tuple[torch.Tensor, ...] = ()) -> KernelConfig:
    """Tile configuration per mode and head dim, from the H200 sweeps (benchmarks/results/2026-12-02-h200).

    ``block``: square tiles of this size (the block size of a sparse selection's lists). ``tensors``: the
    call's Q, K, V; plain mode reads them through descriptors only where ``descriptor_ready`` says so."""
    if device_type != "cuda":
        b = block or 32
        return KernelConfig(b, b, 4, 1)  # interpreter: small tiles keep CPU tests quick
    # plain mode reads the host's tensors through descriptors where they allow it: 43.5 against 44.8 ms
    # at Wan-14B, 14.4 against 14.7 at LTX (benchmarks/results/2026-12-02-h200-s3). FP8 at head dim 64
    # loads its own copies through descriptors: 11.5-12.0 ms at LTX in four runs, 12.3-12.8 without.
    if qk == "plain":
        tma = bool(tensors) and descriptor_ready(*tensors)
    else:
        tma = qk == "fp8" and head_dim < 128
    if block is not None:
        warps = 8 if head_dim >= 128 and block >= 128 and qk != "fp8" else 4
        return KernelConfig(block, block, warps, 3, tma=tma)
    if qk == "plain":
        return KernelConfig(128, 128, 8 if head_dim >= 128 else 4, 3, tma=tma)
    if qk == "fp8":
        # fastest in four of five runs at Wan-14B (27.1-28.2 ms); once 47.8 ms: the one unsteady config
        return KernelConfig(128, 128, 4, 3, tma=tma)
    if head_dim < 128:
        return KernelConfig(128, 128, 4, 3)  # int8 at LTX: 12.6 ms in two runs (64-row tiles 13.6)
    # int8 at head dim 128 with 128 x 128 tiles and four warps: 29.6 ms before the magic-number conversion,
    # 46.6, 48.8 and 49.0 ms in the three runs after it (64 x 128 tiles: 29.3-29.7 ms), so 64-row tiles
    return KernelConfig(64, 128, 4, 3)


@dataclass(frozen=True)
class Quantized:
    """The 8-bit copies one call's kernel reads, and how they were made (``settings``)."""

    q: torch.Tensor
    q_scale: torch.Tensor
    k: torch.Tensor
    k_scale: torch.Tensor
    vt: torch.Tensor
    v_scale: torch.Tensor
    sq_pad: int
    sk_pad: int
    qk: str = "fp8"
    scale: float = 1.0
    block_m: int = 128  # query rows per Q scale (and per row of ``q_sums``)
    block_n: int = 128  # key rows per K scale (and per row of ``k_sums``)
    permuted_v: bool = False  # V's keys and channels in the Hopper schedule's orders (``_quant_v_block``)
    k_sums: torch.Tensor | None = None  # float32 [B, HK, n_n, D]: each key block's column sums (before smoothing)
    q_sums: torch.Tensor | None = None  # float32 [B, H, n_m, D] where asked for (``quantize(sums=True)``)
    # recorded on ``quantize``'s ``kv_stream`` after K's and V's copies: what a launch reading them waits for (``ready``)
    kv_done: torch.cuda.Event | None = None

    def ready(self) -> None:
        """Make the current stream wait for K's and V's copies where another stream made them (``kv_stream``)."""
        if self.kv_done is not None:
            torch.cuda.current_stream(self.k.device).wait_event(self.kv_done)

    @property
    def settings(self) -> tuple[str, float, int, int, bool]:
        """(qk, scale, block_m, block_n, V permuted): what a launch must share to read these copies."""
        return self.qk, self.scale, self.block_m, self.block_n, self.permuted_v

    def tile_means(self, rows: int, seq_q: int, seq_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 means of Q per ``rows`` query rows ([B, H, n, D]) and of K per ``block_n`` keys ([B, HK, n_n, D]),
        the partial last tiles by their real row counts: the selector's pooled tiles, from the sums this
        quantization wrote while it read Q and K anyway. ``rows`` must be a multiple of ``block_m``."""
        if self.q_sums is None or self.k_sums is None:
            raise ValueError("these copies were made without the sums (quantize(..., sums=True))")
        if rows % self.block_m:
            raise ValueError(f"query tiles of {rows} rows are not whole blocks of {self.block_m}")
        from .tile_select import means_from_sums

        return means_from_sums(self.q_sums, self.block_m, rows, seq_q, self.k_sums, self.block_n, seq_k)


# warps per program of ``_first_pass_kernel``. H200, quantize_kernels.py (results 2026-12-04-h200-s14, call c): 0.116 /
# 0.131 / 0.197 ms at 2 / 4 / 8 warps at LTX's 32 x 27588 x 64, 0.328 / 0.344 / 0.505 at Wan-14B's 40 x 32760 x 128
FIRST_PASS_WARPS = 2


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def quantize(q, k, v, qk: str, scale: float, cfg: KernelConfig, buffers=None, permute_v: bool = False,
             sums: bool = False, kv_stream: torch.cuda.Stream | None = None, heads_inner: bool = True) -> Quantized:
    """Three launches: Q quantized beside one pass
    over K and V for K's column sums (its mean) and V's channel absmax; K's mean and V's scales from those;
    K and V quantized. ``permute_v``: V's keys in the Hopper schedule's P order and its channels in that
    schedule's output order (see ``_quant_v_block``). ``sums``: Q's column sums per query block as well, written by
    the pass that quantizes Q (``Quantized.tile_means``: the selector's pooled tiles without
    reading Q and K again). ``kv_stream``: the last launch (K and V) goes there, after the first two, so that what
    the caller does next on its own stream (the selection) can run beside it; whatever reads the copies waits for
    them first (``Quantized.ready``). ``heads_inner``: the passes' programs in the order of ``_block_and_head``
    (the same copies either way; faster by default, see there)."""
    B, H, SQ, D = q.shape
    HK, SK = k.shape[1], k.shape[2]
    n_m, n_n = _cdiv(SQ, cfg.block_m), _cdiv(SK, cfg.block_n)
    sq_pad, sk_pad = n_m * cfg.block_m, n_n * cfg.block_n
    qk_dtype = torch.int8 if qk == "int8" else torch.float8_e4m3fn
    qmax = INT8_MAX if qk == "int8" else FP8_MAX
    get = buffers or (lambda shape, dtype, name: torch.empty(shape, dtype=dtype, device=q.device))
    q8 = get((B * H, sq_pad, D), qk_dtype, "q")
    k8 = get((B * HK, sk_pad, D), qk_dtype, "k")
    vt8 = get((B * HK, D, sk_pad), torch.float8_e4m3fn, "vt")
    qs = torch.empty((B * H, n_m), dtype=torch.float32, device=q.device)
    ks = torch.empty((B * HK, n_n), dtype=torch.float32, device=q.device)
    k_sums = torch.empty((B, HK, n_n, D), dtype=torch.float32, device=q.device)
    v_max = torch.empty((B, HK, n_n, D), dtype=torch.float32, device=q.device)
    q_sums = torch.empty((B, H, n_m, D), dtype=torch.float32, device=q.device) if sums else qs
    k_mean = torch.empty((B * HK, D), dtype=torch.float32, device=q.device)
    v_scale = torch.empty((B * HK, D), dtype=torch.float32, device=q.device)
    to_int8 = qk == "int8"
    q_programs, kv_programs = n_m * B * H, n_n * B * HK
    _first_pass_kernel[(q_programs + kv_programs,)](
        q, q8, qs, q_sums, k, v, k_sums, v_max, *q.stride(), *k.stride(), *v.stride(), H, HK, SQ, SK, sq_pad, n_m, n_n,
        q_programs, scale * LOG2E, D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, TO_INT8=to_int8, QMAX=qmax,
        HAS_SUMS=sums, HEADS_INNER=heads_inner, num_warps=FIRST_PASS_WARPS)
    cols = min(32, D)
    _kv_scales_kernel[(B * HK, D // cols)](k_sums, v_max, k_mean, v_scale, n_n, SK, D=D, COLS=cols,
                                           CHUNK=min(256, triton.next_power_of_2(n_n)))
    kv = (k, k8, ks, k_mean, v, vt8, v_scale, *k.stride(), *v.stride(), HK, SK, sk_pad, n_n, kv_programs)
    flags = dict(D=D, BLOCK=cfg.block_n, TO_INT8=to_int8, QMAX=qmax, PERMUTE=permute_v, HEADS_INNER=heads_inner)
    # K and V in one launch of four warps at both head dims. H200, quantize_kernels.py: with V's columns written in
    # order (``_quant_v_block``; results 2026-12-04-h200-s14, call a) 0.091 ms at LTX's 32 x 27588 x 64 and 0.245
    # at Wan-14B's 40 x 32760 x 128, where K and V in two launches took 0.126 + 0.127 (V at eight warps 0.140).
    # Before it (results s13, e-parts), V's byte-wise stores had wanted eight warps at Wan-14B (0.172 against 0.308)
    # and two launches
    kv_done = None
    if kv_stream is None:
        _quant_kv_kernel[(2 * kv_programs,)](*kv, **flags, PART=0)
    else:
        kv_stream.wait_stream(torch.cuda.current_stream(q.device))
        with torch.cuda.stream(kv_stream):
            _quant_kv_kernel[(2 * kv_programs,)](*kv, **flags, PART=0)
        for t in (k, v, k8, ks, k_mean, vt8, v_scale):  # not handed to another allocation before the launch is done
            t.record_stream(kv_stream)
        kv_done = torch.cuda.Event()
        kv_done.record(kv_stream)
    return Quantized(q8, qs, k8, ks, vt8, v_scale, sq_pad, sk_pad, qk, float(scale), cfg.block_m, cfg.block_n,
                     permute_v, k_sums, q_sums if sums else None, kv_done)


QK_MODES = ("fp8", "int8", "plain")


def checked_prepared(prepared: Quantized | None, qk: str, scale: float, block_m: int, block_n: int,
                     permuted_v: bool) -> Quantized | None:
    """``prepared`` if it is what this launch would quantize itself; a mismatch is the caller's bug, refused. The
    current stream then waits for the copies where another stream made K's and V's (``Quantized.ready``): every
    launch that reads prepared copies takes them through here."""
    needed = (qk, scale, block_m, block_n, permuted_v)
    if prepared is not None and prepared.settings != needed:
        raise ValueError(f"prepared copies were made for {prepared.settings}, this launch needs {needed} (qk, scale, "
                         "block_m, block_n, V permuted)")
    if prepared is not None:
        prepared.ready()  # where K and V were quantized on another stream (``quantize``'s kv_stream)
    return prepared


def descriptor_ready(*tensors: torch.Tensor) -> bool:
    """Whether Hopper's bulk tensor copy can read these [B, H, S, D] tensors in place: the head dim
    innermost and contiguous, the base and every other stride a multiple of 16 bytes."""
    for t in tensors:
        size = t.element_size()
        if t.stride(3) != 1 or t.data_ptr() % 16 or any((st * size) % 16 for st in t.stride()[:3]):
            return False
    return True


def _host_descriptor(t: torch.Tensor, rows: int):
    """A 4-D descriptor over the host's own strides; a tile is ``rows`` sequence positions of one head."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, t.shape[3]])


def quant_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, qk: str = "fp8",
                    scale: float | None = None, kv_index: torch.Tensor | None = None,
                    kv_count: torch.Tensor | None = None, config: KernelConfig | None = None,
                    buffers=None, out: torch.Tensor | None = None, prepared: Quantized | None = None) -> torch.Tensor:
    """Non-causal attention over B, H, S, D tensors (any strides).

    qk: "fp8" (FP8 Q·Kᵀ, FP8 P·V), "int8" (INT8 Q·Kᵀ, FP8 P·V), or "plain" (no quantization: the
    host's bf16/fp16 tensors read in place through their strides, P in the same dtype, FP32
    accumulation: the same block-sparse loop at the host's precision). kv_index: int32 [B, H,
    ceil(Sq / block_m), L] key-block ids per query block, each row's first kv_count entries ascending;
    kv_count: int32 [B, H, ceil(Sq / block_m)] how many to visit. Both or neither. prepared: this call's
    quantized copies, made already (``quantize`` with ``config``'s blocks, as the sparse forms do while
    the selector pools); checked to match, never remade.
    """
    if qk not in QK_MODES:
        raise ValueError(f"qk must be one of {QK_MODES}, not {qk!r}")
    if (kv_index is None) != (kv_count is None):
        raise ValueError("kv_index and kv_count go together")
    B, H, SQ, D = q.shape
    HK, SK = k.shape[1], k.shape[2]
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"inputs must be bfloat16 or float16 alike, not {q.dtype}, {k.dtype}, {v.dtype}")
    if H % HK:
        raise ValueError(f"{H} query heads are not a multiple of {HK} key/value heads")
    if D not in (64, 128) or v.shape[3] != D or k.shape[3] != D:
        raise ValueError(f"head dims must be 64 or 128 and equal, got q {D}, k {k.shape[3]}, v {v.shape[3]}")
    cfg = config or default_config(D, q.device.type, qk, tensors=(q, k, v))
    quant = qk != "plain"
    if cfg.tma and not quant and not descriptor_ready(q, k, v):
        raise ValueError("tensor-descriptor loads need 16-byte aligned tensors and strides, head dim innermost")
    scale = D ** -0.5 if scale is None else float(scale)
    n_m, n_n = _cdiv(SQ, cfg.block_m), _cdiv(SK, cfg.block_n)
    if out is None:
        out = torch.empty((B, SQ, H, D), dtype=q.dtype, device=q.device).transpose(1, 2)  # B, S, H, D storage
    elif out.shape != q.shape or out.dtype != q.dtype:
        raise ValueError(f"out must be {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)} {out.dtype}")
    sparse = kv_index is not None
    if sparse:
        if kv_index.shape[:3] != (B, H, n_m) or kv_count.shape != (B, H, n_m):
            raise ValueError(f"kv_index must be [B, H, {n_m}, L] and kv_count [B, H, {n_m}] for block_m "
                             f"{cfg.block_m}; got {tuple(kv_index.shape)} and {tuple(kv_count.shape)}")
        if kv_index.shape[3] == 0:
            raise ValueError("kv_index needs at least one slot per row (kv_count may still be 0)")
        kv_index = kv_index.to(torch.int32).contiguous()
        kv_count = kv_count.to(torch.int32).contiguous()
        max_list = kv_index.shape[3]
    if quant:
        qz = checked_prepared(prepared, qk, scale, cfg.block_m, cfg.block_n, False) or quantize(q, k, v, qk, scale,
                                                                                              cfg, buffers)
        q_arg, k_arg, v_arg = qz.q, qz.k, qz.vt
        scales = (qz.q_scale, qz.k_scale, qz.v_scale)
        pads = (qz.sq_pad, qz.sk_pad)
        # the padded copies as plain strides: K [B·H, S_PAD, D]; V transposed, so V[s, d] sits at d·S_PAD + s
        strides = (0, 0, 0, 0) + (0, 0, D, 1) + (0, 0, 1, qz.sk_pad)
        if cfg.tma:
            from triton.tools.tensor_descriptor import TensorDescriptor

            q_arg = TensorDescriptor.from_tensor(qz.q.view(-1, D), [cfg.block_m, D])
            k_arg = TensorDescriptor.from_tensor(qz.k.view(-1, D), [cfg.block_n, D])
            v_arg = TensorDescriptor.from_tensor(qz.vt.view(-1, qz.sk_pad), [D, cfg.block_n])
    else:
        q_arg, k_arg, v_arg = q, k, v
        if cfg.tma:
            q_arg = _host_descriptor(q, cfg.block_m)
            k_arg, v_arg = _host_descriptor(k, cfg.block_n), _host_descriptor(v, cfg.block_n)
        scales = (out, out, out)  # unused placeholders
        pads = (n_m * cfg.block_m, n_n * cfg.block_n)
        strides = (*q.stride(), *k.stride(), *v.stride())
    if not sparse:
        kv_index = kv_count = scales[0]  # unused placeholders
        max_list = 0
    _attn_kernel[(n_m, B * H)](
        q_arg, k_arg, v_arg, *scales, out, kv_index, kv_count, *strides, *out.stride(),
        H, HK, SQ, SK, *pads, n_m, n_n, max_list, scale * LOG2E,
        D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SPARSE=sparse, TMA=cfg.tma,
        EVEN_K=SK % cfg.block_n == 0, QUANT=quant, INT_QK=qk == "int8", WARP_SPECIALIZE=cfg.warp_specialize,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out
