"""``ditgate bench model``: stock diffusers backends and ditgate profiles on one denoiser, interleaved.

Rows, all in one process on one model: the stock model under each diffusers attention backend
(``native``, ``_native_cudnn``, ``_native_flash``, ... whatever is usable here; the others say why)
and ditgate under each profile, with the sparse stage where asked (``DitgateRow``: per profile that allows
bounded forms, and per block-sparse form served without measuring). Each ditgate row is calibrated once (its
cold pass, reported apart), then every round runs every row once on that round's fresh random inputs, rotating
the order: a stock row sets its backend and puts the process default back afterwards (diffusers'
``reset_attention_backend`` alone leaves the last backend as the process default), a ditgate row re-attaches
from the receipt its calibration wrote (no measuring) and detaches after, counting the sites each route served.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from .. import Plan, attach
from ..forms import SPARSE_PRIORITY, Precision
from ..gate import Receipt, compare, resolve_profile
from ..hosts import model_output
from ..models.presets import ModelPreset
from ..sparse.stage import SparseSetting
from .bench_output import BenchRow
from .gpu_busy import GpuBusy, measure_gpu_busy

DEFAULT_BACKENDS = ("native", "_native_cudnn", "_native_flash", "_native_efficient", "flex", "sage",
                    "flash_4_hub")
# diffusers' flex backend runs flex_attention uncompiled, materialising the whole score matrix per call.
EAGER_FLEX_MAX_TOKENS = 16384


@dataclass
class _Config:
    name: str
    kind: str  # "stock" | "ditgate"
    enter: Callable[[], None]
    leave: Callable[[], None]
    samples: list
    peaks: list
    output: torch.Tensor | None = None
    cold_ms: float | None = None
    status: str = "ok"
    reason: str = ""
    served: Counter | None = None  # a ditgate row's sites per the route that served them most
    busy: GpuBusy | str | None = None  # the GPU's share of one pass, or why it was not measured


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_forward(model, inputs: dict, device: torch.device, steps: int) -> tuple[float, float | None, torch.Tensor]:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    _sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        for _ in range(steps):
            out = model_output(model(**inputs))
    _sync(device)
    ms = (time.perf_counter() - t0) * 1e3 / steps
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return ms, peak, out


def interleaved(preset: ModelPreset, model, device: torch.device, dtype: torch.dtype, configs: Sequence,
                rounds: int, progress=None) -> Iterator[tuple[int, dict, object]]:
    """(round, its inputs, a row) for every round and every row still "ok", on each round's fresh random inputs
    (seeded by the round), the rows' order rotated by one per round."""
    runnable = [c for c in configs if c.status == "ok"]
    for r in range(rounds):
        inputs = preset.inputs(model, device, dtype, seed=r)
        order = runnable[r % len(runnable):] + runnable[: r % len(runnable)] if runnable else []
        for cfg in order:
            if cfg.status != "ok":
                continue
            if progress:
                progress(f"round {r + 1}/{rounds}: {cfg.name}")
            yield r, inputs, cfg


def failed(cfg, exc: Exception) -> None:
    """A row that raised, with the reason: out of memory (the allocator's cache emptied for the rows after it)
    or anything else."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        cfg.status, cfg.reason = "out of memory", str(exc).split("\n")[0][:200]
        torch.cuda.empty_cache()
    else:
        cfg.status, cfg.reason = "raised", f"{type(exc).__name__}: {exc}"[:300]


def record(cfg, r: int, ms: float, peak: float | None, out: torch.Tensor) -> None:
    """A timed pass of a row; round 0's output kept (a copy: a CUDA graph's output is overwritten by its next
    replay) for the accuracy columns."""
    cfg.samples.append(ms)
    cfg.peaks.append(peak)
    if r == 0:
        cfg.output = out.detach().float().clone()


def _stock_config(model, backend: str, tokens: int, forced: bool) -> _Config:
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    saved = _AttentionBackendRegistry._active_backend
    cfg = _Config(f"stock {backend}", "stock", lambda: None, lambda: None, [], [])
    if backend == "flex" and tokens > EAGER_FLEX_MAX_TOKENS and not forced:
        cfg.status, cfg.reason = "skipped", (f"diffusers' flex backend runs flex_attention eagerly and "
                                             f"materialises the score matrix at {tokens} tokens; name it in "
                                             f"--backends to force")
        return cfg
    try:
        AttentionBackendName(backend)
    except ValueError:
        cfg.status, cfg.reason = "unavailable", f"diffusers {__import__('diffusers').__version__} has no backend {backend!r}"
        return cfg

    def enter():
        model.set_attention_backend(backend)

    def leave():
        model.reset_attention_backend()
        _AttentionBackendRegistry.set_active_backend(saved)  # reset leaves the last backend as the default

    cfg.enter, cfg.leave = enter, leave
    return cfg


@dataclass(frozen=True)
class DitgateRow:
    """One ditgate row: a profile the gate measures under, optionally with the sparse stage, or one form
    served without measuring (``static_form``: the speed a sparse consumer gives where the gate's floors
    would refuse it, as on random weights)."""

    key: str  # the row's name without "ditgate ", and its key in the JSON's "explain"
    profile: str | None = None
    sparse: SparseSetting | None = None
    static_form: str | None = None

    @property
    def name(self) -> str:
        return f"ditgate {self.key}"

    def attach(self, model, receipt: Receipt | None = None) -> Plan:
        if self.static_form is not None:
            return attach(model, forms=[self.static_form], measure=False, sparse=self.sparse)
        if receipt is not None:
            return attach(model, receipt=receipt, on_new_shape="host", sparse=self.sparse)
        return attach(model, profile=self.profile, sparse=self.sparse)


def ditgate_rows(profiles: Sequence[str], sparse: SparseSetting | None = None,
                 static_forms: Sequence[str] = ()) -> list[DitgateRow]:
    """A row per profile; with ``sparse``, one more per profile that allows bounded forms (the sparse forms
    are bounded-error) and one per ``static_forms``. Raises ValueError where a sparse row was asked for and
    none can be made, before any model is built."""
    rows = [DitgateRow(prof, profile=prof) for prof in profiles]
    if sparse is None:
        if static_forms:
            raise ValueError("static sparse rows need a sparse budget")
        return rows
    budget = sparse.schedule.budget
    bounded = [p for p in profiles if Precision.BOUNDED in resolve_profile(p).precisions]
    unknown = [f for f in static_forms if f not in SPARSE_PRIORITY]
    if unknown:
        raise ValueError(f"static sparse forms must be among {SPARSE_PRIORITY}, got {unknown}")
    if not bounded and not static_forms:
        raise ValueError(f"sparse attention is bounded-error; none of the profiles {list(profiles)} allows it "
                         "(add balanced or speed)")
    rows += [DitgateRow(f"{p} sparse {budget:g}", profile=p, sparse=sparse) for p in bounded]
    rows += [DitgateRow(f"static {f} sparse {budget:g}", sparse=sparse, static_form=f) for f in static_forms]
    return rows


def _ditgate_config(row: DitgateRow, model, calib_inputs: dict, device: torch.device, progress,
                    explains: dict[str, str], receipts: dict[str, Receipt]) -> _Config:
    """Calibrate ``row`` once (its cold pass); every timed pass re-attaches from the receipt that wrote (a
    static row attaches as it is) and, before detaching, counts the sites each route served most."""
    cfg = _Config(row.name, "ditgate", lambda: None, lambda: None, [], [])
    try:
        if progress:
            progress(f"calibrating {row.name}")
        _sync(device)
        t0 = time.perf_counter()
        plan = row.attach(model)
        with torch.no_grad():
            model(**calib_inputs)
        _sync(device)
        cfg.cold_ms = (time.perf_counter() - t0) * 1e3
        receipt = plan.receipt() if row.static_form is None else None
        if receipt is not None:
            receipts[row.key] = receipt
        explains[row.key] = plan.explain()
        plan.detach()
    except Exception as exc:
        cfg.status, cfg.reason = "raised", f"{type(exc).__name__}: {exc}"[:300]
        return cfg
    holder: dict = {}

    def enter():
        holder["plan"] = row.attach(model, receipt)

    def leave():
        plan = holder.pop("plan")
        cfg.served = Counter(s.serving for s in plan.report().sites if s.calls)
        plan.detach()

    cfg.enter, cfg.leave = enter, leave
    return cfg


def _busy(model, inputs: dict, device: torch.device) -> GpuBusy | str:
    def forward():
        with torch.no_grad():
            model(**inputs)

    try:
        return measure_gpu_busy(forward, device)
    except Exception as exc:  # the profiler is not what is being measured: the row keeps its times
        return f"the profiler raised {type(exc).__name__}: {exc}"[:200]


def _busy_text(busy: GpuBusy | str | None) -> str:
    if busy is None:
        return ""
    return "; " + (busy.text() if isinstance(busy, GpuBusy) else f"GPU busy not measured: {busy}")


def _served_text(served: Counter | None) -> str:
    """"; sites: fp8_sparse 8, fa4 8": how many sites each route served most, in the last timed pass."""
    if not served:
        return ""
    return "; sites: " + ", ".join(f"{route} {n}" for route, n in served.most_common())


def bench_model(preset: ModelPreset, model: torch.nn.Module, device: torch.device, dtype: torch.dtype,
                backends: Sequence[str], profiles: Sequence[str] | Sequence[DitgateRow], rounds: int,
                steps: int = 1, forced_backends: Sequence[str] = (), progress=None,
                gpu_busy: bool = False) -> tuple[list[BenchRow], dict]:
    """``profiles``: profile names, or ``DitgateRow``s (``ditgate_rows``) for the sparse stage's rows.
    ``gpu_busy``: after the last round's timed pass, one more pass per row under the profiler, for the share of
    its span the GPU was working (``gpu_busy.measure_gpu_busy``; not part of the timing)."""
    tokens = preset.video_tokens + (preset.geometry.get("text", 0) if preset.family == "flux" else 0)
    configs: list[_Config] = [_stock_config(model, b, tokens, b in forced_backends) for b in backends]
    explains: dict[str, str] = {}
    receipts: dict[str, Receipt] = {}
    calib_inputs = preset.inputs(model, device, dtype, seed=1000)
    wanted = [r if isinstance(r, DitgateRow) else DitgateRow(r, profile=r) for r in profiles]
    configs += [_ditgate_config(row, model, calib_inputs, device, progress, explains, receipts) for row in wanted]
    baseline_out: dict[int, torch.Tensor] = {}
    for r, inputs, cfg in interleaved(preset, model, device, dtype, configs, rounds, progress):
        try:
            cfg.enter()
            try:
                if r == 0:  # a warm-up pass for this row (kernel loads, compiles)
                    t_cold, _, _ = _timed_forward(model, inputs, device, 1)
                    cfg.cold_ms = cfg.cold_ms if cfg.cold_ms is not None else t_cold
                ms, peak, out = _timed_forward(model, inputs, device, steps)
                if gpu_busy and r == rounds - 1:
                    cfg.busy = _busy(model, inputs, device)
            finally:
                cfg.leave()
        except Exception as exc:
            failed(cfg, exc)
            continue
        record(cfg, r, ms, peak, out)
        if cfg.name == "stock native" and r == 0:
            baseline_out[0] = cfg.output
    native = next((c for c in configs if c.name == "stock native" and c.samples), None)
    rows = []
    for cfg in configs:
        if not cfg.samples or cfg.status != "ok":
            rows.append(BenchRow.not_run(preset.name, cfg.name, cfg.kind,
                                         cfg.status if cfg.status != "ok" else "raised", cfg.reason, cfg.cold_ms))
            continue
        med = statistics.median(cfg.samples)
        acc = compare(cfg.output, baseline_out[0]) if 0 in baseline_out and cfg.output is not None else None
        rows.append(BenchRow(preset.name, cfg.name, cfg.kind, "ok", "", med, min(cfg.samples), max(cfg.samples),
                             cfg.cold_ms, None, statistics.median(native.samples) / med if native else None,
                             acc.cosine if acc else None, acc.psnr_db if acc else None,
                             max(cfg.peaks) if cfg.peaks[0] is not None else None,
                             detail=f"{len(cfg.samples)} rounds" + _served_text(cfg.served) + _busy_text(cfg.busy)))
    return rows, {"explain": explains, "receipts": {p: r.to_json() for p, r in receipts.items()}}
