"""Where the FP8 sparse form's whole call spends the GPU's time, kernel by kernel (torch.profiler's CUDA times), at
budget 0.3 over a video layout, the selector pooling Q and K itself or the quantization pooling for it
(``fixed_costs.whole_call_variants``); random bf16 inputs at the LTX or Wan-14B long shape. do_bench medians of
the two calls back to back say which is faster; this says which kernels make the difference.

    python benchmarks/experiments/sparse_call_profile.py --out DIR [--shapes ltx wan] [--calls 20]

Prints, per shape and variant, each kernel's mean GPU time per call and the sum; writes sparse-call-profile.json."""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from fixed_costs import SHAPES, random_inputs, whole_call_variants  # beside this script (its directory is on the path)
from json_rows import recorder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="ditgate-out")
    ap.add_argument("--shapes", nargs="+", default=["ltx"], choices=list(SHAPES))
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record, rows = recorder(out, "sparse-call-profile.json", "benchmarks/experiments/sparse_call_profile.py")
    for shape in args.shapes:
        q, k, v, scale, rows_q = random_inputs(shape)
        for name, fn in whole_call_variants(q, k, v, scale, rows_q).items():
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.calls):
                    fn()
                torch.cuda.synchronize()
            per_kernel: dict = collections.defaultdict(float)
            for event in prof.events():
                if event.device_type == torch.autograd.DeviceType.CUDA:
                    per_kernel[event.name[:60]] += event.device_time_total / 1e3 / args.calls  # ms per call
            for kernel, ms in sorted(per_kernel.items(), key=lambda kv: -kv[1]):
                record(shape=shape, variant=name, kernel=kernel, ms_per_call=ms)
            record(shape=shape, variant=name, kernel="(sum)", ms_per_call=sum(per_kernel.values()))
    for r in rows:
        print(f"{r['shape']:4} {r['variant'][12:]:24} {r['kernel']:60} {r['ms_per_call']:8.4f}")


if __name__ == "__main__":
    main()
