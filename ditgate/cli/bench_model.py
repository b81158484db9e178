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

import dataclasses
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from .. import Plan, attach
from ..forms import SPARSE_PRIORITY, Precision
from ..gate import Receipt, compare, resolve_profile
from ..gate.linear import LinearSetting
from ..hosts.linear_weights import tensor_bytes
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
    weight_bytes: int | None = None  # the denoiser's weights on the device while the row runs
    check: str = ""  # what the whole-model check took back at calibration (``check_text``)
    plan_of: str = ""  # the row whose plan this one re-applied instead of calibrating (``DitgateRow.plan_of``)


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
    linear: LinearSetting | None = None  # the row routes the linear sites too (``attach(..., linear=...)``)
    # the key of the row whose calibrated plan (its receipt) this row re-applies instead of calibrating its own: the
    # later linear-setting rows, so that they run the first one's routes and differ from it in their setting alone
    plan_of: str | None = None

    @property
    def name(self) -> str:
        return f"ditgate {self.key}"

    def attach(self, model, receipt: Receipt | None = None) -> Plan:
        if self.static_form is not None:
            return attach(model, forms=[self.static_form], measure=False, sparse=self.sparse)
        if receipt is not None:
            return attach(model, receipt=receipt, on_new_shape="host", sparse=self.sparse, linear=self.linear)
        # no timing cache: each run's cold pass is a first calibration (``bench calibration`` times a second one)
        return attach(model, profile=self.profile, sparse=self.sparse, timing_cache=False, progress=False,
                      linear=self.linear)


def ditgate_rows(profiles: Sequence[str], sparse: SparseSetting | None = None,
                 static_forms: Sequence[str] = (),
                 linear: LinearSetting | Sequence[LinearSetting] | None = None) -> list[DitgateRow]:
    """A row per profile; with ``sparse``, one more per profile that allows bounded forms (the sparse forms
    are bounded-error) and one per ``static_forms``; with ``linear``, beside each measured row of a profile that
    allows bounded forms, the same row with the linear sites routed too ("... +linear"), once per setting where
    several are given (the later ones named by how they quantize an activation's output: "... +linear fused"), so
    that one run interleaves them. The later ones re-apply the first one's calibrated plan (``plan_of``): the gate
    chooses from noisy timings, and two calibrations of one model can route different sites, which an A/B of the
    settings must not measure. Raises ValueError where a sparse or linear row was asked for and none can be
    made, before any model is built."""
    rows = _sparse_rows(profiles, sparse, static_forms)
    if linear is None:
        return rows
    settings = [linear] if isinstance(linear, LinearSetting) else list(linear)
    if any(settings.count(s) > 1 for s in settings):
        raise ValueError("the same linear setting twice would make the same rows twice")

    def suffix(i: int, setting: LinearSetting) -> str:
        return " +linear" if i == 0 else f" +linear {setting.activation_quantization}"

    bounded = [r for r in rows if r.static_form is None and r.profile != "quality"
               and Precision.BOUNDED in resolve_profile(r.profile).precisions]
    if not bounded or not settings:
        raise ValueError(f"linear forms are bounded-error; none of the profiles {list(profiles)} allows them "
                         "(add balanced or speed)")
    out = []
    for row in rows:
        out.append(row)
        if row in bounded:
            first = row.key + suffix(0, settings[0])
            out += [dataclasses.replace(row, key=row.key + suffix(i, s), linear=s, plan_of=first if i else None)
                    for i, s in enumerate(settings)]
    return out


def shared_receipt(row: DitgateRow, receipts: dict, key) -> Receipt | None:
    """The receipt ``row`` re-applies (``receipts[key]``, ``key`` naming its ``plan_of`` row), or None for a row that
    calibrates its own plan; RuntimeError where that row made none (it raised)."""
    if row.plan_of is None:
        return None
    shared = receipts.get(key)
    if shared is None:
        raise RuntimeError(f"the row whose plan it re-applies ({row.plan_of!r}) made none")
    return shared


def only_rows(rows: Sequence[DitgateRow], texts: Sequence[str]) -> list[DitgateRow]:
    """The rows whose name contains one of ``texts`` (``--only``); a kept row whose ``plan_of`` row was not kept
    calibrates its own plan."""
    kept = [r for r in rows if any(text in r.name for text in texts)]
    keys = {r.key for r in kept}
    return [r if r.plan_of is None or r.plan_of in keys else dataclasses.replace(r, plan_of=None) for r in kept]


def activation_sites_text(plan: Plan) -> str:
    """"; 16 routed linear sites take an activation's output": where a compiled graph's two activation
    quantizations (apart, fused) differ, so that an A/B of them says how much it could show."""
    if plan.linear is None:
        return ""
    routed = sum(1 for r in plan.linear.routers if r.after_activation and r.custody.payload_form is not None)
    return f"; {routed} routed linear site(s) take an activation's output"


def _sparse_rows(profiles: Sequence[str], sparse: SparseSetting | None,
                 static_forms: Sequence[str]) -> list[DitgateRow]:
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
    """Calibrate ``row`` once (its cold pass; a row with ``plan_of`` re-applies that row's receipt instead); every
    timed pass re-attaches from the receipt that wrote (a static row attaches as it is) and, before detaching,
    counts the sites each route served most."""
    cfg = _Config(row.name, "ditgate", lambda: None, lambda: None, [], [])
    try:
        if progress:
            progress(f"calibrating {row.name}")
        _sync(device)
        shared = shared_receipt(row, receipts, row.plan_of)
        t0 = time.perf_counter()
        plan = row.attach(model, shared)
        with torch.no_grad():
            model(**calib_inputs)
        _sync(device)
        cfg.cold_ms = (time.perf_counter() - t0) * 1e3
        receipt = plan.receipt() if row.static_form is None else None
        if receipt is not None:
            receipts[row.key] = receipt
        explains[row.key] = plan.explain()
        cfg.plan_of = row.plan_of or ""
        cfg.check = check_text(plan)
        plan.detach()
    except Exception as exc:
        cfg.status, cfg.reason = "raised", f"{type(exc).__name__}: {exc}"[:300]
        return cfg
    holder: dict = {}

    def enter():
        holder["plan"] = row.attach(model, receipt)
        cfg.weight_bytes = device_weight_bytes(model, device, holder["plan"])

    def leave():
        plan = holder.pop("plan")
        cfg.served = served_routes(plan)
        plan.detach()

    cfg.enter, cfg.leave = enter, leave
    return cfg


def served_routes(plan: Plan) -> Counter:
    """How many sites each route served most, attention and linear sites apart ("linear int8_linear": 20)."""
    report = plan.report()
    served = Counter(s.serving for s in report.sites if s.calls)
    if report.linear is not None:
        served += Counter(f"linear {s.serving}" for s in report.linear.sites if s.calls)
    return served


def chosen_routes(plan: Plan) -> Counter:
    """How many sites each route was chosen for, by their last verdicts (what a graph traced after calibration
    calls: the calibrating pass itself ran the host; a static plan, which has none, by what served), attention and
    linear sites apart."""
    report = plan.report()
    chosen = Counter((s.verdicts[-1].form or "host") if s.verdicts else s.serving for s in report.sites)
    if report.linear is not None:
        chosen += Counter(f"linear {s.weights}" for s in report.linear.sites)
    return chosen


def device_weight_bytes(model: torch.nn.Module, device: torch.device, plan: Plan | None = None) -> int:
    """Bytes of the denoiser's weights on ``device``: its parameters and buffers there (a quantized site's 8-bit
    weights and scales, not its stand-in), plus host weights a plan keeps there beside them (``keep_host="device"``).
    On a CPU the held copies are in the same memory but not counted: the figure is what the module holds."""
    tensors = [*model.parameters(), *model.buffers()]
    total = sum(tensor_bytes(t) for t in tensors if t.device.type == device.type)
    if plan is not None and plan.linear is not None:
        total += sum(tensor_bytes(r.custody.original) for r in plan.linear.routers
                     if r.custody.released_to == "device" and r.custody.original.device.type == device.type)
    return total


def weights_text(n: int | None, stock: int | None) -> str:
    """"; weights 2.61 GiB (0.55x stock)": the denoiser's resident weights while the row ran."""
    if n is None:
        return ""
    ratio = f" ({n / stock:.2f}x stock)" if stock else ""
    size = f"{n / 2**30:.3f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"
    return f"; weights {size}{ratio}"


def profile_pass(model, inputs: dict, device: torch.device) -> GpuBusy | str:
    def forward():
        with torch.no_grad():
            model(**inputs)

    try:
        return measure_gpu_busy(forward, device)
    except Exception as exc:  # the profiler is not what is being measured: the row keeps its times
        return f"the profiler raised {type(exc).__name__}: {exc}"[:200]


def busy_text(busy: GpuBusy | str | None) -> str:
    if busy is None:
        return ""
    return "; " + (busy.text() if isinstance(busy, GpuBusy) else f"GPU busy not measured: {busy}")


def busy_kernels(busy: GpuBusy | str | None, top: int = 25) -> tuple[tuple[str, float, int], ...]:
    """The longest kernels of a row's profiled pass, for its JSON row (none where it was not profiled)."""
    return busy.kernels[:top] if isinstance(busy, GpuBusy) else ()


def _calibration_text(cfg: _Config, native: _Config | None) -> str:
    """"; calibration 4.1 s = 6.5 forwards": a ditgate row's cold pass (attach, the calibrating forward and the
    whole-model check) over one warm stock forward."""
    if cfg.kind != "ditgate" or cfg.cold_ms is None:
        return ""
    if cfg.plan_of:
        return f"; the plan of {cfg.plan_of!r} re-applied (cold pass {cfg.cold_ms / 1e3:.1f} s)"
    if native is None:
        return ""
    return f"; calibration {cfg.cold_ms / 1e3:.1f} s = {cfg.cold_ms / statistics.median(native.samples):.1f} forwards"


def check_text(plan: Plan) -> str:
    """"; the whole-model check took back 136 route(s) (whole model 0.695x, ...)": what the row lost to the check, so
    that a row which runs (nearly) stock says why in its own line."""
    taken = [w for w in plan.report().whole_model if w.reverted]
    return "".join(f"; the whole-model check took back {len(w.reverted)} route(s) ({w.note[:160]})" for w in taken)


def served_text(served: Counter | None) -> str:
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
            if cfg.kind == "stock":
                cfg.weight_bytes = device_weight_bytes(model, device)
            try:
                if r == 0:  # a warm-up pass for this row (kernel loads, compiles)
                    t_cold, _, _ = _timed_forward(model, inputs, device, 1)
                    cfg.cold_ms = cfg.cold_ms if cfg.cold_ms is not None else t_cold
                ms, peak, out = _timed_forward(model, inputs, device, steps)
                if gpu_busy and r == rounds - 1:
                    cfg.busy = profile_pass(model, inputs, device)
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
                             detail=f"{len(cfg.samples)} rounds" + _calibration_text(cfg, native) + cfg.check
                             + weights_text(cfg.weight_bytes, native.weight_bytes if native else None)
                             + served_text(cfg.served) + busy_text(cfg.busy), weight_bytes=cfg.weight_bytes,
                             kernels=busy_kernels(cfg.busy)))
    return rows, {"explain": explains, "receipts": {p: r.to_json() for p, r in receipts.items()}}
