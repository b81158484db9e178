"""The sparse stage inside torch.compile graphs: a selection is one custom op per call, a budget is static per graph.

Eagerly a site asks ``SparseStage.selection`` on every call. A compiled graph can hold neither the stage's Python
nor a budget that changes from step to step, so:

- the step counter and the layouts are read by the stage's pre-hook, which always runs outside graphs (dynamo
  skips it: one graph break before the forward's first op while a sparse stage is attached) and sets the stage's
  ``graph_token``: the budget of this step's sparse layers and a count of the distinct layouts met;
- a graph reads the token (dynamo guards on it) and is traced for that budget and those layouts: the dense steps
  and the sparse steps make two graphs, not one per step;
- at trace time the stage says, per call, why it stays dense (the host serves it in that graph, with the reason)
  or how it is selected (a ``GraphPlan``); what depends only on the layout and the tiles (the fixed scores and the
  per-tile counts, or a static pattern's lists) is kept by the stage under a plain key, at a static address, and
  the graph calls ``ditgate::select_tiles`` on its Q and K, then the form's op on the lists.

A consumer's pooling from its quantization pass (``Form.pool_for_selection``) is not shared in graphs: the op pools.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from ..kernels.lists import KeyBlockLists
from .selector import choose_tiles

SELECTED, STATIC = "selected", "static"  # the stage's pattern of scores per call; a pattern's fixed lists


@torch.library.custom_op("ditgate::select_tiles", mutates_args=())
def select_tiles(q: torch.Tensor, k: torch.Tensor, fixed: torch.Tensor, fixed_score: torch.Tensor,
                 always: torch.Tensor, fixed_i8: torch.Tensor, always_i8: torch.Tensor, columns: torch.Tensor,
                 keep: int, width: int, rows: int, block: int, kernels: bool) -> torch.Tensor:
    """The selector's per-call work (``selector.choose_tiles``) on B, H, S, D ``q`` and ``k``: int32 key-tile lists
    [B, H, query tiles, width]."""
    return choose_tiles(q, k, keep, rows, block, kernels, fixed=fixed, fixed_score=fixed_score, always=always,
                        fixed_i8=fixed_i8, always_i8=always_i8, columns=columns, width=width)


@select_tiles.register_fake
def _(q, k, fixed, fixed_score, always, fixed_i8, always_i8, columns, keep, width, rows, block, kernels):
    return q.new_empty((q.shape[0], q.shape[1], fixed.shape[0], width), dtype=torch.int32)


class GraphPlan(NamedTuple):
    """How a graph selects for one call: plain values only (a trace keeps it as a constant)."""

    kind: str  # SELECTED (scores per call) or STATIC (a pattern's lists)
    key: int  # where ``GraphTensors`` keeps its tensors
    rows: int  # query rows per tile
    block: int  # key rows per tile
    keep: int = 0
    width: int = 0
    kernels: bool = False


class GraphTensors:
    """The tensors graphs select with, per layout and tile shape, under plain int keys (one stage's, never
    module-level). Each is marked as living at a static address, so CUDA graphs read it in place."""

    def __init__(self) -> None:
        self.tensors: dict[int, tuple[torch.Tensor, ...]] = {}
        self._keys: dict[tuple, int] = {}

    def key(self, what: tuple, make: Callable[[], tuple[torch.Tensor, ...]]) -> int:
        key = self._keys.get(what)
        if key is None:
            key = self._keys[what] = len(self._keys)
            made = tuple(t.contiguous() for t in make())
            for t in made:
                torch._dynamo.mark_static_address(t, guard=False)
            self.tensors[key] = made
        return key

    def lists(self, q: torch.Tensor, k: torch.Tensor, plan: GraphPlan) -> KeyBlockLists:
        """Traced into a graph: the lists for this call."""
        tensors = self.tensors[plan.key]
        if plan.kind == STATIC:
            return KeyBlockLists(tensors[0], tensors[1], plan.rows, plan.block)
        fixed, fixed_score, always, fixed_i8, always_i8, columns, counts = tensors
        index = torch.ops.ditgate.select_tiles(q, k, fixed, fixed_score, always, fixed_i8, always_i8, columns,
                                               plan.keep, plan.width, plan.rows, plan.block, plan.kernels)
        return KeyBlockLists(index, counts, plan.rows, plan.block)
