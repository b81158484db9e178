"""Where the FP8 (and the bf16) sparse form's whole call spends the GPU's time, kernel by kernel (torch.profiler's
CUDA times), at budget 0.3 over a video layout, the selector pooling Q and K itself or the quantization pooling for it
(``fixed_costs.whole_call_variants``); random bf16 inputs at the LTX or Wan-14B long shape. do_bench medians of
the two calls back to back say which is faster; this says which kernels make the difference.

    python benchmarks/experiments/sparse_call_profile.py --out DIR [--shapes ltx wan] [--calls 20] [--one-at-a-time]

Prints, per shape and variant, each kernel's mean GPU time per call, the sum, and the time from the first kernel's
start to the last one's end per call (the calls run back to back); then the middle call's kernels in order, each with
its start (us from the call's first), its duration and the time since any kernel before it last ended (a negative one
ran beside another, on the second stream); writes sparse-call-profile.json. ``--one-at-a-time``: a synchronize after
each call, as the benchmark's one-call timing waits: the gaps then show where the GPU waited for the host."""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from fixed_costs import SHAPES, plain_whole_call, random_inputs, whole_call_variants  # beside this script (its directory is on the path)
from json_rows import recorder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="ditgate-out")
    ap.add_argument("--shapes", nargs="+", default=["ltx"], choices=list(SHAPES))
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--one-at-a-time", action="store_true", help="a synchronize after each profiled call")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record, rows = recorder(out, "sparse-call-profile.json", "benchmarks/experiments/sparse_call_profile.py")
    for shape in args.shapes:
        q, k, v, scale, rows_q = random_inputs(shape)
        variants = whole_call_variants(q, k, v, scale, rows_q)
        variants["whole call, bf16 (block_sparse)"] = plain_whole_call(q, k, v, scale, rows_q)
        for name, fn in variants.items():
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.calls):
                    fn()
                    if args.one_at_a_time:
                        torch.cuda.synchronize()
                torch.cuda.synchronize()
            per_kernel: dict = collections.defaultdict(float)
            spans = []
            for event in prof.events():
                if event.device_type == torch.autograd.DeviceType.CUDA:
                    per_kernel[event.name[:60]] += event.device_time_total / 1e3 / args.calls  # ms per call
                    spans.append((event.time_range.start, event.time_range.end, event.name[:40]))
            spans.sort()
            per_call = len(spans) // args.calls
            middle = spans[per_call * (args.calls // 2): per_call * (args.calls // 2 + 1) + 1]  # one call, the next's first
            for i, (start, end, kernel) in enumerate(middle):
                record(shape=shape, variant=name, timeline=kernel, start_us=start - middle[0][0], us=end - start,
                       gap_us=start - max(e for _, e, _ in middle[:i]) if i else None)
            for kernel, ms in sorted(per_kernel.items(), key=lambda kv: -kv[1]):
                record(shape=shape, variant=name, kernel=kernel, ms_per_call=ms)
            record(shape=shape, variant=name, kernel="(sum)", ms_per_call=sum(per_kernel.values()))
            # first start to last end per call: the GPU's time with its gaps (one at a time: with the waits between)
            record(shape=shape, variant=name, kernel="(first start to last end, per call)",
                   ms_per_call=(max(e for _, e, _ in spans) - min(s for s, _, _ in spans)) / 1e3 / args.calls)
    for r in rows:
        if "timeline" in r:  # the middle call's kernels in order: start, duration, idle time since the last end
            gap = "" if r["gap_us"] is None else f"{r['gap_us']:8.1f}"
            print(f"{r['shape']:4} {r['variant'][12:]:24}   {r['timeline']:40} {r['start_us']:9.1f} {r['us']:8.1f} {gap}")
        else:
            print(f"{r['shape']:4} {r['variant'][12:]:24} {r['kernel']:60} {r['ms_per_call']:8.4f}")


if __name__ == "__main__":
    main()
