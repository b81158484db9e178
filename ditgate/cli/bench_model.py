"""``ditgate bench model``: stock diffusers backends and ditgate profiles on one denoiser, interleaved.

Rows, all in one process on one model: the stock model under each diffusers attention backend
(``native``, ``_native_cudnn``, ``_native_flash``, ... whatever is usable here; the others say why)
and ditgate under each profile. Each profile is calibrated once (its cold pass, reported apart), then
every round runs every row once on that round's fresh random inputs, rotating the order: a stock row
sets its backend and puts the process default back afterwards (diffusers' ``reset_attention_backend``
alone leaves the last backend as the process default), a ditgate row re-attaches from the receipt its
calibration wrote (no measuring) and detaches after.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .. import attach
from ..gate import compare
from ..hosts import model_output
from ..models.presets import ModelPreset
from .bench_output import BenchRow

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


def bench_model(preset: ModelPreset, model: torch.nn.Module, device: torch.device, dtype: torch.dtype,
                backends: Sequence[str], profiles: Sequence[str], rounds: int, steps: int = 1,
                forced_backends: Sequence[str] = (), progress=None) -> tuple[list[BenchRow], dict]:
    tokens = preset.video_tokens + (preset.geometry.get("text", 0) if preset.family == "flux" else 0)
    configs: list[_Config] = [_stock_config(model, b, tokens, b in forced_backends) for b in backends]
    receipts: dict[str, object] = {}
    explains: dict[str, str] = {}
    calib_inputs = preset.inputs(model, device, dtype, seed=1000)
    for prof in profiles:
        cfg = _Config(f"ditgate {prof}", "ditgate", lambda: None, lambda: None, [], [])
        try:
            if progress:
                progress(f"calibrating ditgate profile {prof}")
            _sync(device)
            t0 = time.perf_counter()
            plan = attach(model, profile=prof)
            with torch.no_grad():
                model(**calib_inputs)
            _sync(device)
            cfg.cold_ms = (time.perf_counter() - t0) * 1e3
            receipts[prof] = plan.receipt()
            explains[prof] = plan.explain()
            plan.detach()
        except Exception as exc:
            cfg.status, cfg.reason = "raised", f"{type(exc).__name__}: {exc}"[:300]
            configs.append(cfg)
            continue
        holder: dict = {}

        def enter(prof=prof, holder=holder):
            holder["plan"] = attach(model, receipt=receipts[prof], on_new_shape="host")

        def leave(holder=holder):
            holder.pop("plan").detach()

        cfg.enter, cfg.leave = enter, leave
        configs.append(cfg)
    runnable = [c for c in configs if c.status == "ok"]
    baseline_out: dict[int, torch.Tensor] = {}
    for r in range(rounds):
        inputs = preset.inputs(model, device, dtype, seed=r)
        order = runnable[r % len(runnable):] + runnable[: r % len(runnable)] if runnable else []
        for cfg in order:
            if cfg.status != "ok":
                continue
            if progress:
                progress(f"round {r + 1}/{rounds}: {cfg.name}")
            try:
                cfg.enter()
                try:
                    if r == 0:  # a warm-up pass for this row (kernel loads, compiles)
                        t_cold, _, _ = _timed_forward(model, inputs, device, 1)
                        cfg.cold_ms = cfg.cold_ms if cfg.cold_ms is not None else t_cold
                    ms, peak, out = _timed_forward(model, inputs, device, steps)
                finally:
                    cfg.leave()
            except torch.cuda.OutOfMemoryError as exc:
                cfg.status, cfg.reason = "out of memory", str(exc).split("\n")[0][:200]
                torch.cuda.empty_cache()
                continue
            except Exception as exc:
                cfg.status, cfg.reason = "raised", f"{type(exc).__name__}: {exc}"[:300]
                continue
            cfg.samples.append(ms)
            cfg.peaks.append(peak)
            if r == 0:
                cfg.output = out.detach().float()
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
                             detail=f"{len(cfg.samples)} rounds"))
    return rows, {"explain": explains, "receipts": {p: r.to_json() for p, r in receipts.items()}}
