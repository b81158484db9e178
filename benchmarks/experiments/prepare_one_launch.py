"""The quantization in one launch (``quantize(one_launch=True)``, ``_prepare_kernel``) against its three launches, at
the Wan-14B and LTX long shapes (random bf16 in diffusers' [B, S, H, D] storage, the Hopper schedule's copies with
the selector's sums). Why: the three launches read K and V twice (once for K's mean and V's scales, once to
quantize them); at LTX that second read is 226 MB of the call's pre-pass, about 0.05 ms of 2.8.

    python benchmarks/experiments/prepare_one_launch.py --out DIR [--shapes ltx wan] [--warps 2 4 8] [--lags 1 2]
        [--rounds 3] [--calls 200]

First the copies: each variant's against the three launches' (bytes that differ; K's mean, whose sum may run in
another order), and ``--calls`` launches back to back with a check that the counters are zero after them (a
launch that never ended would hang here, so the stage runs this under ``timeout``). Then ``do_bench`` medians,
the variants in turn, ``--rounds`` times."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import triton.testing

from ditgate.forms.workspace import WorkspacePool
from ditgate.kernels import hopper_attention as ha
from ditgate.kernels import quant_attention as qa
from json_rows import recorder  # beside this script (its directory is on the path)

SHAPES = {"ltx": (32, 27588, 64), "wan": (40, 32760, 128)}
FIELDS = ("q", "q_scale", "k", "k_scale", "vt", "v_scale", "k_sums", "q_sums")


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200)


def quantizer(q, k, v, pool: WorkspacePool, one_launch: bool, warps: int | None = None, lag: int | None = None,
              tickets: bool = True):
    """The Hopper schedule's quantization with the selector's sums, into ``pool``'s buffers."""
    def buffers(shape, dtype, name):
        return pool.get(shape, dtype, q.device, f"fp8:{name}")

    config = qa.KernelConfig(ha.ROWS_HALF, ha.ROWS_K)
    return lambda: qa.quantize(q, k, v, "fp8", q.shape[3] ** -0.5, config, buffers, permute_v=True, sums=True,
                               one_launch=one_launch, warps=warps, lag=lag, tickets=tickets)


def differing(a: torch.Tensor, b: torch.Tensor) -> int:
    if a.dtype == torch.float8_e4m3fn:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return int((a != b).sum())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="ditgate-out")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--warps", nargs="+", type=int, default=[2, 4, 8])
    ap.add_argument("--lags", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--tickets", nargs="+", type=int, default=[1, 0], help="1: programs take tickets (an atomic), 0: "
                    "programs in the order of their ids")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record, rows = recorder(out, "prepare-one-launch.json", "benchmarks/experiments/prepare_one_launch.py")
    for shape in args.shapes:
        H, S, D = SHAPES[shape]
        q, k, v = (torch.randn(1, S, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
        k = k + 0.5  # a common offset, as real keys have: K's mean matters
        three_pool = WorkspacePool()
        three = quantizer(q, k, v, three_pool, False)
        made = three()
        ref = {f: getattr(made, f).clone() for f in FIELDS}
        variants = {"three launches": three}
        for warps, lag, tickets in ((w, g, t) for t in args.tickets for w in args.warps for g in args.lags):
            pool = WorkspacePool()
            name = f"one launch, {warps} warps, lag {lag}" + ("" if tickets else ", in pid order")
            fn = variants[name] = quantizer(q, k, v, pool, True, warps, lag, bool(tickets))
            got = fn()
            torch.cuda.synchronize()
            diffs = {f: differing(ref[f], getattr(got, f)) for f in FIELDS}
            for _ in range(args.calls):
                fn()
            torch.cuda.synchronize()
            counters = pool.get((2 + 2 * H,), torch.int32, q.device, "fp8:counters")
            again = fn()
            record(shape=shape, part="check", warps=warps, lag=lag, tickets=bool(tickets), differing=diffs,
                   counters_zero_after=bool((counters == 0).all()) if tickets else None, calls=args.calls + 2,
                   same_after_calls=all(differing(ref[f], getattr(again, f)) == diffs[f] for f in FIELDS),
                   v_scale_equal=diffs["v_scale"] == 0)
        for r in range(args.rounds):
            for name, fn in variants.items():
                record(shape=shape, part=name, round=r, ms=bench(fn))
        del q, k, v, three_pool, variants, made
        torch.cuda.empty_cache()
    print(f"{'shape':<6}{'variant':<48}{'ms per round':>30}")
    for shape in args.shapes:
        names = dict.fromkeys(r["part"] for r in rows if r["shape"] == shape and "round" in r)
        for name in names:
            ms = [r["ms"] for r in rows if r["shape"] == shape and r["part"] == name]
            print(f"{shape:<6}{name:<48}{' '.join(f'{m:.4f}' for m in ms):>30}")
    for r in rows:
        if r["part"] == "check":
            print(r["shape"], r["warps"], r["lag"], r["tickets"], "differing:", {f: n for f, n in r["differing"].items() if n},
                  "counters zero:", r["counters_zero_after"], "steady:", r["same_after_calls"])


if __name__ == "__main__":
    main()
