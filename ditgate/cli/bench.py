"""``ditgate bench kernels`` and ``ditgate bench model``: tables, JSON, PNG, and a latency gate."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from .bench_output import latency_gate, print_table, write_json, write_plot
from .gpu_busy import kernels_text

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def add_bench_parsers(sub) -> None:
    from ..models.presets import PRESETS
    from .bench_kernels import KERNEL_PRESETS
    from .bench_compile import MODES as COMPILE_MODES
    from .bench_model import DEFAULT_BACKENDS

    bench = sub.add_parser("bench", help="benchmarks: attention kernels, or a whole denoiser forward")
    bsub = bench.add_subparsers(dest="bench_command", required=True)

    k = bsub.add_parser("kernels", help="every available form at the attention shapes of real models")
    k.add_argument("--preset", nargs="+", default=None, choices=sorted(KERNEL_PRESETS), metavar="PRESET",
                   help=f"shape presets: {', '.join(KERNEL_PRESETS)} (default: all but tiny; tiny on CPU)")
    k.add_argument("--shape", action="append", default=[], metavar="H,S,D", help="a custom shape (repeatable)")
    k.add_argument("--forms", nargs="+", default=None, help="only these forms")
    k.add_argument("--warm", type=int, default=20, help="warm timed calls per row (default 20)")
    _common(k)
    k.set_defaults(func=_run_kernels)

    m = bsub.add_parser("model", help="stock diffusers backends vs ditgate profiles on one denoiser forward")
    m.add_argument("--preset", required=True, choices=sorted(PRESETS), help="model configuration")
    m.add_argument("--weights", default=None, help="a local diffusers model folder to load instead of random weights")
    m.add_argument("--backends", nargs="*", default=None,
                   help=f"diffusers backends (default: {' '.join(DEFAULT_BACKENDS)})")
    m.add_argument("--profiles", nargs="*", default=["quality", "balanced"], help="ditgate profiles")
    m.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    m.add_argument("--steps", type=int, default=1, help="forwards per timed sample (default 1)")
    m.add_argument("--layers", type=int, default=None, metavar="N",
                   help="cut each stack of transformer blocks to its first N (same per-block shapes, less time)")
    m.add_argument("--sparse", type=float, default=None, metavar="BUDGET",
                   help="add a row per bounded profile (balanced, speed) with the sparse stage at this budget on "
                        "every layer but the first --dense-layers; the gate measures its forms at each site")
    m.add_argument("--sparse-static", nargs="+", default=(), metavar="FORM",
                   help="with --sparse, also a row per named block-sparse form serving every self-attention call "
                        "it supports without measuring (its speed where the gate's floors would refuse it)")
    m.add_argument("--sparse-forms", nargs="+", default=None, metavar="FORM",
                   help="the block-sparse forms the gate may measure (default: all)")
    m.add_argument("--sparse-block", type=int, default=128, help="key tile of the sparse stage (default 128)")
    m.add_argument("--dense-layers", type=int, default=0, help="first layers kept dense under --sparse (default 0)")
    m.add_argument("--compile", nargs="*", default=None, choices=COMPILE_MODES, metavar="MODE",
                   help="also the stock model and every ditgate row under torch.compile, each on its own copy of the "
                        "model, compile time as cold ms (modes: default, reduce-overhead, max-autotune: CUDA graph "
                        "trees; regional: compile_repeated_blocks(fullgraph=True); none named: default)")
    m.add_argument("--only", nargs="+", default=None, metavar="TEXT",
                   help="keep only the ditgate rows whose name contains one of these (e.g. --only sparse)")
    m.add_argument("--compiled-only", action="store_true",
                   help="with --compile, of the eager rows only the stock model's (the baseline of 'x stock eager'): "
                        "whole-depth compiled rows in one call's time")
    m.add_argument("--linear", action="store_true",
                   help="beside each row of a bounded profile (balanced, speed; sparse rows too), the same row with the "
                        "denoiser's linear sites routed (8-bit W8A8 forms, gated per site)")
    m.add_argument("--linear-forms", nargs="+", default=None, metavar="FORM",
                   help="with --linear, the linear forms the gate may measure (default: fp8_linear int8_linear; "
                        "fp8_tensor_linear only when named)")
    m.add_argument("--activation-quantization", nargs="+", choices=("apart", "fused"), default=None,
                   help="with --linear, how a compiled graph quantizes an activation's output for the next linear: in a "
                        "kernel of its own (apart, the default) or fused into the activation's kernel by inductor; "
                        "both: a linear row of each, interleaved in one run, the later re-applying the first's plan")
    m.add_argument("--linear-device-time", action="store_true",
                   help="with --linear, a compiled row's plan times its linear sites on the device, replayed from CUDA "
                        "graphs (LinearSetting.device_time), instead of eagerly")
    m.add_argument("--linear-roles", nargs="+", default=None, metavar="ROLE",
                   help="with --linear, the roles whose sites the gate may route (LinearSetting.roles; 'token' for the "
                        "attention projections and feed-forwards, 'all'; default: every role)")
    m.add_argument("--gpu-busy", action="store_true",
                   help="one more pass per row under the profiler: the share of its span the GPU was working (CUDA)")
    m.add_argument("--fuse-projections", action="store_true",
                   help="call the model's fuse_qkv_projections() (diffusers) before every row, stock's too: the "
                        "projections of one input run as one product where the family's processor uses them (Flux, "
                        "Wan)")
    _common(m)
    m.set_defaults(func=_run_model)

    from .bench_overhead import add_overhead_parser

    add_overhead_parser(bsub)
    c = bsub.add_parser("calibration", help="what calibration costs, in seconds and stock forwards, per profile")
    c.add_argument("--preset", required=True, choices=sorted(PRESETS), help="model configuration")
    c.add_argument("--layers", type=int, default=None, metavar="N", help="cut each stack of blocks to its first N")
    c.add_argument("--profiles", nargs="+", default=["quality", "speed"], help="ditgate profiles")
    c.add_argument("--sparse", type=float, default=None, metavar="BUDGET",
                   help="also each bounded profile with the sparse stage at this budget")
    c.add_argument("--sparse-block", type=int, default=128, help="key tile of the sparse stage (default 128)")
    c.add_argument("--sparse-only", action="store_true",
                   help="only the sparse rows (needs --sparse): the first is then the process's first calibration")
    c.add_argument("--per-site", action="store_true",
                   help="also the per-site gate of before on the same inputs, and the forms each gate chose")
    c.add_argument("--second-process", action="store_true",
                   help="also a new process that attaches with the timing cache the first calibration wrote")
    c.add_argument("--no-warm-ahead", dest="warm_ahead", action="store_false",
                   help="make each form's first call one after another, as before (not side by side in threads)")
    c.add_argument("--no-compile-ahead", dest="compile_ahead", action="store_false",
                   help="let each form's first call compile its kernels, one after another (not all at once from a "
                        "dry call before)")
    _common(c)
    c.set_defaults(func=_run_calibration)

    listing = bsub.add_parser("presets", help="the model presets bench model takes: class and what each holds")
    listing.set_defaults(func=_list_presets)


def _list_presets(args) -> int:
    """Every preset with the diffusers class it builds and its description (configuration, size, tokens)."""
    from rich.table import Table

    from ..models.presets import PRESETS, preset_class_name

    table = Table(title="ditgate bench model presets (random weights; nothing is downloaded)")
    for column in ("preset", "class", "what it holds"):
        table.add_column(column, overflow="fold")
    for name in sorted(PRESETS, key=lambda n: (n.startswith("tiny-"), n)):
        table.add_row(name, preset_class_name(PRESETS[name]), PRESETS[name].description)
    Console(width=max(Console().width, 140)).print(table)
    return 0


def _common(p) -> None:
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", default=None, choices=sorted(_DTYPES), help="default: bf16 on cuda, fp32 on cpu")
    p.add_argument("--out", default="ditgate-out", help="folder for JSON and PNG (default: ditgate-out)")
    p.add_argument("--max-ms", type=float, default=None,
                   help="latency gate: exit 1 when the gated warm time is above this (cold passes never gate)")


def _setup(args):
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = _DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    return device, dtype, Path(args.out)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _beside(stem: Path, ext: str) -> Path:
    """``stem`` + ``ext``: a preset's name has dots (wan-1.3b-...) that ``Path.with_suffix`` would cut."""
    return stem.parent / (stem.name + ext)


def _emit(console: Console, title: str, stem: Path, rows, extra: dict) -> None:
    """Table in the terminal, JSON (command line, environment, every row) and PNG next to each other."""
    print_table(console, title, rows)
    command = "ditgate " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    json_path = write_json(_beside(stem, ".json"), command, rows, extra)
    png = write_plot(_beside(stem, ".png"), title, rows)
    console.print(f"JSON: {json_path}" + (f"  PNG: {png}" if png else ""))


def _progress(console: Console) -> Progress:
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                    transient=True)


def _run_kernels(args) -> int:
    from .bench_kernels import KERNEL_PRESETS, bench_kernels, parse_shape

    console = Console(width=max(Console().width, 150))
    device, dtype, out = _setup(args)
    names = args.preset or ([n for n in KERNEL_PRESETS if n != "tiny"] if device.type == "cuda" and not args.shape
                            else ([] if args.shape else ["tiny"]))
    shapes = [KERNEL_PRESETS[n] for n in names] + [parse_shape(s) for s in args.shape]
    with _progress(console) as prog:
        task = prog.add_task("kernels", total=None)
        rows = bench_kernels(shapes, args.forms, device, dtype, warm=args.warm,
                             progress=lambda text: prog.update(task, description=text))
    _emit(console, f"ditgate bench kernels ({device.type}, {_dtype_name(dtype)})", out / "bench-kernels", rows,
          {"shapes": [s.__dict__ for s in shapes]})
    best = []
    for group in dict.fromkeys(r.group for r in rows):
        timed = [r for r in rows if r.group == group and r.warm_ms is not None]
        if timed:
            best.append(min(timed, key=lambda r: r.warm_ms))
    return latency_gate(console, best if not args.forms else [r for r in rows if r.warm_ms is not None],
                        args.max_ms, "fastest form per shape" if not args.forms else "every named form")


def _run_model(args) -> int:
    from ..models.presets import get_preset
    from .bench_model import DEFAULT_BACKENDS, bench_model, ditgate_rows, only_rows

    console = Console(width=max(Console().width, 150))
    device, dtype, out = _setup(args)
    preset = get_preset(args.preset)
    try:
        rows_wanted = ditgate_rows(args.profiles, _sparse_setting(args), args.sparse_static, _linear_settings(args))
        if args.only:
            rows_wanted = only_rows(rows_wanted, args.only)
            if not rows_wanted:
                raise ValueError(f"--only {' '.join(args.only)} keeps none of the rows asked for")
        if args.compiled_only and args.compile is None:
            raise ValueError("--compiled-only needs --compile")
        if args.layers is not None:
            if args.weights:
                raise ValueError("--layers cuts the preset's random-weights model; --weights loads a folder as saved")
            preset = preset.with_layers(args.layers)
    except ValueError as exc:  # before any model is built
        console.print(f"ditgate bench model: {exc}", style="red")
        return 2
    if args.weights:
        model = preset.load(args.weights, device, dtype)
    else:
        model = preset.build(device, dtype)
    if args.fuse_projections:
        if not callable(getattr(model, "fuse_qkv_projections", None)):
            console.print(f"ditgate bench model: --fuse-projections: {type(model).__name__} has no "
                          "fuse_qkv_projections", style="red")
            return 2
        model.fuse_qkv_projections()
    if args.compile and "regional" in args.compile and not getattr(model, "_repeated_blocks", None):
        console.print(f"ditgate bench model: --compile regional: {type(model).__name__} names no _repeated_blocks "
                      "for compile_repeated_blocks", style="red")
        return 2
    backends = DEFAULT_BACKENDS if args.backends is None else tuple(args.backends)
    with _progress(console) as prog:
        task = prog.add_task("model", total=None)
        eager_rows = () if args.compiled_only else rows_wanted
        rows, extra = bench_model(preset, model, device, dtype, backends, eager_rows, args.rounds, args.steps,
                                  forced_backends=tuple(args.backends or ()),
                                  progress=lambda text: prog.update(task, description=text), gpu_busy=args.gpu_busy)
        if args.compile is not None:
            from .bench_compile import bench_compiled, reference_output

            rows += bench_compiled(preset, model, device, dtype, rows_wanted, args.rounds, args.steps,
                                   tuple(args.compile) or ("default",), reference_output(preset, model, device, dtype),
                                   progress=lambda text: prog.update(task, description=text), gpu_busy=args.gpu_busy,
                                   explains=extra["explain"])
    _emit(console, f"ditgate bench model {preset.name} ({device.type}, {_dtype_name(dtype)})",
          out / f"bench-model-{preset.name}", rows, {"preset": preset.name, **extra})
    for r in rows:  # what served how many sites, and how busy the GPU was: past the table's rounds count
        if ";" in r.detail:
            console.print(f"{r.name}: {r.detail.split('; ', 1)[1]}")
        if r.kernels:
            console.print(f"{r.name}: one pass, longest first: {kernels_text(r.kernels, top=10, width=70)}",
                          markup=False)
    return latency_gate(console, [r for r in rows if r.kind == "ditgate"], args.max_ms, "ditgate rows")


def _run_calibration(args) -> int:
    import dataclasses
    import json

    from rich.table import Table

    from ..gate.compiles import KernelCompiles
    from ..models.presets import get_preset
    from .bench_calibration import bench_calibration, write_plot

    console = Console(width=max(Console().width, 150))
    if args.sparse_only and args.sparse is None:  # before any model is built
        console.print("ditgate bench calibration: --sparse-only needs --sparse BUDGET", style="red")
        return 2
    device, dtype, out = _setup(args)
    preset = get_preset(args.preset)
    if args.layers is not None:
        preset = preset.with_layers(args.layers)
    out.mkdir(parents=True, exist_ok=True)
    with _progress(console) as prog:
        task = prog.add_task("calibration", total=None)
        runs, comparisons = bench_calibration(preset, device, dtype, args, out,
                                              progress=lambda text: prog.update(task, description=text))
    title = f"ditgate bench calibration {preset.name} ({device.type}, {_dtype_name(dtype)})"
    table = Table(title=title)
    for col in ("row", "seconds", "stock forwards", "sites", "timings made", "cache hits", "whole-check forwards",
                "attach s", "contests s", "whole check s"):
        table.add_column(col, justify="left" if col == "row" else "right")
    for r in runs:
        table.add_row(r.row, f"{r.seconds:.2f}", f"{r.forwards:.1f}", str(r.sites), str(r.timings), str(r.cache_hits),
                      f"{r.whole_forwards}{' (replayed)' if r.whole_from_cache else ''}", f"{r.attach_s:.2f}",
                      f"{sum(r.contest_s.values()):.2f}", f"{r.whole_s:.2f}")
    console.print(table)
    for r in runs:
        if r.first_call_s:
            console.print(f"{r.row}: first calls (compiles, loads) " + ", ".join(
                f"{form} {sec:.2f} s" for form, sec in sorted(r.first_call_s.items(), key=lambda kv: -kv[1])))
        if r.kernel_compiles:
            console.print(f"{r.row}: {KernelCompiles(**r.kernel_compiles).text()}")
        console.print(f"{r.row}: measuring {r.measure_s:.2f} s, of which the host's own calls at the sites "
                      f"{r.host_s:.2f} s")
        if r.probe_s:
            console.print(f"{r.row}: availability probes (imports) " + ", ".join(
                f"{form} {sec:.2f} s" for form, sec in sorted(r.probe_s.items(), key=lambda kv: -kv[1])))
        if r.contest_s:
            console.print(f"{r.row}: contests per form (first calls, accuracy, timing) " + ", ".join(
                f"{form} {sec:.2f} s" for form, sec in sorted(r.contest_s.items(), key=lambda kv: -kv[1])))
    for comp in comparisons:
        differ = [s for s in comp["sites"] if s["per_site"] != s["shared"]]
        console.print(f"{comp['row']}: the per-site and the shared gate chose the same form at "
                      f"{len(comp['sites']) - len(differ)} of {len(comp['sites'])} (site, shape) pairs")
        for s in differ:
            console.print(f"  differs: {s['site']}: per-site {s['per_site']}, shared {s['shared']}")
    stem = out / f"bench-calibration-{preset.name}"
    command = "ditgate " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    _beside(stem, ".json").write_text(json.dumps(
        {"command": command, "runs": [dataclasses.asdict(r) for r in runs], "comparisons": comparisons}, indent=1))
    png = write_plot(_beside(stem, ".png"), title, runs)
    console.print(f"JSON: {_beside(stem, '.json')}" + (f"  PNG: {png}" if png else ""))
    return 0


def _linear_settings(args):
    """The linear settings from ``--linear`` / ``--linear-forms`` / ``--linear-roles`` / ``--linear-device-time`` /
    ``--activation-quantization`` (one per way of quantizing an activation's output), or None; ValueError on bad
    values."""
    from ..gate.linear import LinearSetting
    from ..hosts.linears import roles_named

    named_roles = getattr(args, "linear_roles", None)
    if not args.linear:
        if args.linear_forms or getattr(args, "activation_quantization", None) or getattr(args, "linear_device_time",
                                                                                          False) or named_roles:
            raise ValueError("--linear-forms, --activation-quantization, --linear-device-time and --linear-roles "
                             "need --linear")
        return None
    forms = tuple(args.linear_forms) if args.linear_forms else None
    ways = getattr(args, "activation_quantization", None) or ["apart"]
    device_time = bool(getattr(args, "linear_device_time", False))
    roles = roles_named(named_roles) if named_roles else None
    return [LinearSetting(forms=forms, roles=roles, activation_quantization=way, device_time=device_time)
            for way in dict.fromkeys(ways)]


def _sparse_setting(args):
    """The sparse stage's setting from ``--sparse`` and its companions, or None; ValueError on bad values."""
    if args.sparse is None:
        named = [f for f, v in (("--sparse-static", args.sparse_static), ("--sparse-forms", args.sparse_forms)) if v]
        if named:
            raise ValueError(f"{' and '.join(named)} {'needs' if len(named) == 1 else 'need'} --sparse BUDGET")
        return None
    from ..sparse.schedule import BudgetSchedule
    from ..sparse.stage import SparseSetting

    schedule = BudgetSchedule(args.sparse, dense_steps=0, dense_layers=args.dense_layers)
    forms = tuple(args.sparse_forms) if args.sparse_forms else None
    return SparseSetting(schedule, block=args.sparse_block, **({"forms": forms} if forms else {}))
