"""What the gate's accuracy check costs per site on a GPU: ``gate.accuracy.compare`` through its one-read kernel
(``kernels.accuracy_sums``) against its torch path, at the output sizes of Wan 2.1 1.3B's attention (12 x 32760 x 128)
and linear sites (32760 x 1536, 32760 x 8960) and Flux 1024's attention (24 x 4608 x 128), with the measures of both.

    PYTHONPATH=. python benchmarks/experiments/accuracy_check_cost.py [--rounds 20]

Medians of CUDA-event timings (each call ends in its one host synchronisation), random bf16 outputs (never zero),
fresh for each size; the first call of each path (the kernel's compile or load) is timed apart.
"""

import argparse
import statistics
import time

import torch

from ditgate.gate.accuracy import compare

SIZES = {"wan attention 12x32760x128": 12 * 32760 * 128, "wan linear 32760x1536": 32760 * 1536,
         "wan ffn 32760x8960": 32760 * 8960, "flux attention 24x4608x128": 24 * 4608 * 128}


def timed_ms(fn) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    for path in (True, False):  # each path's first call, before any timing
        x = torch.randn(4096, device="cuda", dtype=torch.bfloat16) + 3
        started = time.perf_counter()
        compare(x, x, kernel=path)
        print(f"first call, {'kernel' if path else 'torch'} path: {time.perf_counter() - started:.3f} s")
    rows = []
    for name, n in SIZES.items():
        ref = torch.randn(n, device="cuda", dtype=torch.bfloat16) + 0.1
        out = (ref.float() + 0.03 * torch.randn(n, device="cuda")).to(torch.bfloat16)
        fast, slow = compare(out, ref, kernel=True), compare(out, ref, kernel=False)
        times = {True: [], False: []}
        for _ in range(args.rounds):  # the two paths interleaved
            for path in (True, False):
                times[path].append(timed_ms(lambda: compare(out, ref, kernel=path)))
        k, t = statistics.median(times[True]), statistics.median(times[False])
        rows.append((name, k, t, fast, slow))
        del ref, out
    print(f"{'output':30} {'kernel ms':>10} {'torch ms':>10} {'x':>6}  cosine kernel / torch        rel L2 kernel / torch")
    for name, k, t, fast, slow in rows:
        print(f"{name:30} {k:10.3f} {t:10.3f} {t / k:6.1f}  {fast.cosine:.12f} / {slow.cosine:.12f}  "
              f"{fast.rel_l2:.9e} / {slow.rel_l2:.9e}")


if __name__ == "__main__":
    main()
