"""The quantization's three launches one at a time (Q beside K's sums and V's absmax; K's mean and V's scales; K
and V), at 4 and 8 warps per program, against reading Q once, at the Wan-14B and LTX long shapes (random bf16 in
diffusers' [B, S, H, D] storage; ``triton.testing.do_bench`` medians). Why: at budget 0.3 the FP8 block-sparse
call spends about 0.8 ms of 8.3 quantizing at Wan-14B (results s12), and the passes move about 2.2 GB, well under
the H200's bandwidth.

    python benchmarks/experiments/quantize_kernels.py --out DIR [--warps 4 8] [--before FILE]

``--before``: an earlier commit's quant_attention (``module_file.load_module``), whose whole quantization and V
pass are timed in the same run. Call a of results 2026-12-04-h200-s14 also timed 2 and 4 blocks of Q per program
of the first pass (an option since removed: no change)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import triton.testing

from ditgate.kernels import hopper_attention as ha
from ditgate.kernels import quant_attention as qa
from json_rows import recorder  # beside this script (its directory is on the path)
from module_file import load_module

SHAPES = {"wan": (40, 32760, 128), "ltx": (32, 27588, 64)}


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="ditgate-out")
    ap.add_argument("--before")
    ap.add_argument("--warps", nargs="+", type=int, default=[4, 8])
    args = ap.parse_args()
    before = load_module(args.before, "quant_attention_before") if args.before else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record, rows = recorder(out, "quantize-kernels.json", "benchmarks/experiments/quantize_kernels.py")

    for shape, (H, S, D) in SHAPES.items():
        q, k, v = (torch.randn(1, S, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
        gb = q.numel() * 2 / 1e9
        record(shape=shape, part="read Q once (q.sum)", ms=bench(lambda: q.sum(dim=2, dtype=torch.float32)), gb=gb)
        record(shape=shape, part="quantize_for_schedule(sums=True)",
               ms=bench(lambda: ha.quantize_for_schedule(q, k, v, "fp8", D ** -0.5, sums=True)))
        if before:
            config = before.KernelConfig(ha.ROWS_HALF, ha.ROWS_K)
            record(shape=shape, part="quantize_for_schedule(sums=True), before",
                   ms=bench(lambda: before.quantize(q, k, v, "fp8", D ** -0.5, config, permute_v=True, sums=True)))
        bm, bn = ha.ROWS_HALF, ha.ROWS_K
        n_m, n_n = -(-S // bm), -(-S // bn)
        q8 = torch.empty(H, n_m * bm, D, dtype=torch.float8_e4m3fn, device="cuda")
        k8 = torch.empty(H, n_n * bn, D, dtype=torch.float8_e4m3fn, device="cuda")
        vt8 = torch.empty(H, D, n_n * bn, dtype=torch.float8_e4m3fn, device="cuda")
        qs, ks = (torch.empty(H, n, device="cuda") for n in (n_m, n_n))
        q_sums = torch.empty(1, H, n_m, D, device="cuda")
        k_sums, v_max = (torch.empty(1, H, n_n, D, device="cuda") for _ in range(2))
        mean, v_scale = torch.zeros(H, D, device="cuda"), torch.full((H, D), 0.01, device="cuda")
        q_programs, kv_programs = n_m * H, n_n * H
        first, scales, kv = qa._first_pass_kernel, qa._kv_scales_kernel, qa._quant_kv_kernel
        def first_pass(programs, q_part, warps):
            """The first pass over ``programs`` programs, the first ``q_part`` of them quantizing Q."""
            return lambda: first[(programs,)](
                q, q8, qs, q_sums, k, v, k_sums, v_max, *q.stride(), *k.stride(), *v.stride(), H, H, S, S, n_m * bm,
                n_m, n_n, q_part, 1.0, D=D, BLOCK_M=bm, BLOCK_N=bn, TO_INT8=False, QMAX=448.0, HAS_SUMS=True,
                HEADS_INNER=True, num_warps=warps)

        for warps in args.warps:  # every part at each (quantize launches the first pass at qa.FIRST_PASS_WARPS)
            parts = {
                "Q with sums alone (the first pass's Q programs)": first_pass(q_programs, q_programs, warps),
                "K sums and V absmax alone (its K/V programs)": first_pass(kv_programs, 0, warps),
                "Q with sums, K sums and V absmax (one launch)": first_pass(q_programs + kv_programs, q_programs,
                                                                            warps),
                "K's mean and V's scales": lambda: scales[(H, D // 32)](
                    k_sums, v_max, torch.empty(H, D, device="cuda"), torch.empty(H, D, device="cuda"), n_n, S, D=D,
                    COLS=32, CHUNK=min(256, triton.next_power_of_2(n_n)), num_warps=warps),
                **{f"{what} quantized": lambda part=part, programs=programs: kv[(programs,)](
                    k, k8, ks, mean, v, vt8, v_scale, *k.stride(), *v.stride(), H, S, n_n * bn, n_n, kv_programs,
                    D=D, BLOCK=bn, TO_INT8=False, QMAX=448.0, PERMUTE=True, PART=part, HEADS_INNER=True,
                    num_warps=warps)
                   for what, part, programs in (("K and V", 0, 2 * kv_programs), ("K", 1, kv_programs),
                                                ("V", 2, kv_programs))},
            }
            if before:
                parts["V quantized, before"] = lambda: before._quant_kv_kernel[(kv_programs,)](
                    k, k8, ks, mean, v, vt8, v_scale, *k.stride(), *v.stride(), H, S, n_n * bn, n_n, kv_programs,
                    D=D, BLOCK=bn, TO_INT8=False, QMAX=448.0, PERMUTE=True, PART=2, num_warps=warps)
            for part, fn in parts.items():
                ms = bench(fn)
                record(shape=shape, part=part, warps=warps, ms=ms)
        del q, k, v, q8, k8, vt8
        torch.cuda.empty_cache()
    print(f"{'shape':<6}{'part':<64}{'warps':>6}{'ms':>8}")
    for r in rows:
        print(f"{r['shape']:<6}{r['part']:<64}{r.get('warps', ''):>6}{r['ms']:>8.3f}")


if __name__ == "__main__":
    main()
