"""What a compiled model's guards cost with linear routes: dynamo's guard count and the compiled forward's time, stock
against a static plan with every linear site on one form and against attention routes alone, on a tiny preset (CPU or
GPU). Each linear site's route is decided at trace time as a constant (``LinearRouter.traced_route``); traced through,
the decision put its chooser's and forms' Python under guards that every call of the compiled model checks.

    PYTHONPATH=. python benchmarks/experiments/compiled_guards.py [--preset tiny-flux] [--layers N] \
        [--form fp8_linear] [--attention sdpa_math]

Times are medians of --rounds timed batches of --calls forwards each, after warm-up, in one process. The guard
check is the time of the compiled frame's guards alone (its cache entry's guard manager, called on the frame's
arguments as dynamo would at each call; mean of 2000 checks), apart from the forward's.
"""

import argparse
import inspect
import statistics
import time
from collections import Counter

import torch

import ditgate
from ditgate.models.presets import get_preset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="tiny-flux")
    parser.add_argument("--layers", type=int, default=None, help="cut each stack of blocks to its first N")
    parser.add_argument("--form", default="fp8_linear")
    parser.add_argument("--attention", default="sdpa_math", help="the attention form of the routed plans")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    preset = get_preset(args.preset)
    if args.layers:
        preset = preset.with_layers(args.layers)
    model = preset.build(device, torch.bfloat16)
    inputs = preset.inputs(model, device, torch.bfloat16)

    def measure(label: str, linear_sites: str) -> None:
        torch._dynamo.reset()
        guards = len(torch._dynamo.explain(model)(**inputs).out_guards)
        torch._dynamo.reset()
        compiled = torch.compile(model)
        for _ in range(3):
            compiled(**inputs)
        times = []
        for _ in range(args.rounds):
            if device == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(args.calls):
                compiled(**inputs)
            if device == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - started) / args.calls * 1e3)
        check = guard_check_us(model, inputs)
        print(f"{label:28} guards {guards:6d}  guard check {check:7.1f} us  {statistics.median(times):8.3f} ms per "
              f"compiled forward  {linear_sites}")

    with torch.no_grad():
        measure("stock", "")
        plan = ditgate.attach(model, forms=[args.attention], measure=False)
        model(**inputs)
        measure("attention routed", "")
        plan.detach()
        plan = ditgate.attach(model, forms=[args.attention], measure=False,
                              linear=ditgate.LinearSetting(forms=(args.form,)))
        model(**inputs)  # eager: the routes resolve, and forms with state start it
        served = Counter(s.serving for s in plan.report().linear.sites)
        measure(f"attention + {args.form}", ", ".join(f"linear {k} {n}" for k, n in served.most_common()))
        plan.detach()


def guard_check_us(model: torch.nn.Module, inputs: dict, checks: int = 2000) -> float:
    """Microseconds per check of the guards of the model's compiled forward (its first cache entry, the one its
    calls hit), called on the frame's arguments: for diffusers' forwards wrapped by ``apply_lora_scale``, the
    wrapper's (self, args, kwargs and its closure's cells, which dynamo reads as locals). NaN where no entry is found
    or its guards do not pass on these arguments."""
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

    forward = type(model).forward
    for fn in (forward, getattr(forward, "__wrapped__", None)):
        entries = _debug_get_cache_entry_list(fn.__code__) if fn is not None else []
        if entries:
            break
    else:
        return float("nan")
    if fn is forward and "args" in fn.__code__.co_varnames[:3]:
        frame = {"self": model, "args": (), "kwargs": dict(inputs)}
    else:
        bound = inspect.signature(fn).bind(model, **inputs)
        bound.apply_defaults()
        frame = dict(bound.arguments)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        frame[name] = cell.cell_contents
    guards = entries[0].guard_manager
    if not guards.check(frame):
        return float("nan")
    started = time.perf_counter()
    for _ in range(checks):
        guards.check(frame)
    return (time.perf_counter() - started) / checks * 1e6


if __name__ == "__main__":
    main()
