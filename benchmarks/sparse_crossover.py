"""Where the gate starts to choose a sparse form: ``attach(sparse=...)`` at growing sequence lengths.

The issue asks for sparse forms "only above a sequence length that the gate measures rather than
assumes". ditgate has no length threshold: the gate times every candidate, the selection included, at
each site and shape. This script shows where that lands. Per latent frame count of one model (diffusers'
class at the published width, ``--layers`` blocks, random weights, bf16), it attaches with a sparse
setting (budget ``--budget`` on every step and layer) and the exact forms named, runs one forward (the
calibrating one), and records, for the first block's self-attention: the sequence length, each
candidate's time and ratio to the host, and which form the gate chose. Then the whole forward, host
against plan.

    python benchmarks/sparse_crossover.py --out DIR [--model wan-14b-480p-81f --frames 1 2 3 5 9 13 21]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import ditgate
from ditgate.gate import compare, environment
from ditgate.gate.profiles import PROFILES
from ditgate.gate.timing import warm_samples
from ditgate.hosts import model_output

sys.path.insert(0, str(Path(__file__).parent))
import sparse_attention  # noqa: E402  (the same model construction as the sparse benchmark)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="ditgate-out")
    ap.add_argument("--model", default="wan-14b-480p-81f")
    ap.add_argument("--frames", nargs="+", type=int, default=[1, 2, 3, 5, 9, 13, 21])
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--budget", type=float, default=0.3)
    ap.add_argument("--exact", nargs="+", default=["fa4", "sdpa_cudnn"], help="exact candidates beside the sparse ones")
    ap.add_argument("--sparse-forms", nargs="+", default=["block_sparse", "fp8_sparse"])
    ap.add_argument("--device", default="cuda", help="cpu: a dry run (TRITON_INTERPRET=1, a tiny preset)")
    ap.add_argument("--config", default="{}", help="JSON overrides of the model config (dry runs)")
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--min-call-cosine", type=float, default=None,
                    help="lower the speed profile's per-call cosine floor, to see the speed crossover alone")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = sparse_attention.DEVICE = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    rows: list[dict] = []
    setting = ditgate.SparseSetting(ditgate.BudgetSchedule(args.budget, dense_steps=0, dense_layers=0),
                                    block=args.block, forms=tuple(args.sparse_forms))
    profile = PROFILES["speed"]
    if args.min_call_cosine is not None:
        profile = dataclasses.replace(profile, min_call_cosine=args.min_call_cosine, min_output_cosine=args.min_call_cosine)
    for frames in args.frames:
        preset, model, inputs = sparse_attention.build(args.model, args.layers, dtype, json.loads(args.config),
                                                       {"frames": frames})
        with torch.no_grad():
            host_out = model_output(model(**inputs))
            host_ms = statistics.median(warm_samples(lambda: model(**inputs), device, 5))
            plan = ditgate.attach(model, profile=profile, forms=args.exact + args.sparse_forms, sparse=setting)
            t0 = time.perf_counter()
            model(**inputs)  # the calibrating forward: every candidate measured at every site
            calibrate_s = time.perf_counter() - t0
            plan_out = model_output(model(**inputs))
            plan_ms = statistics.median(warm_samples(lambda: model(**inputs), device, 5))
        report = plan.report()
        plan.detach()
        site = next(s for s in report.sites if s.role == "self")
        verdict = site.verdicts[0]
        row = {"model": args.model, "frames": frames, "tokens": preset.video_tokens, "site": site.name,
               "shape": verdict.shape_key, "chosen": verdict.form or "host", "summary": verdict.summary,
               "candidates": {m.form: {"ms": m.form_ms, "host_ms": m.host_ms, "ratio": m.ratio, "cosine": m.cosine}
                              for m in verdict.measured},
               "refusals": [r.text() for r in verdict.refusals if r.kind != "not allowed"],
               "whole_host_ms": host_ms, "whole_plan_ms": plan_ms, "whole_x": host_ms / plan_ms,
               "whole_cosine": compare(plan_out, host_out).cosine, "calibrate_s": calibrate_s}
        rows.append(row)
        print(f"{row['tokens']} tokens: {row['chosen']}; " + "; ".join(row["refusals"]) +
              f"; whole {row['whole_x']:.3f}x", flush=True)
        (out / f"sparse-crossover-{args.model}{'-floor' if args.min_call_cosine else ''}.json").write_text(json.dumps(
            {"environment": environment(device), "date": time.strftime("%Y-%m-%d"),
             "command": "python benchmarks/sparse_crossover.py " + " ".join(sys.argv[1:]), "rows": rows}, indent=2))
        del model, plan
        if device.type == "cuda":
            torch.cuda.empty_cache()
    names = sorted({f for r in rows for f in r["candidates"]})
    print(f"{'tokens':>8}  {'chosen':<14}" + "".join(f"{n[:12]:>13}" for n in names) + f"{'whole x':>9}")
    for r in rows:
        cells = "".join(f"{r['candidates'][n]['ratio']:>12.2f}x" if n in r["candidates"] else f"{'-':>13}" for n in names)
        print(f"{r['tokens']:>8}  {r['chosen']:<14}{cells}{r['whole_x']:>9.3f}")


if __name__ == "__main__":
    main()
