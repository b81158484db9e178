"""Static tile patterns over the latent grid: a spatio-temporal window and a radial pattern.

They are the controls for the selector (same budget, no look at Q or K) and cheap options of their
own: computed once per (layout, budget, block) on the host and reused for every call. Both keep the
same tiles the selector always keeps (diagonal, every non-video key tile, every row of a non-video
query tile) and drop padding keys.

Query tiles may be taller than key tiles (``rows``, as the selector's); the diagonal is then every key
tile a query tile overlaps.

- ``window``: per video query tile, the ``keep`` video key tiles nearest in the box metric
  max(|df|/F, |dy|/H, |dx|/W) over tile centroids, ``keep`` being the selector's count at the budget.
- ``radial``: per video query tile, the key tiles whose spatial distance is within r / 2**band, where
  band = floor(log2(1 + |df|)) grows with temporal distance (the kept share of a frame halves for each
  doubling of the frame distance); r is found by bisection so the mean density meets the budget.
"""

from __future__ import annotations

import math

import torch

from .layout import TokenLayout

PATTERNS = ("window", "radial")


def _tile_coordinates(layout: TokenLayout, block: int) -> torch.Tensor:
    """Float [n, 3]: mean (frame, row, column) of each tile's video tokens, normalised by the grid."""
    seg = layout.visual()
    if seg is None or layout.grid is None:
        raise ValueError("a static pattern needs one video/image segment and its grid")
    f, h, w = layout.grid
    if f * h * w != seg.end - seg.start:
        raise ValueError(f"grid {layout.grid} does not cover the {seg.end - seg.start} visual tokens")
    t = torch.arange(layout.length, dtype=torch.float64)
    rel = (t - seg.start).clamp(0, seg.end - seg.start - 1)
    coords = torch.stack([torch.div(rel, h * w, rounding_mode="floor"),
                          torch.div(rel, w, rounding_mode="floor") % h, rel % w], 1)
    n = -(-layout.length // block)
    pad = n * block - layout.length
    coords = torch.nn.functional.pad(coords, (0, 0, 0, pad), value=float("nan")).view(n, block, 3).nanmean(1)
    return coords / torch.tensor([max(f, 1), max(h, 1), max(w, 1)], dtype=torch.float64)


def _finish(chosen: torch.Tensor, layout: TokenLayout, block: int, rows: int) -> torch.Tensor:
    """Add what is always kept and drop padding keys: bool [query tiles, key tiles]."""
    sparse_q = layout.tile_sparsifiable(rows)
    sparse = layout.tile_sparsifiable(block)
    pad = layout.tile_padding(block)
    keep = chosen & sparse[None, :] & sparse_q[:, None]
    keep |= layout.video_diagonal(rows, block)
    keep |= ~sparse[None, :]  # non-video keys: every query visits them
    keep |= ~sparse_q[:, None]  # non-video queries: attend everything
    return keep & ~pad[None, :]


def _distances(layout: TokenLayout, block: int, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query-tile to key-tile distances of the tile centres: the box metric over (frame, row, column),
    the box metric over (row, column), and the distance in frames."""
    cq, ck = _tile_coordinates(layout, rows), _tile_coordinates(layout, block)
    diff = (cq[:, None, :] - ck[None, :, :]).abs()
    return diff.amax(-1), diff[..., 1:].amax(-1), diff[..., 0] * layout.grid[0]


def window_pattern(layout: TokenLayout, block: int, keep: int, rows: int | None = None) -> torch.Tensor:
    rows = rows or block
    dist = _distances(layout, block, rows)[0]
    sparse = layout.tile_sparsifiable(block)
    dist = dist.masked_fill(~sparse[None, :], float("inf"))
    dist = dist.masked_fill(layout.video_diagonal(rows, block), -1.0)
    nearest = dist.topk(min(keep, int(sparse.sum())), dim=1, largest=False).indices
    chosen = torch.zeros_like(dist, dtype=torch.bool).scatter_(1, nearest, True)
    return _finish(chosen, layout, block, rows)


def radial_pattern(layout: TokenLayout, block: int, budget: float, rows: int | None = None) -> torch.Tensor:
    rows = rows or block
    _, spatial, frames = _distances(layout, block, rows)
    band = torch.floor(torch.log2(1.0 + frames))
    sparse = layout.tile_sparsifiable(block)
    video_rows = layout.tile_sparsifiable(rows).nonzero().flatten()
    candidates = int(sparse.sum())

    def chosen_at(r: float) -> torch.Tensor:
        return spatial <= r / torch.pow(2.0, band)

    def density(r: float) -> float:
        kept = _finish(chosen_at(r), layout, block, rows)[video_rows][:, sparse]
        return float(kept.sum(1).double().mean()) / candidates

    lo, hi = 0.0, 2.0 * 2.0 ** float(band.max())
    for _ in range(40):  # largest r whose density stays within the budget
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if density(mid) <= budget else (lo, mid)
    return _finish(chosen_at(lo), layout, block, rows)


def static_pattern(name: str, layout: TokenLayout, block: int, budget: float, keep: int,
                   rows: int | None = None) -> torch.Tensor:
    """Bool [query tiles, key tiles]: ``rows`` query rows (by default ``block``) by ``block`` key rows."""
    if name == "window":
        return window_pattern(layout, block, keep, rows)
    if name == "radial":
        return radial_pattern(layout, block, budget, rows)
    raise ValueError(f"unknown static pattern {name!r}; known: {', '.join(PATTERNS)}")


def pattern_density(tiles: torch.Tensor, layout: TokenLayout, block: int, rows: int | None = None) -> float:
    """Mean share of video key tiles kept by video query tiles (the budget's own measure)."""
    sparse = layout.tile_sparsifiable(block)
    sub = tiles[layout.tile_sparsifiable(rows or block)][:, sparse]
    return float(sub.sum(1).double().mean()) / max(1, int(sparse.sum())) if sub.numel() else math.nan
