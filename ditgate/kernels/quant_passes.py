"""The quantization passes of ditgate's 8-bit attention (``quant_attention``, ``hopper_attention``), in Triton.

SageAttention-style numerics:
- K is smoothed by subtracting its mean over the sequence (exact for softmax: it shifts every score of a
  query row by the same amount).
- Q and K are quantized per block of rows (BLOCK_M query rows, BLOCK_N key rows) to INT8 or FP8 e4m3
  with one absmax scale per block; ``sm_scale · log2(e)`` is folded into the Q scale so the softmax runs
  on ``exp2``.
- V is quantized per channel (absmax over the sequence) to FP8, for an FP8 P·V.

The passes read Q, K, V through their strides (B, H, S, D views of whatever the host gave; no copy), and write
FP8/INT8 copies padded to whole blocks, V transposed (B, H, D, S) so that P·V's second operand is K-major as Hopper's
FP8 matrix instructions want (for the Hopper schedule, ``permute_v``, with its keys and channels reordered as that
schedule's registers hold them). Those copies are the form's workspace (1 byte per element, no full-precision copy
is kept).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

if TYPE_CHECKING:
    from .quant_attention import KernelConfig

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
        mean = tl.where(tl.abs(mean) < float("inf"), mean, 0.0)  # any finite vector leaves attention exact
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
def _block_and_head(p, heads):
    """(row block, batch · head) of the ``p``-th program of a pass over ``heads`` heads: consecutive programs take
    the same block of consecutive heads, so that the programs running at once read whole token rows of diffusers'
    [B, S, H, D] storage (H · D contiguous elements per token), not one head's slice of each token's row."""
    return p // heads, p % heads


@triton.jit
def _first_pass_kernel(Q, Q8, QS, Q_SUMS, K, V, K_SUMS, V_MAX, sqb, sqh, sqs, sqd, skb, skh, sks, skd,
                       svb, svh, svs, svd, H, HK, SQ, SK, SQ_PAD, n_m, n_n, q_programs, mult,
                       D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TO_INT8: tl.constexpr,
                       QMAX: tl.constexpr, HAS_SUMS: tl.constexpr):
    """What needs nothing computed first, in one launch: programs below ``q_programs`` quantize a block of Q
    (``_quant_rows``, Q needs no mean); the rest read a block of K and V for K's column sums (its mean, and the
    selector's pooled key tiles) and V's column absmax (V's per-channel scale). Why: launches cost the host
    more than these passes cost the GPU at short sequences: with this kernel and ``_kv_scales_kernel``,
    ``quantize`` makes three launches where it made five and seven torch operations. More than one block of Q per
    program changed nothing."""
    pid = tl.program_id(0)
    if pid < q_programs:
        blk, bh = _block_and_head(pid, q_programs // n_m)
        _quant_rows(Q, Q8, QS, QS, Q_SUMS, blk, bh, sqb, sqh, sqs, sqd, H, SQ, SQ_PAD, n_m, mult,
                    D, BLOCK_M, False, TO_INT8, QMAX, HAS_SUMS)
    else:
        kv_programs = tl.num_programs(0) - q_programs
        blk, bh = _block_and_head(pid - q_programs, kv_programs // n_n)
        k, rows, cols, valid = _load_row_block(K, blk, bh, skb, skh, sks, skd, HK, SK, D, BLOCK_N)
        v, _, _, _ = _load_row_block(V, blk, bh, svb, svh, svs, svd, HK, SK, D, BLOCK_N)
        at = (bh * n_n + blk) * D + cols
        tl.store(K_SUMS + at, tl.sum(k, axis=0))
        tl.store(V_MAX + at, tl.max(tl.abs(v), axis=0))


@triton.jit
def _kv_scales_kernel(K_SUMS, V_MAX, STATS, n_stat, n_n, SK, D: tl.constexpr, COLS: tl.constexpr,
                      CHUNK: tl.constexpr):
    """One program per key/value head and ``COLS`` channels: K's mean over the sequence from its block sums,
    and V's per-channel scale (absmax / 448, at least 1e-20) from its block maxima; one launch where torch
    took seven. ``CHUNK`` blocks per step: every block in one step up to 256 blocks (32768 keys), so the
    program waits for one load, not one per 32 blocks."""
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
    tl.store(STATS + bh * D + cols, total / SK)  # K's mean, then (``n_stat`` further) V's scales
    tl.store(STATS + n_stat + bh * D + cols, tl.maximum(vmax / 448.0, 1e-20))


@triton.jit
def _output_channel(j):
    """The channel of V (and of the output) that the Hopper schedule's P·V accumulator holds in its column ``j``
    where V's copy was made for that schedule (``quantize(permute_v=True)``): column 32a + 8b + 2c + e holds
    channel 32a + 8c + 2b + e, so that the accumulator's thread c holds channels 32a + 8c to 32a + 8c + 7, eight
    neighbours, for each a (``hopper_kernel._ordered_output``). Its own inverse."""
    return (j & ~31) | (((j >> 1) & 3) << 3) | (((j >> 3) & 3) << 1) | (j & 1)


@triton.jit
def _quant_v_block(V, VT8, vs, p, svb, svh, svs, svd, HK, SK, SK_PAD, D: tl.constexpr, BLOCK: tl.constexpr,
                   PERMUTE: tl.constexpr, heads):
    """V's ``p``-th block (which block of which of ``heads`` heads: ``_block_and_head``) over the per-channel scales
    ``vs`` ([D], float32) to FP8, written transposed: VT8[b·h, d, s] (padded columns are zero); returns the block's
    channel absmax (what a pass at carried scales checks them against). PERMUTE: inside each group of 32 keys, key
    16h + 8a + 2t + b goes to column 16h + 4t + 2a + b, the order in which the Hopper schedule hands P to its P·V
    product (``hopper_softmax._reordered``). The permutation picks the rows each column is read from, so that the
    columns are written in order: permuted on the store side, the transposed store was one byte per instruction (64
    ``st.global.b8`` per thread in the PTX for sm_90, where K's rows take 4 ``st.global.v4``). With PERMUTE, channel
    d also goes to row ``_output_channel(d)``, the P·V accumulator's column that holds it in that schedule, so that
    its output leaves in 16-byte stores (``hopper_kernel._ordered_output``)."""
    blk, bh = _block_and_head(p, heads)
    columns = blk * BLOCK + tl.arange(0, BLOCK)  # key positions in VT8, written in order
    channels = tl.arange(0, D)
    if PERMUTE:  # column 16h + 4t + 2a + b gets key 16h + 8a + 2t + b; channel d goes to row _output_channel(d)
        rows = (columns & ~15) | (((columns >> 1) & 1) << 3) | (((columns >> 2) & 3) << 1) | (columns & 1)
        at = _output_channel(channels)
    else:
        rows, at = columns, channels
    v, cols, _ = _load_rows(V, rows, bh, svb, svh, svs, svd, HK, SK, D)
    y = v / vs[None, :]
    tl.store(VT8 + (bh * D + at[None, :]) * SK_PAD + columns[:, None], y.to(tl.float8e4nv, fp_downcast_rounding="rtne"))
    return tl.max(tl.abs(v), axis=0)


@triton.jit
def _quant_kv_kernel(K, K8, KS, STATS, V, VT8, n_stat, skb, skh, sks, skd, svb, svh, svs, svd, HK, SK, SK_PAD, n_n,
                     k_programs, D: tl.constexpr, BLOCK: tl.constexpr, TO_INT8: tl.constexpr, QMAX: tl.constexpr,
                     PERMUTE: tl.constexpr):
    """K (its mean subtracted, ``_quant_rows``) and V (``_quant_v_block``) quantized, a block per program, K's
    blocks below ``k_programs``: one launch of four warps at both head dims, faster than two (K's and V's) since V's
    columns are written in order (``_quant_v_block``)."""
    pid = tl.program_id(0)
    heads = k_programs // n_n
    if pid < k_programs:
        blk, bh = _block_and_head(pid, heads)
        _quant_rows(K, K8, KS, STATS, KS, blk, bh, skb, skh, sks, skd, HK, SK, SK_PAD, n_n, 1.0,
                    D, BLOCK, True, TO_INT8, QMAX, False)
    else:
        _, bh = _block_and_head(pid - k_programs, heads)
        vs = tl.load(STATS + n_stat + bh * D + tl.arange(0, D))
        _quant_v_block(V, VT8, vs, pid - k_programs, svb, svh, svs, svd, HK, SK, SK_PAD, D, BLOCK, PERMUTE, heads)


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


def check_statistics(name: str, stats: torch.Tensor, n_stat: int, device: torch.device) -> None:
    """A statistics buffer the kernels may write: ``2 * n_stat`` contiguous float32 elements on ``device``."""
    if stats.numel() != 2 * n_stat or stats.dtype != torch.float32 or stats.device != device \
            or not stats.is_contiguous():
        raise ValueError(f"{name} must be {2 * n_stat} contiguous float32 elements on {device} (statistics_size), got "
                         f"{stats.numel()} {stats.dtype} on {stats.device}")


# warps per program of ``_first_pass_kernel``: a block of rows is little work per program, and more warps per program
# only made it slower
FIRST_PASS_WARPS = 2


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


@dataclass(frozen=True)
class Outputs:
    """What one call's quantization writes (``quantize`` and ``quant_passes_carried.quantize_carried`` alike): the
    8-bit copies (from ``buffers`` where given), the per-block scales, K's and V's per-block column sums and maxima,
    and Q's column sums where asked for (else ``q_sums`` is ``q_scale``, an unused placeholder)."""

    n_m: int
    n_n: int
    sq_pad: int
    sk_pad: int
    qmax: float
    q: torch.Tensor
    k: torch.Tensor
    vt: torch.Tensor
    q_scale: torch.Tensor
    k_scale: torch.Tensor
    k_sums: torch.Tensor
    v_max: torch.Tensor
    q_sums: torch.Tensor


def workspace(buffers, device: torch.device):
    """``buffers(shape, dtype, name)`` where a form's workspace is given, else one that makes fresh tensors."""
    return buffers or (lambda shape, dtype, name: torch.empty(shape, dtype=dtype, device=device))


def outputs(q, k, qk: str, cfg: KernelConfig, buffers=None, sums: bool = False) -> Outputs:
    """The ``Outputs`` of quantizing B, H, S, D ``q`` and ``k`` (and V like K) in ``qk`` mode at ``cfg``'s blocks:
    copies and scratch alike from ``buffers`` where given (a form's workspace, whose copies live as long as a call's
    scales and sums do), fresh tensors otherwise: at image lengths a form's host time per call is what its kernels
    wait on, and each allocation is a part of it."""
    B, H, SQ, D = q.shape
    HK, SK = k.shape[1], k.shape[2]
    n_m, n_n = _cdiv(SQ, cfg.block_m), _cdiv(SK, cfg.block_n)
    sq_pad, sk_pad = n_m * cfg.block_m, n_n * cfg.block_n
    qk_dtype = torch.int8 if qk == "int8" else torch.float8_e4m3fn
    get = workspace(buffers, q.device)
    qs = get((B * H, n_m), torch.float32, "q_scale")
    f32 = torch.float32
    return Outputs(
        n_m, n_n, sq_pad, sk_pad, INT8_MAX if qk == "int8" else FP8_MAX,
        get((B * H, sq_pad, D), qk_dtype, "q"), get((B * HK, sk_pad, D), qk_dtype, "k"),
        get((B * HK, D, sk_pad), torch.float8_e4m3fn, "vt"), qs, get((B * HK, n_n), f32, "k_scale"),
        get((B, HK, n_n, D), f32, "k_sums"), get((B, HK, n_n, D), f32, "v_max"),
        get((B, H, n_m, D), f32, "q_sums") if sums else qs)


def launch_kv_scales(out: Outputs, statistics: torch.Tensor, n_stat: int, SK: int) -> None:
    """``_kv_scales_kernel`` over ``out``'s block sums and maxima into ``statistics`` (K's mean, then V's scales)."""
    BHK, D = out.k_scale.shape[0], out.k_sums.shape[3]
    cols = min(32, D)
    _kv_scales_kernel[(BHK, D // cols)](out.k_sums, out.v_max, statistics, n_stat, out.n_n, SK, D=D, COLS=cols,
                                        CHUNK=min(256, triton.next_power_of_2(out.n_n)))


def quantize(q, k, v, qk: str, scale: float, cfg: KernelConfig, buffers=None, permute_v: bool = False,
             sums: bool = False, statistics: torch.Tensor | None = None) -> Quantized:
    """Three launches: Q quantized beside one pass over K and V for K's column sums (its mean) and V's channel
    absmax; K's mean and V's scales from those; K and V quantized. ``cfg``: its ``block_m`` query rows per Q scale,
    ``block_n`` keys per K scale. ``permute_v``: V's keys in the Hopper schedule's P order and its channels in that
    schedule's output order (see ``_quant_v_block``). ``sums``: Q's column sums per query block as well, written by
    the pass that quantizes Q (``Quantized.tile_means``: the selector's pooled tiles without reading Q and K
    again). ``buffers(shape, dtype, name)``: where the copies go (a form's workspace); fresh tensors otherwise.
    ``statistics``: where K's mean and V's channel scales go (``quant_passes_carried.statistics_size`` float32
    elements, the buffer a site's next call carries them from); fresh tensors otherwise."""
    B, H, SQ, D = q.shape
    HK, SK = k.shape[1], k.shape[2]
    o = outputs(q, k, qk, cfg, buffers, sums)
    n_stat = B * HK * D  # statistics: K's mean, then V's channel scales, each [B * HK, D]
    if statistics is None:
        statistics = torch.empty(2 * n_stat, dtype=torch.float32, device=q.device)
    else:
        check_statistics("statistics", statistics, n_stat, q.device)
    to_int8 = qk == "int8"
    q_programs, kv_programs = o.n_m * B * H, o.n_n * B * HK
    _first_pass_kernel[(q_programs + kv_programs,)](
        q, o.q, o.q_scale, o.q_sums, k, v, o.k_sums, o.v_max, *q.stride(), *k.stride(), *v.stride(), H, HK, SQ, SK,
        o.sq_pad, o.n_m, o.n_n, q_programs, scale * LOG2E, D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        TO_INT8=to_int8, QMAX=o.qmax, HAS_SUMS=sums, num_warps=FIRST_PASS_WARPS)
    launch_kv_scales(o, statistics, n_stat, SK)
    kv = (k, o.k, o.k_scale, statistics, v, o.vt, n_stat, *k.stride(), *v.stride(), HK, SK, o.sk_pad, o.n_n,
          kv_programs)
    _quant_kv_kernel[(2 * kv_programs,)](*kv, D=D, BLOCK=cfg.block_n, TO_INT8=to_int8, QMAX=o.qmax,
                                         PERMUTE=permute_v, num_warps=4)
    return Quantized(o.q, o.q_scale, o.k, o.k_scale, o.vt, statistics[n_stat:].view(B * HK, D), o.sq_pad, o.sk_pad,
                     qk, float(scale), cfg.block_m, cfg.block_n, permute_v, o.k_sums, o.q_sums if sums else None)


def checked_prepared(prepared: Quantized | None, qk: str, scale: float, block_m: int, block_n: int,
                     permuted_v: bool) -> Quantized | None:
    """``prepared`` if it is what this launch would quantize itself; a mismatch is the caller's bug, refused."""
    needed = (qk, scale, block_m, block_n, permuted_v)
    if prepared is not None and prepared.settings != needed:
        raise ValueError(f"prepared copies were made for {prepared.settings}, this launch needs {needed} (qk, scale, "
                         "block_m, block_n, V permuted)")
    return prepared
