"""The tile selector: which key tiles each query tile visits, within a budget, without host syncs.

Q and K are mean-pooled per tile; tile pairs are scored by the pooled dot product on *query* heads (the
pooled keys of a kv head broadcast over its query-head group, so GQA needs no key expansion). Per query
tile the best key tiles are kept within ``budget`` (a fraction of the sparsifiable candidate tiles,
rounded up to a whole count that is the same for every row, so no shape depends on data); the diagonal
and every pinned (non-video) key tile are always kept; non-video query tiles keep everything; padding
key tiles are dropped. Geometry that depends only on the layout and the tile sizes is computed once per
selector, layout and query-tile height, on the host, so the per-call path never reads a device value
back. Query tiles may be taller than key tiles (``rows``): a consumer whose program covers 192 query
rows (the Hopper schedule's three warpgroups at head dim 64) asks for 192 x 128 tiles, and a query
tile's diagonal is then every key tile it overlaps (two), and the consumer's lists run on its three
warpgroups as dense calls do. Lists are assembled without a sort (a tile's slot is its rank among its
row's kept tiles), which keeps the selection to a few small kernels. A consumer that quantizes Q and K reads
them anyway and may hand over the tile means from that read (``select(pooled=...)``,
``Form.pool_for_selection``).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..kernels.lists import KeyBlockLists
from .layout import TokenLayout


@dataclass(frozen=True)
class _Geometry:
    n_rows: int  # query tiles
    n_cols: int  # key tiles
    candidates: int  # sparsifiable key tiles
    diagonal: int  # most video key tiles a video query tile overlaps (kept always; 1 for square tiles)
    sparse: torch.Tensor  # bool [n_rows] on the device: video query tiles
    n_pinned: int  # pinned (non-video, non-padding) key tiles: kept by every video row
    width: int  # non-padding key tiles: what a non-video row keeps, and the lists' length
    # fixed scores, one ``where`` per call: -inf for key tiles that do not compete (pinned, padding),
    # +inf on a video tile's diagonal (always kept)
    fixed: torch.Tensor  # bool [n_rows, n_cols]
    fixed_score: torch.Tensor  # float32 [n_rows, n_cols]
    always: torch.Tensor  # bool [n_rows, n_cols]: pinned key tiles, every non-padding tile of a non-video row
    columns: torch.Tensor  # int32 [n_cols]: 0 .. n_cols-1
    fixed_i8: torch.Tensor  # ``fixed`` and ``always`` as int8, for the Triton kernels
    always_i8: torch.Tensor

    def scoring(self) -> dict[str, torch.Tensor | int]:
        """What ``choose_tiles`` reads of the geometry (and the selection op takes as its arguments)."""
        return dict(fixed=self.fixed, fixed_score=self.fixed_score, always=self.always, fixed_i8=self.fixed_i8,
                    always_i8=self.always_i8, columns=self.columns, width=self.width)


def _pool(x: torch.Tensor, block: int, n: int) -> torch.Tensor:
    """Mean of each tile's rows in float32, read in place (no padded or upcast copy of ``x``)."""
    full = x.shape[2] // block
    pooled = x[:, :, : full * block].unflatten(2, (full, block)).mean(3, dtype=torch.float32)
    if full < n:  # the partial last tile
        pooled = torch.cat([pooled, x[:, :, full * block:].mean(2, keepdim=True, dtype=torch.float32)], dim=2)
    return pooled


class TileSelector:
    """``kernels``: run the per-call work as two Triton kernels (``kernels.tile_select``) instead of the
    torch path; by default on CUDA devices where Triton is installed. Both give the same lists."""

    def __init__(self, block: int = 128, kernels: bool | None = None) -> None:
        self.block = block  # key tile, and query tile unless a call asks for taller ones (``rows``)
        self.kernels = kernels
        self._triton = importlib.util.find_spec("triton") is not None  # once, not on every call
        self._geometry: dict[tuple, _Geometry] = {}  # owned by this selector (one plan), never module-level
        self._count_cache: dict[tuple, torch.Tensor] = {}

    def geometry(self, layout: TokenLayout, device: torch.device, rows: int | None = None) -> _Geometry:
        rows = rows or self.block
        key = (layout, str(device), rows)
        if key not in self._geometry:
            sparse_q = layout.tile_sparsifiable(rows)
            sparse = layout.tile_sparsifiable(self.block)
            pad = layout.tile_padding(self.block)
            pinned = ~sparse & ~pad
            diagonal = layout.video_diagonal(rows, self.block)
            fixed = diagonal | ~sparse[None, :]
            fixed_score = torch.where(diagonal, float("inf"), float("-inf"))
            always = pinned[None, :] | (~sparse_q[:, None] & ~pad[None, :])
            n = sparse.numel()
            self._geometry[key] = _Geometry(
                n_rows=sparse_q.numel(), n_cols=n, candidates=int(sparse.sum()),
                diagonal=int(diagonal.sum(1).max()) if diagonal.numel() else 0, sparse=sparse_q.to(device),
                n_pinned=int(pinned.sum()), width=int((~pad).sum()),
                fixed=fixed.to(device), fixed_score=fixed_score.to(device),
                always=always.to(device), columns=torch.arange(n, dtype=torch.int32, device=device),
                fixed_i8=fixed.to(torch.int8).to(device), always_i8=always.to(torch.int8).to(device))
        return self._geometry[key]

    def keep_count(self, layout: TokenLayout, budget: float, rows: int | None = None) -> int:
        """Video key tiles kept per video query tile (diagonal included) at ``budget``; never fewer than
        the diagonal's tiles, which are always kept."""
        if not 0 < budget <= 1:
            raise ValueError(f"budget must lie in (0, 1], got {budget}")
        geo = self.geometry(layout, torch.device("cpu"), rows)
        c = geo.candidates
        return max(1, geo.diagonal, min(c, math.ceil(budget * c - 1e-9)))

    def select(self, q: torch.Tensor, k: torch.Tensor, layout: TokenLayout, budget: float,
               rows: int | None = None, pooled: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None,
               ) -> KeyBlockLists | None:
        """Lists for B, H, S, D ``q`` and B, Hkv, S, D ``k`` of one self-attention call; None means dense.
        ``rows``: query rows per tile (by default the key tile's ``block``). ``pooled``: gives the float32
        tile means of Q ([B, H, query tiles, D]) and K ([B, Hkv, key tiles, D]) in place of this
        selector's pooling, called only when the budget leaves something to select (a consumer that reads
        Q and K anyway, to quantize them, pools in the same pass: ``Form.pool_for_selection``)."""
        B, H, S, D = q.shape
        HK = k.shape[1]
        if k.shape[2] != S or S != layout.length:
            raise ValueError(f"layout covers {layout.length} tokens; q has {S}, k has {k.shape[2]}")
        rows = rows or self.block
        if rows <= 0:
            raise ValueError(f"query tiles need a positive row count, not {rows}")
        geo = self.geometry(layout, q.device, rows)
        keep = self.keep_count(layout, budget, rows)
        if keep >= geo.candidates:
            return None
        n_m, n = geo.n_rows, geo.n_cols
        counts = self.counts(layout, q.device, keep, rows, B, H)
        given = pooled() if pooled is not None else None
        if given is not None and (given[0].shape != (B, H, n_m, D) or given[1].shape != (B, HK, n, D)):
            raise ValueError(f"pooled tiles must be [{B}, {H}, {n_m}, {D}] and [{B}, {HK}, {n}, {D}], got "
                             f"{list(given[0].shape)} and {list(given[1].shape)}")
        index = choose_tiles(q, k, keep, rows, self.block, self._use_kernels(q), given, **geo.scoring())
        return KeyBlockLists(index, counts, rows, self.block)

    def _use_kernels(self, q: torch.Tensor) -> bool:
        return self.uses_kernels(q.device)

    def uses_kernels(self, device: torch.device) -> bool:
        """Whether calls on ``device`` run the Triton kernels (``kernels``) rather than the torch path."""
        if self.kernels is not None:
            return self.kernels
        return device.type == "cuda" and self._triton

    def counts(self, layout: TokenLayout, device: torch.device, keep: int, rows: int, batch: int,
                heads: int) -> torch.Tensor:
        """Int32 [batch, heads, query tiles]: ``keep`` video tiles plus the pinned ones, or every non-padding
        tile. Made once per shape (the copy was a kernel launch on every call); nobody writes to it."""
        key = (layout, str(device), keep, rows, batch, heads)
        if key not in self._count_cache:
            geo = self.geometry(layout, device, rows)
            per_tile = torch.where(geo.sparse, keep + geo.n_pinned, geo.width).to(torch.int32)
            self._count_cache[key] = per_tile.expand(batch, heads, geo.n_rows).contiguous()
        return self._count_cache[key]


def choose_tiles(q: torch.Tensor, k: torch.Tensor, keep: int, rows: int, block: int, kernels: bool,
                 given: tuple[torch.Tensor, torch.Tensor] | None = None, *, fixed: torch.Tensor,
                 fixed_score: torch.Tensor, always: torch.Tensor, fixed_i8: torch.Tensor, always_i8: torch.Tensor,
                 columns: torch.Tensor, width: int) -> torch.Tensor:
    """The per-call work of a selection: int32 [B, H, query tiles, width] ascending key-tile lists (each row's first
    ``counts`` entries), from the pooled tiles (``given``, or pooled here) and the geometry's fixed scores
    (``_Geometry.scoring``); ``kernels``: the two Triton kernels instead of the torch path (the same lists)."""
    B, H, _, D = q.shape
    HK = k.shape[1]
    n_m, n = fixed.shape
    if kernels:
        from ..kernels import tile_select

        qp, kp = given or (tile_select.pool_tiles(q, rows), tile_select.pool_tiles(k, block))
        scores = torch.matmul(qp.view(B, HK, H // HK * n_m, D), kp.transpose(-1, -2)).view(B, H, n_m, n)
        return tile_select.choose_and_list(scores, fixed_i8, fixed_score, always_i8, keep, width)
    qp, kp = given or (_pool(q, rows, n_m), _pool(k, block, n))
    scores = torch.einsum("bkgmd,bknd->bkgmn", qp.view(B, HK, H // HK, n_m, D), kp).reshape(B, H, n_m, n)
    scores = torch.where(fixed, fixed_score, scores)  # only video key tiles compete; diagonal wins
    chosen = scores.topk(keep, dim=-1, sorted=False).indices  # [B, H, n_m, keep], video tiles only (any order)
    # ascending lists without a sort: mark the kept tiles, then each kept tile's rank among its row's
    # kept tiles (a running count) is its slot; unkept tiles write to a spill slot that is cut off
    kept = torch.zeros(B, H, n_m, n, dtype=torch.bool, device=q.device).scatter_(-1, chosen, True) | always
    slot = torch.where(kept, kept.cumsum(-1, dtype=torch.int32) - 1, width).long()
    index = torch.zeros(B, H, n_m, width + 1, dtype=torch.int32, device=q.device)
    index.scatter_(-1, slot, columns.expand(B, H, n_m, n))
    return index[..., :width].contiguous()
