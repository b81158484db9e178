"""The kernels inductor makes for one routed feed-forward of tiny Flux under torch.compile, per linear form: whether a
form's input quantization folds into the kernel that makes the input (on this machine's inductor backend: C++ on a
CPU, Triton on a GPU).

    PYTHONPATH=. .venv/bin/python benchmarks/experiments/inductor_kernels.py fp8_delayed_linear fp8_linear

Prints, per form, each generated kernel's name and how many loops over the input it opens.
"""

import dataclasses
import re
import sys

import torch
from torch._inductor.utils import run_and_get_code

import ditgate
from ditgate.gate import PROFILES
from ditgate.gate.linear import LinearSetting
from tests.helpers import Tiny

LENIENT = dataclasses.replace(PROFILES["speed"], min_speedup=1e-6, min_whole_ratio=1e-6, rounds=2, screen_margin=None)


def kernels(form: str) -> list[tuple[str, int]]:
    torch._dynamo.reset()
    tiny = Tiny("tiny-flux")
    plan = ditgate.attach(tiny.model, profile=LENIENT, forms=["sdpa_math"], timing_cache=False, progress=False,
                          linear=LinearSetting(forms=(form,), compiled=True))
    ff = tiny.model.transformer_blocks[0].ff
    seen = []
    hook = ff.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    tiny.forward()  # calibrates (eagerly), and gives the feed-forward's live input
    hook.remove()
    with torch.no_grad():
        _, codes = run_and_get_code(torch.compile(ff, fullgraph=True), seen[0])
    plan.detach()
    found = []
    for code in codes:
        for name, body in re.findall(r"(\w+_fused\w*) = async_compile\.\w+\((.*?)'''\)", code, flags=re.S):
            found.append((name, len(re.findall(r"for\(int64_t x\w* *=|for r\w+_offset in|tl\.range\(", body))))
    return found


if __name__ == "__main__":
    for form in sys.argv[1:] or ["fp8_delayed_linear", "fp8_linear"]:
        print(form)
        for name, loops in kernels(form):
            print(f"  {name}: {loops} loop(s)")
