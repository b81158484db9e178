"""An alternative to ``ditgate.kernels.tile_select`` that measured slower and was not taken (results
2026-12-03-h200-s8, call b, ``selector_ab.py``): pooling by groups of heads (one program per tile, batch
and 512 values of heads side by side, walking the rows 32 at a time) and one kernel that scores 16 query
tiles against every key tile (a float32 product) and then chooses and lists as ``_choose_kernel`` does,
on a [16, N] block. At LTX: pooling Q by 192 rows 0.078 ms against 0.063, scoring-choosing-listing 0.183
against 0.075 for the matmul and the choose kernel; at Wan-14B pooling was faster (0.118 against 0.130)
but the fused kernel slower (0.178 against 0.099). Kept only to re-run that comparison.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _pool_kernel(X, OUT, sxb, sxh, sxs, sxd, H, S, n, block, D: tl.constexpr, HEADS: tl.constexpr,
                 CHUNK: tl.constexpr):
    t = tl.program_id(0)
    groups = tl.cdiv(H, HEADS)
    b = tl.program_id(1) // groups
    hd = tl.arange(0, HEADS * D)
    heads = (tl.program_id(1) % groups) * HEADS + hd // D
    d = hd % D
    start = t * block
    end = tl.minimum(S, start + block)
    base = X + b.to(tl.int64) * sxb + heads * sxh + d * sxd
    acc = tl.zeros([HEADS * D], tl.float32)
    for r0 in range(start, end, CHUNK):
        rows = r0 + tl.arange(0, CHUNK)
        x = tl.load(base[None, :] + rows.to(tl.int64)[:, None] * sxs,
                    mask=(rows[:, None] < end) & (heads[None, :] < H), other=0.0)
        acc += tl.sum(x.to(tl.float32), axis=0)
    count = (end - start).to(tl.float32)
    tl.store(OUT + ((b * H + heads) * n + t) * D + d, acc / count, mask=heads < H)


def pool_tiles(x: torch.Tensor, block: int) -> torch.Tensor:
    B, H, S, D = x.shape
    n = -(-S // block)
    heads = min(triton.next_power_of_2(H), max(1, 512 // D))
    out = torch.empty(B, H, n, D, dtype=torch.float32, device=x.device)
    _pool_kernel[(n, B * triton.cdiv(H, heads))](x, out, *x.stride(), H, S, n, block, D=D, HEADS=heads,
                                                 CHUNK=32, num_warps=4)
    return out


@triton.jit
def _score_choose_kernel(QP, KP, FIXED, FIXED_SCORE, ALWAYS, INDEX, H, HK, n_m, n, width, keep, D: tl.constexpr,
                         N: tl.constexpr, TILES: tl.constexpr, DK: tl.constexpr):
    bh = tl.program_id(0)
    kv = (bh // H) * HK + (bh % H) // (H // HK)
    ms = tl.program_id(1) * TILES + tl.arange(0, TILES)
    cols = tl.arange(0, N)
    rows_ok = ms < n_m
    valid = cols < n
    s = tl.zeros([TILES, N], tl.float32)
    for d0 in tl.static_range(0, D, DK):
        dd = d0 + tl.arange(0, DK)
        qp = tl.load(QP + (bh * n_m + ms[:, None]) * D + dd[None, :], mask=rows_ok[:, None], other=0.0)
        kp = tl.load(KP + (kv * n + cols[None, :]) * D + dd[:, None], mask=valid[None, :], other=0.0)
        s += tl.dot(qp, kp, input_precision="ieee")
    geo = ms[:, None] * n + cols[None, :]
    inside = rows_ok[:, None] & valid[None, :]
    fixed = tl.load(FIXED + geo, mask=inside, other=0) != 0
    s = tl.where(fixed, tl.load(FIXED_SCORE + geo, mask=inside, other=float("-inf")), s)
    s = tl.where(valid[None, :], s, float("-inf"))
    ranked = tl.sort(s, dim=1, descending=True)
    threshold = tl.max(tl.where(cols[None, :] == keep - 1, ranked, float("-inf")), axis=1)
    above = s > threshold[:, None]
    ties = (s == threshold[:, None]) & valid[None, :]
    room = keep - tl.sum(above.to(tl.int32), axis=1)
    chosen = above | (ties & (tl.cumsum(ties.to(tl.int32), axis=1) <= room[:, None]))
    kept = (chosen | (tl.load(ALWAYS + geo, mask=inside, other=0) != 0)) & inside
    running = tl.cumsum(kept.to(tl.int32), axis=1)
    total = tl.sum(kept.to(tl.int32), axis=1)
    base = INDEX + (bh * n_m + ms[:, None]) * width
    unused = rows_ok[:, None] & (cols[None, :] >= total[:, None]) & (cols[None, :] < width)
    tl.store(base + cols[None, :], tl.zeros([TILES, N], tl.int32), mask=unused)
    tl.store(base + running - 1, (cols[None, :] + tl.zeros([TILES, N], tl.int32)), mask=kept)


def score_choose_and_list(q_pooled, k_pooled, fixed, fixed_score, always, keep: int, width: int) -> torch.Tensor:
    B, H, n_m, D = q_pooled.shape
    HK, n = k_pooled.shape[1], k_pooled.shape[2]
    index = torch.empty(B, H, n_m, width, dtype=torch.int32, device=q_pooled.device)
    tiles = 16
    _score_choose_kernel[(B * H, triton.cdiv(n_m, tiles))](
        q_pooled.contiguous(), k_pooled.contiguous(), fixed, fixed_score, always, index, H, HK, n_m, n, width, keep,
        D=D, N=max(16, triton.next_power_of_2(n)), TILES=tiles, DK=min(D, 32), num_warps=4)
    return index
