"""The warp-specialized Hopper schedule (Gluon) against the Triton schedule, cuDNN and flash-attn-4.

Per shape (bf16 random inputs, B, S, H, D storage seen as B, H, S, D views): the exact baselines, then
each mode (plain, fp8, int8) through the Triton kernel at its default tile and through the Hopper
schedule at each consumer schedule, warpgroup count and ring depth asked for, timed end to end
(quantization passes included) with CUDA events (median of 10 after warm-up), cosine to a float32
reference on a fresh input set; then the Hopper schedule's block-sparse lists (random, ascending; query
blocks of the head dim's own warpgroups, 192 rows at 64 and 128 at 128, as the forms ask the selector for;
the fastest schedule) at densities 0.5 / 0.25 / 0.125 against its own dense time at those warpgroups.

    python benchmarks/hopper_kernel.py --out DIR [--shapes ...] [--modes ...] [--schedules 3 4]
        [--groups 2 3] [--stages 2 3 4] [--no-triton]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from quant_kernel import bench, random_lists, shape_case

from ditgate.forms import AttentionInputs, create_forms
from ditgate.gate import compare, environment
from ditgate.kernels.hopper_attention import DEFAULT_GROUPS, ROWS_HALF, ROWS_K, default_stages, hopper_attention
from ditgate.kernels.quant_attention import KernelConfig, quant_attention, quantize


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="ditgate-out")
    ap.add_argument("--shapes", nargs="+", default=["wan-14b-480p", "ltx-1216x704x257"])
    ap.add_argument("--modes", nargs="+", default=["plain", "fp8", "int8"], choices=["plain", "fp8", "int8"])
    ap.add_argument("--stages", nargs="+", type=int, default=[], help="ring depths to try besides the default")
    ap.add_argument("--schedules", nargs="+", type=int, default=[2], help="consumer schedules (see _consume)")
    ap.add_argument("--groups", nargs="+", type=int, default=None,
                    help="consumer warpgroups per program (2 or 3; by default the head dim's own, DEFAULT_GROUPS)")
    ap.add_argument("--no-triton", action="store_true", help="skip the Triton schedule's rows")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    forms = create_forms(["sdpa_cudnn", "fa4"])
    env = environment("cuda")
    rows = []

    def record(row):
        rows.append(row)
        print(row, flush=True)
        (out / "hopper-kernel.json").write_text(json.dumps(
            {"environment": env, "date": time.strftime("%Y-%m-%d"),
             "command": "python benchmarks/hopper_kernel.py " + " ".join(sys.argv[1:]), "rows": rows}, indent=2))

    for name in args.shapes:
        h, s, d, flops, (q, k, v), (cq, ck, cv), ref = shape_case(name)
        base = {}

        def measure(label, fn, check):
            try:
                ms = bench(fn)
                acc = compare(check().float(), ref)
            except Exception as exc:  # a variant that fails is a row, not the end of the run
                record({"shape": name, "row": label, "status": f"{type(exc).__name__}: {exc}"[:400]})
                return None
            row = {"shape": name, "row": label, "ms": ms[0], "min": ms[1], "max": ms[2],
                   "tflops": flops / ms[0] / 1e9, "cosine": acc.cosine, "rel_l2": acc.rel_l2,
                   "x_cudnn": base.get("sdpa_cudnn", float("nan")) / ms[0],
                   "x_fa4": base.get("fa4", float("nan")) / ms[0]}
            record(row)
            return row

        for fname, form in forms.items():
            if not form.availability().available:
                record({"shape": name, "row": fname, "status": form.availability().reason})
                continue
            row = measure(fname, lambda: form.run(AttentionInputs(q, k, v)),
                          lambda: form.run(AttentionInputs(cq, ck, cv)))
            if row:
                base[fname] = row["ms"]
        for qk in args.modes:
            if qk != "plain":  # the quantization passes alone (included in every quantized row's time)
                ms = bench(lambda: quantize(q, k, v, qk, d ** -0.5, KernelConfig(ROWS_HALF, ROWS_K), permute_v=True))
                record({"shape": name, "row": f"quantize {qk} (alone)", "ms": ms[0], "min": ms[1], "max": ms[2],
                        "tflops": float("nan"), "cosine": float("nan"), "x_cudnn": float("nan"), "x_fa4": float("nan")})
            if not args.no_triton:
                measure(f"triton {qk}", lambda: quant_attention(q, k, v, qk=qk),
                        lambda: quant_attention(cq, ck, cv, qk=qk))
            list_groups = DEFAULT_GROUPS[d]  # the lists' query rows are the program's: what the forms ask for
            best = None  # the fastest with those warpgroups
            for sch in args.schedules:
                for g in args.groups or [list_groups]:
                    for st in sorted({default_stages(d, qk, g), *args.stages}):
                        row = measure(f"hopper {qk} s{st} p{sch} g{g}",
                                      lambda: hopper_attention(q, k, v, qk=qk, stages=st, schedule=sch, groups=g),
                                      lambda: hopper_attention(cq, ck, cv, qk=qk, stages=st, schedule=sch, groups=g))
                        if row and g == list_groups and (best is None or row["ms"] < best[1]["ms"]):
                            best = ((st, sch), row)
            if best is None:
                continue
            (st, sch), dense = best
            n_m, n_n = -(-s // (ROWS_HALF * list_groups)), -(-s // ROWS_K)
            for density in (0.5, 0.25, 0.125):
                idx, cnt, keep = random_lists(h, n_m, n_n, density)
                ms = bench(lambda: hopper_attention(q, k, v, qk=qk, stages=st, schedule=sch, groups=list_groups,
                                                    kv_index=idx, kv_count=cnt))
                ratio = ms[0] / dense["ms"]
                record({"shape": name, "row": f"hopper {qk} s{st} p{sch} g{list_groups} sparse d={density}",
                        "ms": ms[0], "min": ms[1], "max": ms[2], "density": keep / n_n, "x_own_dense_time": ratio,
                        "bound_1.15xdensity": 1.15 * keep / n_n, "within": ratio <= 1.15 * keep / n_n})
        del q, k, v, cq, ck, cv, ref
        torch.cuda.empty_cache()
    print(f"{'shape':<18}{'row':<36}{'ms':>9}{'TFLOP/s':>9}{'cos':>10}{'x cuDNN':>9}{'x fa4':>8}")
    for r in rows:
        if "density" in r:
            print(f"{r['shape']:<18}{r['row']:<36}{r['ms']:>9.3f}   {r['x_own_dense_time']:.3f} of dense "
                  f"(bound {r['bound_1.15xdensity']:.3f})")
        elif "ms" in r:
            print(f"{r['shape']:<18}{r['row']:<36}{r['ms']:>9.3f}{r['tflops']:>9.0f}{r['cosine']:>10.6f}"
                  f"{r['x_cudnn']:>9.3f}{r['x_fa4']:>8.3f}")
        else:
            print(f"{r['shape']:<18}{r['row']:<36} {r['status'][:150]}")


if __name__ == "__main__":
    main()
