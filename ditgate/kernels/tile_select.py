"""The tile selector's per-call work in two Triton kernels: pooling, and choosing plus listing.

Why: the selector's torch path is a dozen small kernels (two strided means and a concatenation per
tensor, a ``where``, ``topk``, a scatter, a cumulative sum, another scatter), whose time at video lengths is
mostly launches and the strided means, a few percent of the dense attention it is meant to save. Here:

- ``pool_tiles``: one program per (tile, batch · head) reads its rows through the caller's strides
  and writes their float32 mean (the partial last tile by its real row count); ``means_from_sums`` the
  same means of Q and K, in one launch, from column sums a quantization pass wrote (the quantized sparse
  forms pool that way);
- ``choose_and_list``: one program per (batch · head, query tile) applies the fixed scores, finds the
  ``keep``-th best score of its row by a sort, keeps the tiles above it (ties at it in column order,
  so exactly ``keep``), adds the always-kept tiles, and writes the row's ascending list at slots given
  by a running count. Same lists as the torch path wherever scores do not tie.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _pool_kernel(X, OUT, sxb, sxh, sxs, sxd, H, S, n, block, D: tl.constexpr, BLOCK: tl.constexpr):
    bh, t = tl.program_id(0), tl.program_id(1)  # consecutive programs: one tile of consecutive heads
    end = tl.minimum(S, (t + 1) * block)  # a tile of ``block`` rows; BLOCK is that rounded up to a power of two
    rows = t * block + tl.arange(0, BLOCK)
    cols = tl.arange(0, D)
    x = tl.load(X + (bh // H) * sxb + (bh % H) * sxh + rows[:, None] * sxs + cols[None, :] * sxd,
                mask=rows[:, None] < end, other=0.0).to(tl.float32)
    count = (end - t * block).to(tl.float32)
    tl.store(OUT + (bh * n + t) * D + cols, tl.sum(x, axis=0) / count)


def pool_tiles(x: torch.Tensor, block: int) -> torch.Tensor:
    """Float32 [B, H, n, D] mean of each ``block`` rows of a B, H, S, D tensor (any strides; ``block``
    need not be a power of two, 192 for three-warpgroup query tiles). The programs take a tile of every head in
    turn, as the quantization's passes do (``quant_passes._block_and_head``), so that those running at once read
    whole token rows of diffusers' [B, S, H, D] storage."""
    B, H, S, D = x.shape
    n = -(-S // block)
    out = torch.empty(B, H, n, D, dtype=torch.float32, device=x.device)
    _pool_kernel[(B * H, n)](x, out, *x.stride(), H, S, n, block, D=D, BLOCK=triton.next_power_of_2(block),
                             num_warps=4)
    return out


@triton.jit
def _tile_mean(SUMS, OUT, t, bh, n_blocks, n, rows, length, D: tl.constexpr, GROUP: tl.constexpr):
    """Tile ``t`` of head ``bh``: the sum of its ``GROUP`` blocks' column sums over its real row count."""
    cols = tl.arange(0, D)
    total = tl.zeros([D], tl.float32)
    for i in tl.static_range(GROUP):  # the tile's blocks; the last tile may have fewer
        blk = t * GROUP + i
        total += tl.load(SUMS + (bh * n_blocks + blk) * D + cols, mask=cols * 0 + blk < n_blocks, other=0.0)
    count = (tl.minimum(length, (t + 1) * rows) - t * rows).to(tl.float32)
    tl.store(OUT + (bh * n + t) * D + cols, total / count)


@triton.jit
def _means_kernel(Q_SUMS, Q_OUT, K_SUMS, K_OUT, q_heads, q_blocks, q_n, rows, seq_q, k_blocks, k_n, block_n, seq_k,
                  D: tl.constexpr, Q_GROUP: tl.constexpr):
    """Q's tile means for heads below ``q_heads``, K's for the rest, in one launch (``means_from_sums``)."""
    t = tl.program_id(0)
    bh = tl.program_id(1)
    if bh < q_heads:
        if t < q_n:
            _tile_mean(Q_SUMS, Q_OUT, t, bh, q_blocks, q_n, rows, seq_q, D, Q_GROUP)
    elif t < k_n:
        _tile_mean(K_SUMS, K_OUT, t, bh - q_heads, k_blocks, k_n, block_n, seq_k, D, 1)


def means_from_sums(q_sums: torch.Tensor, block_m: int, rows: int, seq_q: int, k_sums: torch.Tensor, block_n: int,
                    seq_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 tile means of Q per ``rows`` query rows ([B, H, n, D], ``rows`` a multiple of ``block_m``) and of K
    per ``block_n`` keys ([B, HK, n_n, D]), from float32 [B, ., blocks, D] column sums per ``block_m`` query rows
    and ``block_n`` keys (what a quantization pass wrote while it read the rows anyway); the partial last tiles by
    their real row counts. One launch for both: a handful of torch operations per tensor was launch-bound, and with
    one launch per tensor the GPU waited for the host between the two when calls ran one at a time."""
    B, H, q_blocks, D = q_sums.shape
    HK, k_blocks = k_sums.shape[1], k_sums.shape[2]
    if rows % block_m:
        raise ValueError(f"tiles of {rows} rows are not whole blocks of {block_m}")
    q_n, k_n = -(-seq_q // rows), -(-seq_k // block_n)
    query = torch.empty(B, H, q_n, D, dtype=torch.float32, device=q_sums.device)
    key = torch.empty(B, HK, k_n, D, dtype=torch.float32, device=k_sums.device)
    _means_kernel[(max(q_n, k_n), B * H + B * HK)](q_sums, query, k_sums, key, B * H, q_blocks, q_n, rows, seq_q,
                                                   k_blocks, k_n, block_n, seq_k, D=D, Q_GROUP=rows // block_m,
                                                   num_warps=1)
    return query, key


@triton.jit
def _choose_kernel(SCORES, FIXED, FIXED_SCORE, ALWAYS, INDEX, n_m, n, width, keep, N: tl.constexpr):
    row = tl.program_id(0)  # (batch · head) · n_m + query tile; n key tiles per row
    m = row % n_m
    cols = tl.arange(0, N)
    valid = cols < n
    s = tl.load(SCORES + row * n + cols, mask=valid, other=float("-inf"))
    fixed = tl.load(FIXED + m * n + cols, mask=valid, other=0) != 0
    s = tl.where(fixed, tl.load(FIXED_SCORE + m * n + cols, mask=valid, other=float("-inf")), s)
    s = tl.where(valid, s, float("-inf"))
    ranked = tl.sort(s, descending=True)
    threshold = tl.max(tl.where(cols == keep - 1, ranked, float("-inf")), axis=0)
    above = s > threshold
    ties = (s == threshold) & valid
    room = keep - tl.sum(above.to(tl.int32), axis=0)
    chosen = above | (ties & (tl.cumsum(ties.to(tl.int32), axis=0) <= room))
    kept = (chosen | (tl.load(ALWAYS + m * n + cols, mask=valid, other=0) != 0)) & valid
    running = tl.cumsum(kept.to(tl.int32), axis=0)
    total = tl.sum(kept.to(tl.int32), axis=0)
    base = INDEX + row * width
    tl.store(base + cols, tl.zeros([N], tl.int32), mask=(cols >= total) & (cols < width))  # unused slots
    tl.store(base + running - 1, cols.to(tl.int32), mask=kept)


def choose_and_list(scores: torch.Tensor, fixed: torch.Tensor, fixed_score: torch.Tensor, always: torch.Tensor,
                    keep: int, width: int) -> torch.Tensor:
    """Int32 [B, H, n_m, width] ascending key-tile lists from float32 [B, H, n_m, n] pooled scores (n_m
    query tiles, n key tiles).

    ``fixed`` / ``fixed_score`` / ``always`` are the layout's [n_m, n] geometry (see selector._Geometry;
    the two masks as int8, nonzero meaning set);
    ``keep`` the tiles chosen per row by score, ``width`` the lists' length. One warp per row, the fastest
    of 1, 2, 4 and 8."""
    B, H, n_m, n = scores.shape
    scores = scores.contiguous()
    index = torch.empty(B, H, n_m, width, dtype=torch.int32, device=scores.device)
    _choose_kernel[(B * H * n_m,)](scores, fixed, fixed_score, always, index, n_m, n, width, keep,
                                 N=triton.next_power_of_2(n), num_warps=1)
    return index
