"""Where a forward with linear forms spends its time: stock against static plans that serve every per-token linear
with one form, on a preset cut to its first blocks (GPU); eager, or with ``--compile`` both under torch.compile
(each plan's sites start their state at one eager forward first).

    PYTHONPATH=. python benchmarks/experiments/linear_eager_profile.py --preset flux-dev-1024 --layers 8 \
        fp8_linear fp8_delayed_linear fp8_linear@fa3_fp8 host@fa3_fp8 [--compile [reduce-overhead]]

A plan is ``[gate:|gate-dt:]LINEAR[:ROLES][@ATTENTION]``: the linear form at every linear of the roles ``ROLES``
(comma-separated, ``all`` or ``token``; default the per-token roles; ``host``: none) and the attention form at every attention
site (default ``sdpa_cudnn``, the host's own kernel). With ``gate:`` the gate chooses each linear site's route from
that form and the host (every role unless ``ROLES``), timed as for a compiled model under ``--compile``; ``gate-dt:``
times it on the device (``LinearSetting.device_time``). Each plan's routes are printed per role. Per plan: the routed forward's median (CUDA events; stock's is timed once, before any plan), then torch.profiler's
top ops of one routed forward by host time and by device time. The whole-model check of a plan for eager use times
forwards like these; until db2dc82 it timed them for a plan made for a compiled model too.

``--gaps`` adds, for stock and each plan, where one forward's device time goes: the span from its first kernel's
start to its last kernel's end, the time some kernel ran (busy) and the idle rest, the kernels' time per family
(attention, matrix products, inductor's Triton kernels, ditgate's Triton kernels, the rest), and the longest idle
gaps with the kernels either side. A compiled forward whose wall time exceeds its device time either starts its
kernels late (host-bound: the gaps say after which kernel) or waits outside them.
"""

import argparse
import statistics
import time
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

import ditgate
from ditgate.cli.bench_model import check_text, chosen_routes
from ditgate.cli.gpu_busy import busy_from_intervals
from ditgate.gate.linear import LinearSetting
from ditgate.hosts.linears import roles_named
from ditgate.models.presets import get_preset

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def timed(fn, rounds: int = 1) -> float:
    if DEVICE != "cuda":  # a dry run of the script on a CPU: the forwards run, untimed
        fn()
        return float("nan")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(rounds):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / rounds


def graph_skips(before: int = 0) -> tuple[str, int]:
    """How many graphs skipped CUDA graphs since ``before`` (inductor's process-wide ``cudagraph_skips`` count, which
    reduce-overhead raises when it falls back to plain launches; ``TORCH_LOGS=perf_hints`` says why), and the count."""
    from torch._dynamo.utils import counters
    skips = counters["inductor"]["cudagraph_skips"] if "inductor" in counters else 0
    return (f"; {skips - before} graph(s) skipped CUDA graphs" if skips > before else ""), skips


FAMILIES = (  # after inductor's own kernels (named triton_*), the first pattern a kernel's name contains
    ("attention", ("flash", "fmha", "attn", "attention", "cudnn", "sdpa")),
    ("products", ("gemm", "cutlass", "nvjet", "sm90_xmma", "cublas", "matmul")),
)


def family(name: str) -> str:
    """A kernel's family by its name: inductor's kernels first (their names carry the ops they fused, an attention's
    or a product's among them), then attention and products, then ditgate's Triton kernels (``_<name>_kernel``)."""
    if name.startswith("triton_"):
        return "inductor"
    lowered = name.lower()
    for label, patterns in FAMILIES:
        if any(pattern in lowered for pattern in patterns):
            return label
    if name.startswith("_") and name.endswith("_kernel"):
        return "ditgate triton"
    return "other"


def device_gaps(events, show: int = 8) -> str:
    """The device's span, busy and idle time over one profiled forward (``cli.gpu_busy.busy_from_intervals``, what
    ``bench model --gpu-busy`` reports), per kernel family, and the ``show`` longest idle gaps (µs) with the kernels
    before and after each."""
    kernels = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    if not kernels:
        return "no device events"
    busy = busy_from_intervals((e.time_range.start, e.time_range.end) for e in kernels)
    gaps, end, before = [], kernels[0].time_range.start, None
    per_family = Counter()
    for event in kernels:
        start, stop = event.time_range.start, event.time_range.end
        per_family[family(event.name)] += stop - start
        if start > end:
            gaps.append((start - end, before.name if before else "", event.name))
        if stop > end:
            end, before = stop, event
    lines = [f"span {busy.span_ms:.2f} ms, busy {busy.busy_ms:.2f} ms, idle {busy.idle_ms:.2f} ms "
             f"in {len(gaps)} gaps; kernel ms by family: "
             + ", ".join(f"{label} {us / 1e3:.2f}" for label, us in per_family.most_common())]
    for gap, after, next_ in sorted(gaps, reverse=True)[:show]:
        lines.append(f"  idle {gap:8.1f} us after {after[:60]!r} before {next_[:60]!r}")
    return "\n".join(lines)


def role_routes(plan) -> str:
    """"feed-forward fp8_linear 24, modulation host 9, ...": the form whose weights each role's sites hold (what a
    compiled graph will run; ``serving`` counts eager calls, and a gated plan's only ones are its calibration's), then
    why the sites left on the host stayed there: their verdicts' notes and refusals, the commonest first."""
    report = plan.report()
    if report.linear is None:
        return "no linear sites"
    held = Counter(f"{s.role} {s.weights}" for s in report.linear.sites)
    why = Counter()
    for site in report.linear.sites:
        if site.weights == "host":
            for v in site.verdicts:
                why.update([f"{site.role}: {v.note}"[:420]] if v.note else [])
                why.update(f"{site.role}: {r.text()}"[:420] for r in v.refusals if r.kind != "not allowed")
    lines = [", ".join(f"{route} {n}" for route, n in sorted(held.items()))]
    lines += [f"  {n} x {reason}" for reason, n in why.most_common(12)]
    return "\n".join(lines)


def plan_setting(spec: str, compiled: bool) -> tuple[bool, str, LinearSetting | None]:
    """A plan's spec as (measured, attention form, linear setting)."""
    gate, rest = spec.split(":", 1) if spec.startswith(("gate:", "gate-dt:")) else ("", spec)
    linear, _, attention = rest.partition("@")
    form, _, roles = linear.partition(":")
    if form == "host":
        return bool(gate), attention or "sdpa_cudnn", None
    role_names = roles_named(roles.split(",")) if roles else None
    setting = LinearSetting(forms=(form,), roles=role_names, compiled=compiled and bool(gate),
                            device_time=gate == "gate-dt")
    return bool(gate), attention or "sdpa_cudnn", setting


def plan_routes(plan) -> str:
    """"fa3_fp8 16, linear fp8_linear 128, linear host 42": the route each site's last verdict chose and the weights
    each linear site holds, what a compiled graph traces (``bench_model.chosen_routes``; the eager calls a gated plan
    counted are its calibration's, all served by the host)."""
    return ", ".join(f"{route} {n}" for route, n in chosen_routes(plan).most_common())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("plans", nargs="+", metavar="[gate:|gate-dt:]LINEAR[:ROLES][@ATTENTION]")
    parser.add_argument("--preset", default="flux-dev-1024")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--top", type=int, default=14, help="rows of the op tables (0: none)")
    parser.add_argument("--no-profile", action="store_true",
                        help="no torch.profiler pass at all (a plan timed on the device captures CUDA graphs after it)")
    parser.add_argument("--gaps", action="store_true", help="the device's idle gaps and kernel families per forward")
    parser.add_argument("--stock-after", action="store_true",
                        help="time stock again after the plans (compiled afresh), so drift shows beside the ratios")
    parser.add_argument("--fuse-projections", action="store_true",
                        help="the model's fuse_qkv_projections() (diffusers) first, for stock and every plan")
    parser.add_argument("--compile", nargs="?", const="default", default=None,
                        help="time and profile compiled forwards, in this torch.compile mode (default: default)")
    args = parser.parse_args()
    preset = get_preset(args.preset).with_layers(args.layers)
    model = preset.build(DEVICE, torch.bfloat16)
    if args.fuse_projections:
        model.fuse_qkv_projections()
    inputs = preset.inputs(model, DEVICE, torch.bfloat16)

    runner = {"model": model}

    def forward():
        with torch.no_grad():
            out = runner["model"](**inputs)
            return out[0] if isinstance(out, tuple) else getattr(out, "sample", out)

    def compiled():
        if args.compile:
            torch._dynamo.reset()
            runner["model"] = torch.compile(model, mode=args.compile)

    def profiled(label: str):  # one forward under torch.profiler: its op table, and how many device events it launched
        if args.no_profile:
            return None, "no profiled"
        torch.cuda.synchronize() if DEVICE == "cuda" else None
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            forward()
            torch.cuda.synchronize() if DEVICE == "cuda" else None
        table = prof.key_averages()
        if args.gaps:
            print(f"== {label}: device {device_gaps(prof.events())}")
        return table, sum(e.count for e in table if e.device_type == torch.autograd.DeviceType.CUDA)

    compiled()
    for _ in range(3):
        forward()
    stock = statistics.median(timed(forward) for _ in range(args.rounds))  # before any plan: nothing to suspend
    skipped, count = graph_skips()
    print(f"== stock: {stock:.2f} ms, {profiled('stock')[1]} device events in one forward{skipped}")
    for form in args.plans:
        runner["model"] = model
        measured, attention, setting = plan_setting(form, bool(args.compile))
        started = time.perf_counter()
        plan = ditgate.attach(model, profile="speed", forms=[attention], measure=measured,
                              timing_cache=False, progress=False, linear=setting)
        forward()  # eager: calibrates a gated plan, starts the state of forms that keep one
        print(f"== {form}: routes {plan_routes(plan)} (attach and first forward {time.perf_counter() - started:.1f} s)")
        print(f"== {form}: per role: {role_routes(plan)}")
        if measured:
            off = plan.report().linear.device_time_off if setting is not None else ""
            print(f"== {form}: whole-model check{check_text(plan)}" + (f"; device time off {off}" if off else ""))
        compiled()
        for _ in range(3):
            forward()
        routed = statistics.median(timed(forward) for _ in range(args.rounds))
        print(f"== {form}: routed {routed:.2f} ms, stock {stock:.2f} ms ({stock / routed:.3f}x); one routed forward:")
        table, events = profiled(form)
        if args.top and table is not None:
            print(table.table(sort_by="self_cpu_time_total", row_limit=args.top, max_name_column_width=48))
            print(table.table(sort_by="self_cuda_time_total", row_limit=args.top, max_name_column_width=48))
        skipped, count = graph_skips(count)
        print(f"== {form}: {events} device events in one routed forward{skipped}")
        plan.detach()
    if args.stock_after:
        runner["model"] = model
        compiled()
        for _ in range(3):
            forward()
        again = statistics.median(timed(forward) for _ in range(args.rounds))
        print(f"== stock again: {again:.2f} ms (first {stock:.2f} ms, {stock / again:.3f}x)")


if __name__ == "__main__":
    main()
