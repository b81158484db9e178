"""The sparse stage of one plan: which key tiles a self-attention call visits, or why it stays dense.

``attach(..., sparse=SparseSetting(...))`` makes one ``SparseStage`` per plan. Per denoiser it installs
a forward pre-hook (which dynamo skips, so it runs outside any compiled graph; under a CUDA-graph capture it
reads nothing) that reads the token layouts of that forward from its arguments (``families``) and advances the
plan's step counter from its timestep. Compiled graphs select as ``graph`` says. The
schedule's layers are counted in the order blocks first attend over a sequence with a layout. Sites
then ask ``selection`` for their call: a ``Selection`` with key-block lists, or ``lists=None`` with the
reason the call stays dense (no verified layout, cross-attention, a dense step or layer of the
schedule, a sequence too short to hold two video tiles). Each reason is logged once per site and shape.
A call whose boolean mask hides only its layout's trailing padding reaches the stage without the mask, its keys
cut before the padding (``padding.PaddingKeys``); its selection is made over the whole sequence, whose padding
tiles no list visits.

Measuring: the gate asks with ``measuring=True`` and gets the schedule's sparse budget whatever the
current step, so a site calibrated on a dense step is still measured as it will run on sparse steps;
the plan's whole-model check (run on the first, dense, step's inputs) sees the same selections.
Whether sparsity pays at a sequence length is not assumed: the gate times the sparse forms (selection
included) against the host at each site and shape, and refuses them where they do not win.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..forms import SPARSE_PRIORITY
from ..forms.base import PooledTiles
from ..kernels.lists import KeyBlockLists
from .families import ForwardLayouts, layouts_of_forward
from .graph import SELECTED, STATIC, GraphPlan, GraphTensors
from .layout import TokenLayout
from .padding import PaddingKeys, capturing
from .patterns import PATTERNS, static_pattern
from .schedule import BudgetSchedule, StepCounter, timestep_position
from .selector import TileSelector

logger = logging.getLogger("ditgate")



@dataclass(frozen=True)
class SparseSetting:
    """What the caller asks of the sparse stage.

    pattern: "selected" (tiles chosen per call from pooled Q·K), "window" or "radial" (static).
    forms: the block-sparse consumers the gate may measure (each a bounded-error form); by default all but
    ``flex_sparse``, which compiles per shape (name it to have it measured).
    block: the key tiles' tokens, and the query tiles' unless a consumer asks for taller ones
    (``Form.selection_rows``: 192 for the plain and FP8 consumers on Hopper at head dim 64).
    """

    schedule: BudgetSchedule = field(default_factory=BudgetSchedule)
    pattern: str = SELECTED
    block: int = 128
    # every consumer but the compiled flex one by default; the gate measures those installed and usable
    forms: tuple[str, ...] = tuple(f for f in SPARSE_PRIORITY if f != "flex_sparse")

    def __post_init__(self) -> None:
        if self.pattern not in (SELECTED, *PATTERNS):
            raise ValueError(f"pattern must be one of {(SELECTED, *PATTERNS)}, not {self.pattern!r}")
        if self.block not in (16, 32, 64, 128):
            raise ValueError(f"block must be 16, 32, 64 or 128 tokens, not {self.block}")
        unknown = [f for f in self.forms if f not in SPARSE_PRIORITY]
        if unknown or not self.forms:
            raise ValueError(f"sparse forms must be among {SPARSE_PRIORITY}, got {list(self.forms)}")


@dataclass(frozen=True)
class Selection:
    lists: KeyBlockLists | None
    budget: float
    reason: str = ""  # why dense, when lists is None
    prepared: object = None  # what the consumer made while pooling for the selector (``PooledTiles.prepared``)


def _block_of(path: str) -> str:
    """The block a module path lies in: its prefix up to the first index (``transformer.blocks.3``)."""
    m = re.match(r"(.*?\.\d+)(\.|$)", path)
    return m.group(1) if m else path


class SparseStage:
    """``padding``: the plan's ``PaddingKeys``, whose layouts this stage takes for the denoisers it reads, so that
    a forward's layouts are read once."""

    def __init__(self, setting: SparseSetting, padding: PaddingKeys | None = None) -> None:
        self.setting = setting
        self.padding = padding
        self.selector = TileSelector(setting.block)
        # one step counter for all the plan's denoisers: a pipeline's denoisers split one generation's steps
        # between them (Wan 2.2's high-noise expert, then its low-noise one), and a later denoiser's generation
        # (a refiner, an upsampler) starts where the timestep rises again
        self.counter = StepCounter()
        self._positions: dict[str, int | None] = {}
        self._forward: dict[str, ForwardLayouts] = {}
        self._denoiser_of: dict[str, str] = {}
        self._block_of: dict[str, str] = {}  # module path -> its block (``transformer.blocks.3``), read at install
        # layer index per block, per denoiser: the order in which blocks first attend over a sequence with a layout,
        # so that stacks that never do (HunyuanVideo's token refiner, Kandinsky's text blocks, Wan Animate's face
        # adapters) do not count among "the first layers"
        self._layers: dict[str, dict[str, int]] = {}
        self._patterns: dict[tuple, KeyBlockLists] = {}
        self._said: set[tuple[str, str, str]] = set()
        self.checking = False  # set by the plan during its whole-model check: selections as when measuring
        # compiled graphs (``graph``): the budget of this step's sparse layers and the layouts' id, set by the
        # pre-hook, which graphs guard on as ``graph_token``; the tensors they select with
        self.step_budget = 1.0
        self.graph_token = ""
        self.graph = GraphTensors()
        self._layout_ids: dict[ForwardLayouts, int] = {}
        self._padding_reads: dict[str, int] = {}

    # --- wiring (by the plan) ----------------------------------------------------------------------
    def install(self, name: str, model: torch.nn.Module, module_paths: list[str]) -> list:
        """Hooks on one denoiser; returns the handles (the plan removes them on detach)."""
        position = self._positions[name] = timestep_position(model)
        self._layers[name] = {}
        for path in module_paths:
            self._denoiser_of[path] = name
            self._block_of[path] = _block_of(path)

        padding = self.padding
        schedule = self.setting.schedule

        @torch.compiler.disable  # outside compiled graphs always: the step and the layouts are read from data
        def pre(module, args, kwargs):  # after the padding reader's hook, which the plan installs first
            if capturing():  # a CUDA graph's capture reads no device value: it runs as the forward before it did
                return None
            self.counter.observe_call(args, kwargs, position)
            shared = padding is not None and padding.covers(name)
            if shared and padding.reads(name) == self._padding_reads.get(name):  # its hook skipped (in a graph)
                padding.read(name, module, args, kwargs)
            if shared:
                self._padding_reads[name] = padding.reads(name)
            forward = self._forward[name] = padding.layouts(name) if shared else layouts_of_forward(module, args,
                                                                                                      kwargs)
            self.step_budget = schedule.budget_for(max(self.counter.step, 0), schedule.dense_layers)
            layouts = self._layout_ids.setdefault(forward, len(self._layout_ids))
            self.graph_token = f"budget {self.step_budget!r}, layouts #{layouts}"
            return None

        return [model.register_forward_pre_hook(pre, with_kwargs=True)]

    # --- per call ----------------------------------------------------------------------------------
    def selection(self, site_name: str, module_path: str, role: str, q: torch.Tensor, k: torch.Tensor,
                  measuring: bool, rows: int | None = None,
                  pool: Callable[[], PooledTiles | None] | None = None) -> Selection:
        """``rows``: query rows per tile, for a consumer that asks for tiles taller than the setting's
        ``block`` (``Form.selection_rows``); the key tiles stay ``block``. ``pool``: the consumer's
        ``pool_for_selection``, asked only when tiles are to be selected from scores."""
        schedule = self.setting.schedule
        measuring = measuring or self.checking

        def budget_of(layer: int) -> float:
            return schedule.budget if measuring else schedule.budget_for(max(self.counter.step, 0), layer)

        layout, budget, why = self._where(site_name, module_path, role, tuple(q.shape), k.shape[2], budget_of,
                                          f"dense at step {self.counter.step} (schedule)")
        if layout is None:
            return Selection(None, budget, why)
        made = []  # what the consumer's pooling made, if it pooled

        def pooled():
            tiles = pool()
            if tiles is None:
                return None
            made.append(tiles.prepared)
            return tiles.query, tiles.key

        if self.setting.pattern == SELECTED:
            lists = self.selector.select(q, k, layout, budget, rows, pooled if pool is not None else None)
        else:
            lists = self._static(layout, budget, tuple(q.shape), q.device, rows)
        if lists is None:
            return Selection(None, budget, f"budget {budget} keeps every tile")
        return Selection(lists, budget, prepared=made[0] if made else None)

    def _where(self, site_name: str, module_path: str, role: str, q_shape: tuple, n_k: int,
               budget_of: Callable[[int], float], dense_step: str) -> tuple[TokenLayout | None, float, str]:
        """A self-attention call's layout and budget, or None and why it stays dense (said once per site and shape
        where that is news); ``budget_of(layer)`` the schedule's budget for the call's layer, ``dense_step`` what
        to say where that is 1."""
        denoiser = self._denoiser_of.get(module_path)
        if denoiser is None:
            return self._dense(site_name, q_shape, "site outside the plan's denoisers", 1.0)
        if role == "cross" or q_shape[2] != n_k:
            return self._dense(site_name, q_shape, "cross-attention stays dense", 1.0)
        forward = self._forward.get(denoiser)
        if forward is None:
            return self._dense(site_name, q_shape, "no forward seen yet, so no layout", 1.0)
        layout, why = forward.for_call(module_path, q_shape[2])
        if layout is None:
            return self._dense(site_name, q_shape, why, 1.0)
        layers = self._layers[denoiser]
        layer = layers.setdefault(self._block_of[module_path], len(layers))
        schedule = self.setting.schedule
        if layer < schedule.dense_layers:
            return self._dense(site_name, q_shape, f"layer {layer} runs dense (schedule: first "
                                                   f"{schedule.dense_layers})", 1.0)
        budget = budget_of(layer)
        if budget >= 1.0:
            return None, 1.0, dense_step
        if self.selector.geometry(layout, torch.device("cpu")).candidates < 2:
            return self._dense(site_name, q_shape, f"fewer than two whole video tiles of {self.setting.block} "
                                                   "tokens", budget)
        if self.setting.pattern != SELECTED and layout.grid is None:
            return self._dense(site_name, q_shape, f"the {self.setting.pattern} pattern needs the latent grid, "
                                                   f"which {layout.source or 'this layout'} does not give", budget)
        return layout, budget, ""

    # --- inside a compiled graph (``graph``) --------------------------------------------------------------------
    def graph_selection(self, site_name: str, module_path: str, role: str, q_shape: tuple, n_k: int,
                        device: torch.device, rows: int | None) -> tuple[GraphPlan | None, str]:
        """At trace time, eagerly: how a graph traced for the current ``graph_token`` selects for this call, or None
        and why it stays dense there. Never measuring: the step's budget as the schedule gives it."""
        layout, budget, why = self._where(site_name, module_path, role, q_shape, n_k, lambda layer: self.step_budget,
                                          "dense at this step (schedule)")
        if layout is None:
            return None, why
        block = self.setting.block
        rows = rows or block
        B, H = q_shape[0], q_shape[1]
        if self.setting.pattern != SELECTED:
            def static():
                lists = self._static(layout, budget, q_shape, device, rows)
                return lists.kv_index, lists.kv_count

            return GraphPlan(STATIC, self.graph.key((STATIC, layout, budget, B, H, str(device), rows), static), rows,
                             block), ""
        keep = self.selector.keep_count(layout, budget, rows)
        geo = self.selector.geometry(layout, device, rows)
        if keep >= geo.candidates:
            return None, f"budget {budget} keeps every tile"

        def tensors():
            scoring = geo.scoring()
            return (*(scoring[n] for n in ("fixed", "fixed_score", "always", "fixed_i8", "always_i8", "columns")),
                    self.selector.counts(layout, device, keep, rows, B, H))

        key = self.graph.key((SELECTED, layout, str(device), rows, keep, B, H), tensors)
        return GraphPlan(SELECTED, key, rows, block, keep, geo.width, self.selector.uses_kernels(device)), ""

    def lists_in_graph(self, q: torch.Tensor, k: torch.Tensor, plan: tuple) -> KeyBlockLists:
        """Traced into a graph: this call's lists, as ``graph_selection`` planned them (``plan`` as a plain tuple:
        a trace keeps it as a constant)."""
        return self.graph.lists(q, k, GraphPlan(*plan))

    def _static(self, layout: TokenLayout, budget: float, q_shape: tuple, device: torch.device,
                rows: int | None) -> KeyBlockLists:
        rows = rows or self.setting.block
        key = (layout, budget, q_shape[0], q_shape[1], str(device), rows)
        if key not in self._patterns:
            keep = self.selector.keep_count(layout, budget, rows)
            tiles = static_pattern(self.setting.pattern, layout, self.setting.block, budget, keep, rows)
            self._patterns[key] = KeyBlockLists.from_tile_mask(tiles.to(device), q_shape[0], q_shape[1], rows,
                                                              self.setting.block)
        return self._patterns[key]

    def _dense(self, site_name: str, q_shape: tuple, reason: str, budget: float) -> tuple[None, float, str]:
        key = (site_name, f"{q_shape}", reason)
        if key not in self._said:  # once per site and shape
            self._said.add(key)
            logger.info("ditgate sparse: %s %s stays dense: %s", site_name, q_shape, reason)
        return None, budget, reason

    def layouts(self) -> dict[str, ForwardLayouts]:
        """The layouts each denoiser's last forward declared (for explain and tests)."""
        return dict(self._forward)

    def describe(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        """The setting in words, and per denoiser what its last forward's layouts were (or why there were none):
        what ``Plan.explain()`` shows under its table."""
        st, sch = self.setting, self.setting.schedule
        setting = (f"{st.pattern}, budget {sch.budget:g} (dense: first {sch.dense_steps} steps, first "
                   f"{sch.dense_layers} layers), {st.block}-token key tiles")
        found = []
        for name in self._positions:
            forward = self._forward.get(name)
            if forward is None:
                text = "no forward seen yet"
            elif not forward.layouts:
                text = forward.reason
            else:
                only = f" (modules {', '.join(forward.modules)} only)" if forward.modules else ""
                text = "; ".join(f"{lay.source} [{lay.summary()}]" for lay in forward.layouts) + only
            found.append((name, text))
        return setting, tuple(found)
