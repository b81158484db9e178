"""``ditgate bench calibration``: what calibration costs, in seconds and in forwards of the stock model.

For each profile (and, with ``--sparse``, the sparse stage under each bounded profile) on one denoiser:

- the gate as it runs by default (timing shared per shape key, screening, a fresh timing cache file), first in the
  process: it pays the process's kernel compiles and loads, as a user's first start does,
- with ``--per-site``, the per-site gate of before (every candidate in paired rounds at every site) and the default
  gate once more, both warm, on the same inputs, and a side-by-side table of the form each chose per site and key,
- with ``--second-process``, a new Python process that attaches with the timing cache the first run wrote (what a
  server pays at its second start): only accuracy is measured there.

Calibration time is ``attach`` plus the calibrating forward (which includes the whole-model check), over one warm
stock forward on the same inputs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import attach
from ..gate import resolve_profile
from ..gate.compiles import watch_compiles
from ..models.presets import ModelPreset, get_preset
from ..sparse.schedule import BudgetSchedule
from ..sparse.stage import SparseSetting

CALIBRATION_SEED = 1000  # the inputs every gate calibrates on (bench model's too)


@dataclass(frozen=True)
class CalibrationRun:
    row: str  # "quality", "speed sparse 0.3", each "(shared)", "(per-site)" or "(second process)"
    seconds: float
    forwards: float  # seconds over one warm stock forward
    stock_ms: float
    sites: int
    timings: int  # timings the gate made itself (screening and paired)
    cache_hits: int
    whole_forwards: int
    routes: dict  # "site @ shape key" -> the form chosen, or "host"
    first_call_s: dict = dataclasses.field(default_factory=dict)  # form -> seconds its first calls took (compiles)
    # where the seconds went: attach (form probes and imports), the contests per form (first calls, accuracy,
    # timing), the whole-model check, and the rest of the calibrating forward (the host's own calls, hooks)
    attach_s: float = 0.0
    contest_s: dict = dataclasses.field(default_factory=dict)
    whole_s: float = 0.0
    whole_from_cache: bool = False
    measure_s: float = 0.0  # all of the gate's measuring in the calibrating forward (the contests, and what's around)
    probe_s: dict = dataclasses.field(default_factory=dict)  # form -> its availability probe (imports)
    # Triton's compiles (built, and loaded from its disk cache) during attach and the calibrating forward
    kernel_compiles: dict = dataclasses.field(default_factory=dict)
    host_s: float = 0.0  # of ``measure_s``, the host's own calls at the sites measured (their output is returned)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def stock_forward_ms(model, inputs: dict, device: torch.device, samples: int = 3) -> float:
    with torch.no_grad():
        model(**inputs)  # warm-up
        times = []
        for _ in range(samples):
            _sync(device)
            t0 = time.perf_counter()
            model(**inputs)
            _sync(device)
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def calibrate_once(model, inputs: dict, device: torch.device, row: str, profile, sparse: SparseSetting | None,
                   timing_cache, stock_ms: float) -> CalibrationRun:
    _sync(device)
    with watch_compiles() as compiles:
        t0 = time.perf_counter()
        plan = attach(model, profile=profile, sparse=sparse, timing_cache=timing_cache, progress=False)
        attach_s = time.perf_counter() - t0
        with torch.no_grad():
            model(**inputs)
        _sync(device)
        seconds = time.perf_counter() - t0
    book = plan.chooser.book
    routes = {f"{v.site} @ {v.shape_key}": v.form or "host" for v in plan.chooser.verdicts.values()}
    checks = plan.report().whole_model
    whole = sum(w.forwards for w in checks)
    first: dict[str, float] = {}
    for v in plan.chooser.verdicts.values():
        for m in v.measured:
            if m.timed_at == v.site and not m.from_cache:  # where its first call at this key happened
                first[m.form] = first.get(m.form, 0.0) + m.first_ms / 1e3
    plan.detach()
    return CalibrationRun(row, seconds, seconds * 1e3 / stock_ms, stock_ms, len(routes), book.timed, book.cache_hits,
                          whole, routes, first, attach_s, {f: round(t, 3) for f, t in book.spent_s.items()},
                          sum(w.seconds for w in checks), any(w.from_cache for w in checks), plan.chooser.spent_s,
                          {n: round(f.probe_s, 3) for n, f in plan.forms.items() if f.probe_s > 0.005},
                          dataclasses.asdict(compiles.result()), round(plan.chooser.host_s, 4))


def _warming(profile: str, warm_ahead: bool, compile_ahead: bool = True):
    """The profile, with its first calls made one after another where ``warm_ahead`` is False, and its kernels
    compiled by those first calls (not all at once ahead) where ``compile_ahead`` is False."""
    if warm_ahead and compile_ahead:
        return profile
    return dataclasses.replace(resolve_profile(profile), warm_ahead=warm_ahead, compile_ahead=compile_ahead)


def _setting(budget: float | None, block: int) -> SparseSetting | None:
    if budget is None:
        return None
    return SparseSetting(BudgetSchedule(budget, dense_steps=0, dense_layers=0), block=block)


def _rows(profiles: list[str], budget: float | None, sparse_only: bool = False) -> list[tuple[str, str, float | None]]:
    """(row name, profile, sparse budget) per row; ``sparse_only``: the sparse rows alone, so that the first of them
    is a process's first calibration (its kernels not compiled by a dense row before)."""
    rows = [] if sparse_only and budget is not None else [(p, p, None) for p in profiles]
    if budget is not None:
        rows += [(f"{p} sparse {budget:g}", p, budget) for p in profiles
                 if len(resolve_profile(p).precisions) > 1]
    return rows


def _child_argv(args, row: tuple[str, str, float | None], cache: Path) -> list[str]:
    name, profile, budget = row
    argv = [sys.executable, "-m", "ditgate.cli.bench_calibration", "--child", "--preset", args.preset,
            "--profile", profile, "--row", name, "--cache", str(cache), "--sparse-block", str(args.sparse_block)]
    if budget is not None:
        argv += ["--sparse", str(budget)]
    if args.layers is not None:
        argv += ["--layers", str(args.layers)]
    if not args.warm_ahead:
        argv.append("--no-warm-ahead")
    if not args.compile_ahead:
        argv.append("--no-compile-ahead")
    if args.device:
        argv += ["--device", args.device]
    if args.dtype:
        argv += ["--dtype", args.dtype]
    return argv


def bench_calibration(preset: ModelPreset, device: torch.device, dtype: torch.dtype, args, out: Path,
                      progress=None) -> tuple[list[CalibrationRun], list[dict]]:
    model = preset.build(device, dtype)
    inputs = preset.inputs(model, device, dtype, seed=CALIBRATION_SEED)
    stock_ms = stock_forward_ms(model, inputs, device)
    runs: list[CalibrationRun] = []
    caches: dict[str, Path] = {}
    comparisons: list[dict] = []
    for name, profile, budget in _rows(args.profiles, args.sparse, args.sparse_only):
        profile = _warming(profile, args.warm_ahead, args.compile_ahead)
        sparse = _setting(budget, args.sparse_block)
        cache = caches[name] = out / f"timings-{name.replace(' ', '-')}.json"
        cache.unlink(missing_ok=True)
        if progress:
            progress(f"calibrating {name} (shared timing)")
        shared = calibrate_once(model, inputs, device, f"{name} (shared)", profile, sparse, cache, stock_ms)
        runs.append(shared)
        if args.per_site:  # both warm (the first run paid this process's compiles and loads): a fair comparison
            if progress:
                progress(f"calibrating {name} (per-site gate)")
            per_site = dataclasses.replace(resolve_profile(profile), screen_margin=None, share_timing=False)
            old = calibrate_once(model, inputs, device, f"{name} (per-site, warm)", per_site, sparse, False, stock_ms)
            warm = calibrate_once(model, inputs, device, f"{name} (shared, warm)", profile, sparse, False, stock_ms)
            runs += [old, warm]
            comparisons.append({"row": name, "sites": [
                {"site": k, "per_site": old.routes.get(k, "-"), "shared": warm.routes.get(k, "-")}
                for k in sorted(set(old.routes) | set(warm.routes))]})
    del model, inputs
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if args.second_process:
        for row in _rows(args.profiles, args.sparse, args.sparse_only):
            if progress:
                progress(f"calibrating {row[0]} in a second process (timing cache)")
            done = subprocess.run(_child_argv(args, row, caches[row[0]]), capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"the second process failed ({done.returncode}): {done.stderr[-2000:]}")
            runs.append(CalibrationRun(**json.loads(done.stdout.strip().splitlines()[-1])))
    return runs, comparisons


def _child(argv: list[str]) -> int:
    """The second process: one calibration with the given timing cache, printed as one JSON line."""
    p = argparse.ArgumentParser()
    for flag in ("--preset", "--profile", "--row", "--cache", "--device", "--dtype"):
        p.add_argument(flag, default=None)
    p.add_argument("--child", action="store_true")
    p.add_argument("--sparse", type=float, default=None)
    p.add_argument("--sparse-block", type=int, default=128)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--no-warm-ahead", dest="warm_ahead", action="store_false")
    p.add_argument("--no-compile-ahead", dest="compile_ahead", action="store_false")
    args = p.parse_args(argv)
    from .bench import _setup

    device, dtype, _ = _setup(argparse.Namespace(device=args.device, dtype=args.dtype, out="."))
    preset = get_preset(args.preset)
    if args.layers is not None:
        preset = preset.with_layers(args.layers)
    model = preset.build(device, dtype)
    inputs = preset.inputs(model, device, dtype, seed=CALIBRATION_SEED)
    stock_ms = stock_forward_ms(model, inputs, device)
    profile = _warming(args.profile, args.warm_ahead, args.compile_ahead)
    run = calibrate_once(model, inputs, device, f"{args.row} (second process)", profile,
                         _setting(args.sparse, args.sparse_block), Path(args.cache), stock_ms)
    print(json.dumps(dataclasses.asdict(run)))
    return 0


def write_plot(path: Path, title: str, runs: list[CalibrationRun]) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(runs) + 1.2))
    names = [r.row for r in runs][::-1]
    values = [r.forwards for r in runs][::-1]
    bars = ax.barh(names, values, color=["#888" if "per-site" in n else "#2a7" for n in names])
    for bar, r in zip(bars, runs[::-1]):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {r.forwards:.1f} ({r.seconds:.1f} s)",
                va="center", fontsize=8)
    ax.set_xlabel("calibration, in stock forwards (attach + calibrating forward + whole-model check)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


if __name__ == "__main__":
    if "--child" in sys.argv:
        sys.exit(_child(sys.argv[1:]))
    raise SystemExit("use `ditgate bench calibration`")
