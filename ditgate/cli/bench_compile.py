"""``ditgate bench model --compile``: the stock model and each ditgate row under torch.compile, interleaved.

Rows, each on its own copy of the model: a compiled wrapper keeps its model's graphs, and the eager rows'
practice of re-attaching a plan from its receipt for every pass would recompile on every pass.

- ``stock + compile``: the stock model under ``torch.compile`` (diffusers' default attention backend);
- ``<ditgate row> + compile``: each ditgate row (``bench_model.DitgateRow``) attached to its copy and calibrated
  eagerly (one forward: the gate's calibration and whole-model check; a static row attaches as it is), then
  compiled, so the graph is traced with the plan's routes; a row with linear sites times their forms as they run
  compiled (``LinearSetting(compiled=True)``: the product alone); a later linear-setting row re-applies the first
  one's plan of the same mode (``DitgateRow.plan_of``), so that the two differ in the setting alone;
- each further mode asked for (``reduce-overhead``, ``max-autotune``: CUDA graph trees; ``regional``: diffusers'
  ``compile_repeated_blocks(fullgraph=True)`` on the copy, each routed block a graph of its own), the same rows in it.

``cold ms`` is the first compiled call (dynamo, inductor, the first run): compile time, apart from the timed
rounds; a ditgate row's calibration time is in its detail. Every round runs every row once on that round's
fresh inputs (same shapes), rotating the order. ``x baseline`` is against ``stock + compile`` of the same mode,
the cosine against the first row given as ``reference`` (the eager stock output) where there is one. Dynamo's
recompile limit is raised for the run (one cache entry per row and budget on the same code), and put back.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ..gate import compare
from ..hosts import model_output
from ..hosts.regional import repeated_block_counts
from ..models.presets import ModelPreset
from .bench_model import (DitgateRow, activation_sites_text, busy_kernels, busy_text, check_text, chosen_routes,
                          device_weight_bytes, failed, interleaved, profile_pass, record, served_text, shared_receipt,
                          _sync, _timed_forward, weights_text)
from .bench_output import BenchRow

MODES = ("default", "reduce-overhead", "max-autotune", "regional")


@dataclass
class _Compiled:
    name: str
    mode: str
    forward: Callable | None = None
    detail: str = ""
    cold_ms: float | None = None
    status: str = "ok"
    reason: str = ""
    samples: list[float] = field(default_factory=list)
    peaks: list = field(default_factory=list)
    output: torch.Tensor | None = None
    busy: object = None  # --gpu-busy: the profiled pass (GpuBusy) or why there is none
    weight_bytes: int | None = None  # the denoiser's weights resident on the device under this row's plan
    served: Counter | None = None  # the routes its plan chose, per site ("linear fp8_linear": 20)
    plan: object = None  # the plan kept attached to this row's copy, explained again after the rounds


def _make(name: str, mode: str, model: torch.nn.Module, row: DitgateRow | None, calib_inputs: dict,
          device: torch.device, explains: dict[str, str], receipts: dict) -> _Compiled:
    """One compiled row on its own copy of ``model``. A row with ``plan_of`` re-applies the receipt that row's
    calibration left in ``receipts`` (by mode and row key) instead of calibrating; every measured row leaves its own
    there."""
    cfg = _Compiled(name, mode)
    try:
        copy_ = copy.deepcopy(model)
        if row is not None:
            if row.linear is not None:
                row = dataclasses.replace(row, linear=dataclasses.replace(row.linear, compiled=True))
            shared = shared_receipt(row, receipts, (mode, row.plan_of))
            _sync(device)
            t0 = time.perf_counter()
            plan = row.attach(copy_, shared)
            with torch.no_grad():
                copy_(**calib_inputs)  # calibrates (a measured row), eagerly
            _sync(device)
            took = time.perf_counter() - t0
            how = f"the plan of {row.plan_of!r} re-applied ({took:.1f} s)" if shared else f"calibration {took:.1f} s"
            cfg.detail = f"{how}; plan kept attached ({plan.mode})" + check_text(plan) + activation_sites_text(plan)
            if row.static_form is None:
                receipts[(mode, row.key)] = plan.receipt()
            cfg.served = chosen_routes(plan)
            cfg.plan = plan
        cfg.weight_bytes = device_weight_bytes(copy_, device, plan if row is not None else None)
        if mode == "regional":  # diffusers' regional compilation: each repeated block class compiled in place
            copy_.compile_repeated_blocks(fullgraph=True)
            cfg.forward = copy_
        else:
            cfg.forward = torch.compile(copy_) if mode == "default" else torch.compile(copy_, mode=mode)
    except Exception as exc:
        cfg.status, cfg.reason = "raised", f"{type(exc).__name__}: {exc}"[:300]
    return cfg


def bench_compiled(preset: ModelPreset, model: torch.nn.Module, device: torch.device, dtype: torch.dtype,
                   rows: Sequence[DitgateRow], rounds: int, steps: int = 1, modes: Sequence[str] = ("default",),
                   reference: torch.Tensor | None = None, progress=None, gpu_busy: bool = False,
                   explains: dict[str, str] | None = None) -> list[BenchRow]:
    """The compiled rows (see the module docstring); ``reference``: the eager stock output on round 0's inputs;
    ``gpu_busy``: one more pass per row after the last round, under the profiler (not timed); ``explains``
    receives each ditgate row's ``plan.explain()`` after the timed rounds, by row name."""
    explains = {} if explains is None else explains
    calib_inputs = preset.inputs(model, device, dtype, seed=1000)
    configs: list[_Compiled] = []
    receipts: dict = {}  # (mode, row key) -> the receipt of that row's calibration, for rows that re-apply it
    for mode in modes:
        suffix = " + compile" + ("" if mode == "default" else f" ({mode})")
        if progress:
            progress(f"preparing the compiled rows{suffix}")
        configs.append(_make("stock" + suffix, mode, model, None, calib_inputs, device, explains, receipts))
        configs += [_make(row.name + suffix, mode, model, row, calib_inputs, device, explains, receipts)
                    for row in rows]
    # a routed block compiles a graph of its own under regional compilation (hosts.regional), on every row's copy
    blocks = max(repeated_block_counts([model]).values(), default=0)
    limit = max(64, 8 * len(configs), 2 * blocks * len(configs))
    with torch._dynamo.config.patch(recompile_limit=limit, accumulated_recompile_limit=max(256, 4 * limit)):
        for r, inputs, cfg in interleaved(preset, model, device, dtype, configs, rounds, progress):
            try:
                if r == 0:  # compiles: reported apart
                    cfg.cold_ms, _, _ = _timed_forward(cfg.forward, inputs, device, 1)
                ms, peak, out = _timed_forward(cfg.forward, inputs, device, steps)
                if gpu_busy and r == rounds - 1:
                    cfg.busy = profile_pass(cfg.forward, inputs, device)
            except Exception as exc:
                failed(cfg, exc)
                continue
            record(cfg, r, ms, peak, out)
    for cfg in configs:  # after the rounds, so that each site says what its graphs traced, not only calibration's calls
        if cfg.plan is not None:
            try:
                explains[cfg.name] = cfg.plan.explain()
            except Exception as exc:  # the rows' timings stand without it
                explains[cfg.name] = f"explain() raised {type(exc).__name__}: {exc}"
    return _rows(preset, configs, reference)


def _rows(preset: ModelPreset, configs: list[_Compiled], reference: torch.Tensor | None) -> list[BenchRow]:
    baselines = {c.mode: statistics.median(c.samples) for c in configs
                 if c.name.startswith("stock") and c.samples and c.status == "ok"}
    stock_bytes = {c.mode: c.weight_bytes for c in configs if c.name.startswith("stock")}
    rows = []
    for cfg in configs:
        if not cfg.samples or cfg.status != "ok":
            rows.append(BenchRow.not_run(preset.name, cfg.name, "ditgate" if "ditgate" in cfg.name else "stock",
                                         cfg.status if cfg.status != "ok" else "raised", cfg.reason, cfg.cold_ms))
            continue
        med = statistics.median(cfg.samples)
        acc = compare(cfg.output, reference.float()) if reference is not None and cfg.output is not None else None
        base = baselines.get(cfg.mode)
        rows.append(BenchRow(preset.name, cfg.name, "ditgate" if "ditgate" in cfg.name else "stock", "ok", "", med,
                             min(cfg.samples), max(cfg.samples), cfg.cold_ms, None, base / med if base else None,
                             acc.cosine if acc else None, acc.psnr_db if acc else None,
                             max(cfg.peaks) if cfg.peaks[0] is not None else None,
                             detail=f"{len(cfg.samples)} rounds; cold = compile + first call"
                                    + (f"; {cfg.detail}" if cfg.detail else "")
                                    + weights_text(cfg.weight_bytes, stock_bytes.get(cfg.mode))
                                    + served_text(cfg.served) + busy_text(cfg.busy),
                             weight_bytes=cfg.weight_bytes, kernels=busy_kernels(cfg.busy)))
    return rows


def reference_output(preset: ModelPreset, model: torch.nn.Module, device: torch.device,
                     dtype: torch.dtype) -> torch.Tensor:
    """The stock model's eager output on round 0's inputs (what the compiled rows' cosines compare with)."""
    with torch.no_grad():
        return model_output(model(**preset.inputs(model, device, dtype, seed=0))).detach().float().clone()
