"""Where the host's time goes in the sparse forms' whole calls (FP8 with the quantization pooling, bf16 with the
selector pooling; ``fixed_costs.py``), by ``cProfile``, at the LTX or Wan-14B long shape. Why: one call at a time,
the GPU waited 300-500 us for the host between the selection's last kernel and the next launch (results
2026-12-04-h200-s18, call g, ``sparse_call_profile.py --one-at-a-time``).

    python benchmarks/experiments/host_profile.py --out DIR [--shapes wan] [--calls 50]

Each call is followed by a synchronize (as one call at a time); prints the 25 functions with the most time of
their own and the 25 with the most cumulative time per call variant, writes host-profile-<shape>-<variant>.txt."""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
from pathlib import Path

import torch

from fixed_costs import SHAPES, plain_whole_call, random_inputs, whole_call_variants  # beside this script


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="ditgate-out")
    ap.add_argument("--shapes", nargs="+", default=["wan"], choices=list(SHAPES))
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for shape in args.shapes:
        q, k, v, scale, rows_q = random_inputs(shape)
        calls = {"fp8": whole_call_variants(q, k, v, scale, rows_q)["whole call, quantization pools"],
                 "bf16": plain_whole_call(q, k, v, scale, rows_q)}
        for name, fn in calls.items():
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            prof = cProfile.Profile()
            for _ in range(args.calls):
                prof.enable()
                fn()
                prof.disable()
                torch.cuda.synchronize()
            text = io.StringIO()
            stats = pstats.Stats(prof, stream=text)
            text.write(f"{shape} {name}: {args.calls} calls, host time per call "
                       f"{stats.total_tt / args.calls * 1e6:.1f} us\n")
            stats.sort_stats("tottime").print_stats(25)
            stats.sort_stats("cumulative").print_stats(25)
            (out / f"host-profile-{shape}-{name}.txt").write_text(text.getvalue())
            print(text.getvalue().split("\n")[0])


if __name__ == "__main__":
    main()
