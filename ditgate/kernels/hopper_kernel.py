"""The Hopper schedule's kernel in Gluon: one load partition and two or three consumer warpgroups per program.

The load partition issues every copy through the bulk tensor copy engine (TMA) into a ring of shared-memory stages
guarded by mbarriers; each consumer warpgroup runs 64 query rows against every listed key block. In each step a
consumer issues block i's Q·Kᵀ and block i-1's P·V together, rescaling the output for block i-1 between the two
issues, under Q·Kᵀ, as FlashAttention-3 does (``_overlapped_step``), so that its softmax of block i can run while
P·V is on the tensor cores, and one warpgroup's softmax falls under another's products. Launched by
``hopper_attention.plan_launch``; the softmax's arithmetic is ``hopper_softmax``'s.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .hopper_config import BLOCK_K, HALF, q_slots
from .hopper_softmax import _carried, _operand, _rescaled, _scaled_output, _softmax_step


@gluon.constexpr_function
def _mma_layout(bits, n):
    """Hopper's warpgroup accumulator layout for a 64 x n tile (four warps, 16 rows each)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 256 // bits])


@gluon.jit
def _produce(loads, STAGES: gl.constexpr, SPARSE: gl.constexpr, QUANT: gl.constexpr, GROUPS: gl.constexpr):
    """The load partition: Q once (64 rows per consumer warpgroup) and, in the quantized modes (whose row sums are
    the tensor cores'), the tile of ones they multiply P by; then each listed key block's K and V into the next free
    stage. A list's next index is loaded before the wait for a free stage, not after it, so that its latency does
    not delay the copy into that stage. Q's copies are issued before the list's count is read (``_list_start``)."""
    (q_desc, k_desc, v_desc, ones_desc, q_smem, k_bufs, v_bufs, ones_smem, q_ready, kv_ready, kv_empty, row, counts,
     n_n, max_list, q_row, q_col, k_row, k_col, v_row, v_col) = loads
    if QUANT:
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
        if QUANT:  # our copy of V, transposed
            tma.async_copy_global_to_shared(v_desc, [v_row, v_col + j * BLOCK_K], bar, v_bufs.index(st))
        else:
            tma.async_copy_global_to_shared(v_desc, [v_row + j * BLOCK_K, v_col], bar, v_bufs.index(st))


@gluon.jit
def _ahead(row, KS, ks_base, i, count, j_next, SPARSE: gl.constexpr, QUANT: gl.constexpr):
    """What step i fetches for the steps after it, so that no step waits on memory: block i+1's K scale
    (its index was fetched by step i-1) and block i+2's index (clamped to the list). Read at its use,
    the K scale was a load from memory in the middle of every quantized step."""
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


@gluon.jit
def _hold(x):
    """An empty asm that reads ``x``: its registers stay x's until here. An in-flight product reads its
    register operand (P) asynchronously; once P is dead to the compiler, ptxas may hand its registers to
    the next softmax and must then wait for the product first, which undoes the overlap (it did)."""
    return gl.inline_asm_elementwise("", "=r,0", [x], dtype=x.dtype, is_pure=False,
                                     pack=32 // x.dtype.primitive_bitwidth)


@gluon.jit
def _v_operand(v_bufs, st, QUANT: gl.constexpr):
    if QUANT:  # our copy of V is stored transposed, K-major as the FP8 product wants it
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
def _sum_product(pv, ones_smem, lacc):
    """P·1 for P's row sums (the quantized modes), issued: a fresh 64 x 8 accumulator, every column the block's
    sum."""
    return warpgroup_mma(pv, ones_smem.permute((1, 0)), gl.zeros_like(lacc), use_acc=False, is_async=True)


@gluon.jit
def _overlapped_step(q_part, k_bufs, v_bufs, kv_ready, kv_empty, row, i, count, j, ksc, j_next, acc, carried, alpha,
                     m_i, l_i, c_q, KS, ks_base, n_n, S_K, s_zero, o_layout: gl.constexpr, STAGES: gl.constexpr,
                     SPARSE: gl.constexpr, MASK: gl.constexpr, QUANT: gl.constexpr, INT_QK: gl.constexpr, sums,
                     PIN: gl.constexpr, lacc, ones_smem, TREE_MAX: gl.constexpr, LAZY: gl.constexpr,
                     INT_MAX: gl.constexpr):
    """Block i's Q·Kᵀ and block i-1's P·V (from ``carried``) issued together, the output rescaled for block i-1
    between them. The new P (fp32; the wait takes no 8-bit values) and row sum go through the P·V wait as its
    dependencies, which keeps Triton from sinking the softmax below the wait (it did: every exp2 came after it).
    ptxas still places that wait right after the row max, before the first exp2, so the overlap that remains is
    between the warpgroups. PIN: the row sums are stored to ``sums`` (shared memory nobody reads) before the P·V
    wait. The sums need every exp2, and ptxas keeps the wait below a shared-memory store, so the exp2s run under
    P·V (``hopper_compile --pin`` shows where the wait lands)."""
    ks_next, j_after = _ahead(row, KS, ks_base, i, count, j_next, SPARSE, QUANT)
    st = i % STAGES
    prev = (i - 1) % STAGES
    pd = _operand(carried, QUANT)
    mbarrier.wait(kv_ready.index(st), (i // STAGES) & 1)
    s_tok = warpgroup_mma(q_part, k_bufs.index(st).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    acc = _scaled_output(acc, alpha, LAZY)
    if QUANT:
        lacc = _rescaled(lacc, alpha)
    o_tok = warpgroup_mma(pd, _v_operand(v_bufs, prev, QUANT), acc, is_async=True)
    if QUANT:
        l_tok = _sum_product(pd, ones_smem, lacc)
        s = warpgroup_mma_wait(num_outstanding=2, deps=(s_tok,))
    else:
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
    p, m_i, l_i, alpha = _softmax_step(s, j, m_i, l_i, c_q * ksc, n_n, S_K, MASK, QUANT, INT_QK, TREE_MAX, LAZY,
                                       INT_MAX)
    if PIN:
        sums.store(l_i)
    if QUANT:
        acc, lstep, p = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, l_tok, p))
        lacc = lacc + lstep
    else:
        acc, p, l_i = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p, l_i))
    _hold(pd)
    mbarrier.arrive(kv_empty.index(prev), count=1)
    return acc, lacc, _carried(p, v_bufs.dtype, o_layout, QUANT), alpha, m_i, l_i, j_next, ks_next, j_after


@gluon.jit
def _consume(shared, PART: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, SPARSE: gl.constexpr,
             EVEN_K: gl.constexpr, QUANT: gl.constexpr, INT_QK: gl.constexpr, PIN: gl.constexpr,
             TREE_MAX: gl.constexpr, LAZY: gl.constexpr, INT_MAX: gl.constexpr, O_ALIGNED: gl.constexpr,
             GATHER_O: gl.constexpr):
    """A math partition: 64 query rows against every listed key block, then the normalized store.
    ``shared``: what every math partition takes alike (see ``_hopper_attn_kernel``).

    The first block's softmax runs alone, then ``_overlapped_step`` per block; the last visited block is stepped
    apart, the only one that may need the tail mask. Each step carries the block index and K scale of the next
    (``_ahead``). Quantized, P's row sums come from the tensor cores, as P times a tile of ones (64 x 8, every column
    the sum) issued with each P·V, instead of from 62 adds and 4 shuffles per thread and step. Each block's sum
    starts from zero and is added to the running one (``lacc``) in fp32 registers: accumulated across blocks inside
    the 8-bit product, the running sum lost precision (the cosine to exact attention fell by 4e-4; Hopper's FP8
    products keep about 14 bits of their sums, as DeepSeek-V3's report measured)."""
    (q_smem, k_bufs, v_bufs, q_ready, kv_ready, kv_empty, row, counts, max_list, O, QS, KS, VS, c_plain, o_base,
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
    if count > 0:
        ks_next, j_after = _ahead(row, KS, ks_base, 0, count, j_next, SPARSE, QUANT)
        mbarrier.wait(kv_ready.index(0), 0)
        s = warpgroup_mma(q_part, k_bufs.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        p, m_i, l_i, alpha = _softmax_step(s, j, m_i, l_i, c_q * ksc, n_n, S_K, not EVEN_K, QUANT, INT_QK, TREE_MAX,
                                           LAZY, INT_MAX)
        carried = _carried(p, pv_dtype, o_layout, QUANT)
        j, ksc, j_next = j_next, ks_next, j_after
        for i in range(1, count - 1):
            acc, lacc, carried, alpha, m_i, l_i, j, ksc, j_next = _overlapped_step(
                q_part, k_bufs, v_bufs, kv_ready, kv_empty, row, i, count, j, ksc, j_next, acc, carried, alpha, m_i,
                l_i, c_q, KS, ks_base, n_n, S_K, s_zero, o_layout, STAGES, SPARSE, False, QUANT, INT_QK, sums, PIN,
                lacc, ones_smem, TREE_MAX, LAZY, INT_MAX)
        if count > 1:
            acc, lacc, carried, alpha, m_i, l_i, j, ksc, j_next = _overlapped_step(
                q_part, k_bufs, v_bufs, kv_ready, kv_empty, row, count - 1, count, j, ksc, j_next, acc, carried,
                alpha, m_i, l_i, c_q, KS, ks_base, n_n, S_K, s_zero, o_layout, STAGES, SPARSE, not EVEN_K, QUANT,
                INT_QK, sums, PIN, lacc, ones_smem, TREE_MAX, LAZY, INT_MAX)
        last = (count - 1) % STAGES
        acc = _scaled_output(acc, alpha, LAZY)
        if QUANT:
            lacc = _rescaled(lacc, alpha)
        pv = _operand(carried, QUANT)
        acc = warpgroup_mma(pv, _v_operand(v_bufs, last, QUANT), acc, is_async=True)
        if QUANT:
            lstep = _sum_product(pv, ones_smem, lacc)
            acc, lstep = warpgroup_mma_wait(num_outstanding=0, deps=(acc, lstep))
            lacc = lacc + lstep
        else:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(kv_empty.index(last), count=1)
    if QUANT:
        l_i = gl.convert_layout(gl.max(lacc, axis=1), gl.SliceLayout(1, s_layout))  # every column holds the sum
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    out = acc / gl.where(l_o > 0, l_o, 1.0)[:, None]
    if QUANT:  # our copy of V, its channels in the order the accumulator stores them in
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
    (``quantize(permute_v=True)``, ``quant_passes._output_channel``): the accumulator's column
    32a + 8b + 2c + e holds channel 32a + 8c + 2b + e, so renaming registers (nothing moves) puts channels
    32a + 8c to 32a + 8c + 7 in thread c's registers in order, for one 16-byte store. In the accumulator's own
    order a thread holds pairs of channels eight apart, at most four bytes per store, and the stores were the
    programs' fixed cost (with empty lists, the L2 busy and DRAM nearly idle)."""
    M: gl.constexpr = x.shape[0]
    N: gl.constexpr = x.shape[1]
    y = gl.reshape(gl.permute(gl.reshape(x, [M, N // 32, 4, 4, 2]), (0, 1, 3, 2, 4)), [M, N])
    return gl.convert_layout(y, _stored_layout(M, N))


@gluon.jit
def _hopper_attn_kernel(q_desc, k_desc, v_desc, ones_desc, O, QS, KS, VS, KV_INDEX, KV_COUNT, sob, soh, sos, sod,
                        q_rb, q_rh, q_ch, k_rb, k_rh, k_ch, v_rb, v_rh, v_ch,
                        H, H_KV, S_Q, S_K, n_m, n_n, n_qs, max_list, c_plain,
                        D: gl.constexpr, STAGES: gl.constexpr, SPARSE: gl.constexpr, EVEN_K: gl.constexpr,
                        QUANT: gl.constexpr, INT_QK: gl.constexpr, GROUPS: gl.constexpr, PIN: gl.constexpr,
                        TREE_MAX: gl.constexpr, LAZY: gl.constexpr, INT_MAX: gl.constexpr, O_ALIGNED: gl.constexpr,
                        GATHER_O: gl.constexpr):
    # One program per (64·GROUPS-row query block, batch · head). A descriptor row is b·rb + h·rh + s, its first
    # column h·ch: the caller picks rb, rh, ch for the storage (see hopper_attention).
    pid_m = gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // (H // H_KV)
    bhk = b * H_KV + hk
    q_start = pid_m * HALF * GROUPS
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [q_slots(GROUPS), HALF, D], q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_K, D], k_desc.layout)
    if QUANT:
        v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, D, BLOCK_K], v_desc.layout)
    else:
        v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_K, D], v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [GROUPS, 1], mbarrier.MBarrierLayout())
    sums = gl.allocate_shared_memory(gl.float32, [GROUPS, HALF], gl.SwizzledSharedLayout(1, 1, 1, [0]))  # PIN
    if QUANT:
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
    shared = (q_smem, k_bufs, v_bufs, q_ready, kv_ready, kv_empty, row, counts, max_list, O, QS, KS, VS, c_plain,
              o_base, sos, sod, q_start, S_Q, S_K, n_n, qs_index, qs_left, ks_base, vs_base, sums, ones_smem)
    if GROUPS == 3:
        gl.warp_specialize([
            (_produce, (produce, STAGES, SPARSE, QUANT, GROUPS)),
            (_consume, (shared, 0, D, STAGES, SPARSE, EVEN_K, QUANT, INT_QK, PIN, TREE_MAX, LAZY, INT_MAX, O_ALIGNED,
                        GATHER_O)),
            (_consume, (shared, 1, D, STAGES, SPARSE, EVEN_K, QUANT, INT_QK, PIN, TREE_MAX, LAZY, INT_MAX, O_ALIGNED,
                        GATHER_O)),
            (_consume, (shared, 2, D, STAGES, SPARSE, EVEN_K, QUANT, INT_QK, PIN, TREE_MAX, LAZY, INT_MAX, O_ALIGNED,
                        GATHER_O)),
        ], [4, 4, 4], [160, 160, 160])
    else:
        gl.warp_specialize([
            (_produce, (produce, STAGES, SPARSE, QUANT, GROUPS)),
            (_consume, (shared, 0, D, STAGES, SPARSE, EVEN_K, QUANT, INT_QK, PIN, TREE_MAX, LAZY, INT_MAX, O_ALIGNED,
                        GATHER_O)),
            (_consume, (shared, 1, D, STAGES, SPARSE, EVEN_K, QUANT, INT_QK, PIN, TREE_MAX, LAZY, INT_MAX, O_ALIGNED,
                        GATHER_O)),
        ], [4, 4], [240, 240])
