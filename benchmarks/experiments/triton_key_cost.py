"""What a process's first load of cached Triton kernels costs, with and without Triton's key made ahead in a thread
(``gate.triton_warm``). Runs on a CPU machine: a stand-in Triton driver for an sm_90 GPU compiles ditgate's FP8
attention launches (three quantization passes, the Gluon kernel) without running them.

    python benchmarks/experiments/triton_key_cost.py [--rounds 3]

Each sample is a fresh process on one Triton cache folder (filled by a first process): ``cold`` loads the four
kernels at once; ``ahead`` starts ``triton_warm`` and does 0.5 s of other work (a stand-in for a pipeline's text
encoder or the model's first blocks) before loading them. Prints the load times (seconds), median over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

CHILD = textwrap.dedent("""
    import sys, time
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    class Hopper:
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)
        def get_current_device(self):
            return 0
        def get_current_stream(self, device=None):
            return 0

    driver.set_active(Hopper())
    from ditgate.gate import triton_warm
    from ditgate.kernels import hopper_attention as ha, hopper_compile as hc
    from ditgate.kernels.launches import recorded_launches

    if sys.argv[1] == "ahead":
        triton_warm.start(torch.device("cpu"), torch.bfloat16)
        time.sleep(0.5)
    with recorded_launches() as launches:
        q, k, v = (torch.empty(1, 1000, 2, 128, dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
        ha.quantize_for_schedule(q, k, v, "fp8", 128 ** -0.5)
        hc.host_launch("fp8", 128, False, 2).run()
    started = time.perf_counter()
    triton_warm.wait_for_key()
    for launch in launches:
        launch.kernel.warmup(*launch.args, grid=(1,), **launch.kwargs)
    print(time.perf_counter() - started)
""")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "child.py")  # Triton reads a kernel's source from its file
        with open(path, "w") as f:
            f.write(CHILD)
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["TRITON_CACHE_DIR"] = os.path.join(tmp, "cache")

        def sample(mode: str) -> float:
            out = subprocess.run([sys.executable, path, mode], env=env, capture_output=True, text=True, check=True)
            return float(out.stdout.strip().splitlines()[-1])

        sample("cold")  # compiles the four kernels into the cache folder
        times: dict[str, list[float]] = {"cold": [], "ahead": []}
        for _ in range(args.rounds):  # interleaved
            for mode in times:
                times[mode].append(sample(mode))
    print(json.dumps({mode: {"median_s": round(statistics.median(v), 4), "samples": [round(x, 4) for x in v]}
                      for mode, v in times.items()}))


if __name__ == "__main__":
    main()
