"""Host time of ditgate's fp8 / int8 attention forms per call at a site, on any machine: every Triton launch is
stubbed out (nothing runs on a device), and the Hopper schedule is taken as if this were an sm_90 GPU, so what is timed
is the Python a call makes before and around its launches (Triton's own launch path excluded).

    .venv/bin/python benchmarks/experiments/form_host_time.py fp8 [--profile]

At image lengths this host time is what the GPU waits on between a form's launches when nothing queued ahead hides it.
"""

import argparse
import cProfile
import pstats
import time

import torch

torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
torch.cuda.is_available = lambda: True
from triton.runtime.jit import JITFunction  # noqa: E402

JITFunction.run = lambda self, *a, grid, warmup, **kw: None

from ditgate.forms import quant as quant_forms  # noqa: E402
from ditgate.forms.base import AttentionInputs  # noqa: E402
from ditgate.kernels import hopper_attention  # noqa: E402

hopper_attention.ready = lambda q, k, v: None
quant_forms.hopper_module = lambda: hopper_attention


def per_call_us(fn, calls: int) -> float:
    for _ in range(100):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("form", choices=["fp8", "int8"])
    p.add_argument("--shape", default="1,4608,24,128", help="B,S,H,D (default: Flux 1024)")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--profile", action="store_true", help="and the functions that took the time")
    args = p.parse_args()
    form = {"fp8": quant_forms.Fp8Attention, "int8": quant_forms.Int8Attention}[args.form]()
    form.availability()
    form._hopper = hopper_attention
    shape = tuple(int(n) for n in args.shape.split(","))
    q, k, v = (torch.randn(*shape, dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    inputs = AttentionInputs(q, k, v, site="blocks.0.attn1")
    print(f"{args.form} at a site (one read): {per_call_us(lambda: form.run(inputs), args.calls):.1f} us per call")
    form.carry_statistics = False
    print(f"{args.form} two passes: {per_call_us(lambda: form.run(inputs), args.calls):.1f} us per call")
    form.carry_statistics = True
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.calls):
            form.run(inputs)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
