"""Static tile patterns over the latent grid: a spatio-temporal window and a radial pattern.

They are the controls for the selector (same budget, no look at Q or K) and cheap options of their
own: computed once per (layout, budget, block) on the host and reused for every call. Both keep the
same tiles the selector always keeps (diagonal, every non-video key tile, every row of a non-video
query tile) and drop padding keys.

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


def _finish(chosen: torch.Tensor, layout: TokenLayout, block: int) -> torch.Tensor:
    """Add what is always kept and drop padding keys: bool [n, n]."""
    sparse = layout.tile_sparsifiable(block)
    pad = layout.tile_padding(block)
    keep = chosen & sparse[None, :] & sparse[:, None]
    keep |= torch.eye(len(sparse), dtype=torch.bool)
    keep |= ~sparse[None, :]  # non-video keys: every query visits them
    keep |= ~sparse[:, None]  # non-video queries: attend everything
    return keep & ~pad[None, :]


def window_pattern(layout: TokenLayout, block: int, keep: int) -> torch.Tensor:
    c = _tile_coordinates(layout, block)
    dist = (c[:, None, :] - c[None, :, :]).abs().amax(-1)
    sparse = layout.tile_sparsifiable(block)
    dist = dist.masked_fill(~sparse[None, :], float("inf"))
    dist.fill_diagonal_(-1.0)
    nearest = dist.topk(min(keep, int(sparse.sum())), dim=1, largest=False).indices
    chosen = torch.zeros_like(dist, dtype=torch.bool).scatter_(1, nearest, True)
    return _finish(chosen, layout, block)


def radial_pattern(layout: TokenLayout, block: int, budget: float) -> torch.Tensor:
    c = _tile_coordinates(layout, block)
    spatial = (c[:, None, 1:] - c[None, :, 1:]).abs().amax(-1)
    frames = (c[:, None, 0] - c[None, :, 0]).abs() * layout.grid[0]  # distance in frames
    band = torch.floor(torch.log2(1.0 + frames))
    sparse = layout.tile_sparsifiable(block)
    rows = sparse.nonzero().flatten()
    candidates = int(sparse.sum())

    def chosen_at(r: float) -> torch.Tensor:
        return spatial <= r / torch.pow(2.0, band)

    def density(r: float) -> float:
        kept = _finish(chosen_at(r), layout, block)[rows][:, sparse]
        return float(kept.sum(1).double().mean()) / candidates

    lo, hi = 0.0, 2.0 * 2.0 ** float(band.max())
    for _ in range(40):  # largest r whose density stays within the budget
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if density(mid) <= budget else (lo, mid)
    return _finish(chosen_at(lo), layout, block)


def static_pattern(name: str, layout: TokenLayout, block: int, budget: float, keep: int) -> torch.Tensor:
    if name == "window":
        return window_pattern(layout, block, keep)
    if name == "radial":
        return radial_pattern(layout, block, budget)
    raise ValueError(f"unknown static pattern {name!r}; known: {', '.join(PATTERNS)}")


def pattern_density(tiles: torch.Tensor, layout: TokenLayout, block: int) -> float:
    """Mean share of video key tiles kept by video query tiles (the budget's own measure)."""
    sparse = layout.tile_sparsifiable(block)
    sub = tiles[sparse][:, sparse]
    return float(sub.sum(1).double().mean()) / max(1, int(sparse.sum())) if sub.numel() else math.nan
