"""What a compiled model's guards cost with linear routes: dynamo's guard count and the compiled forward's time, stock
against a static plan with every linear site on one form and against attention routes alone, on a tiny preset (CPU or
GPU). Each linear site's route is decided at trace time as a constant (``LinearRouter.traced_route``); traced through,
the decision put its chooser's and forms' Python under guards that every call of the compiled model checks.

    PYTHONPATH=. python benchmarks/experiments/compiled_guards.py [--preset tiny-flux] [--form fp8_linear]

Times are medians of --rounds timed batches of --calls forwards each, after warm-up, in one process.
"""

import argparse
import statistics
import time
from collections import Counter

import torch

import ditgate
from ditgate.models.presets import get_preset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="tiny-flux")
    parser.add_argument("--form", default="fp8_linear")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    preset = get_preset(args.preset)
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
        print(f"{label:28} guards {guards:6d}  {statistics.median(times):8.3f} ms per compiled forward  {linear_sites}")

    with torch.no_grad():
        measure("stock", "")
        plan = ditgate.attach(model, forms=["sdpa_math"], measure=False)
        model(**inputs)
        measure("attention routed", "")
        plan.detach()
        plan = ditgate.attach(model, forms=["sdpa_math"], measure=False,
                              linear=ditgate.LinearSetting(forms=(args.form,)))
        model(**inputs)  # eager: the routes resolve, and forms with state start it
        served = Counter(s.serving for s in plan.report().linear.sites)
        measure(f"attention + {args.form}", ", ".join(f"linear {k} {n}" for k, n in served.most_common()))
        plan.detach()


if __name__ == "__main__":
    main()
