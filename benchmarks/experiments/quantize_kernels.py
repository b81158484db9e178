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
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Passes:
    """The quantization's launches one at a time, over buffers made once (the Hopper schedule's FP8 copies with the
    selector's sums, as ``quantize_for_schedule(sums=True)`` makes them): each maker gives a launch to time."""

    first_pass: Callable[[int, int, int], Callable[[], object]]  # (programs, of them quantizing Q, warps)
    scales: Callable[[int], Callable[[], object]]  # (warps)
    kv: Callable[[int, int], Callable[[], object]]  # (PART: 0 K and V, 1 K, 2 V; warps)
    kv_args: tuple  # ``_quant_kv_kernel``'s arguments before its flags (an earlier module's kernel takes the same)
    q_programs: int
    kv_programs: int


def pass_launches(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads_inner: bool = True) -> Passes:
    """``Passes`` for these B=1, H, S, D inputs, the programs of each pass in ``heads_inner``'s order."""
    _, H, S, D = q.shape
    bm, bn = ha.ROWS_HALF, ha.ROWS_K
    n_m, n_n = -(-S // bm), -(-S // bn)
    q8 = torch.empty(H, n_m * bm, D, dtype=torch.float8_e4m3fn, device=q.device)
    k8 = torch.empty(H, n_n * bn, D, dtype=torch.float8_e4m3fn, device=q.device)
    vt8 = torch.empty(H, D, n_n * bn, dtype=torch.float8_e4m3fn, device=q.device)
    qs, ks = (torch.empty(H, n, device=q.device) for n in (n_m, n_n))
    q_sums = torch.empty(1, H, n_m, D, device=q.device)
    k_sums, v_max = (torch.empty(1, H, n_n, D, device=q.device) for _ in range(2))
    mean, v_scale = torch.zeros(H, D, device=q.device), torch.full((H, D), 0.01, device=q.device)
    q_programs, kv_programs = n_m * H, n_n * H
    kv_args = (k, k8, ks, mean, v, vt8, v_scale, *k.stride(), *v.stride(), H, S, n_n * bn, n_n, kv_programs)

    def first_pass(programs, q_part, warps):
        return lambda: qa._first_pass_kernel[(programs,)](
            q, q8, qs, q_sums, k, v, k_sums, v_max, *q.stride(), *k.stride(), *v.stride(), H, H, S, S, n_m * bm,
            n_m, n_n, q_part, 1.0, D=D, BLOCK_M=bm, BLOCK_N=bn, TO_INT8=False, QMAX=448.0, HAS_SUMS=True,
            HEADS_INNER=heads_inner, num_warps=warps)

    def scales(warps):
        return lambda: qa._kv_scales_kernel[(H, D // 32)](
            k_sums, v_max, torch.empty(H, D, device=q.device), torch.empty(H, D, device=q.device), n_n, S, D=D,
            COLS=32, CHUNK=min(256, triton.next_power_of_2(n_n)), num_warps=warps)

    def kv(part, warps):
        return lambda: qa._quant_kv_kernel[((2 if part == 0 else 1) * kv_programs,)](
            *kv_args, D=D, BLOCK=bn, TO_INT8=False, QMAX=448.0, PERMUTE=True, PART=part, HEADS_INNER=heads_inner,
            num_warps=warps)

    return Passes(first_pass, scales, kv, kv_args, q_programs, kv_programs)


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
        p = pass_launches(q, k, v)
        for warps in args.warps:  # every part at each (quantize launches the first pass at qa.FIRST_PASS_WARPS)
            parts = {
                "Q with sums alone (the first pass's Q programs)": p.first_pass(p.q_programs, p.q_programs, warps),
                "K sums and V absmax alone (its K/V programs)": p.first_pass(p.kv_programs, 0, warps),
                "Q with sums, K sums and V absmax (one launch)": p.first_pass(p.q_programs + p.kv_programs,
                                                                              p.q_programs, warps),
                "K's mean and V's scales": p.scales(warps),
                **{f"{what} quantized": p.kv(part, warps) for what, part in (("K and V", 0), ("K", 1), ("V", 2))},
            }
            if before:
                parts["V quantized, before"] = lambda: before._quant_kv_kernel[(p.kv_programs,)](
                    *p.kv_args, D=D, BLOCK=ha.ROWS_K, TO_INT8=False, QMAX=448.0, PERMUTE=True, PART=2,
                    num_warps=warps)
            for part, fn in parts.items():
                ms = bench(fn)
                record(shape=shape, part=part, warps=warps, ms=ms)
        del q, k, v, p
        torch.cuda.empty_cache()
    print(f"{'shape':<6}{'part':<64}{'warps':>6}{'ms':>8}")
    for r in rows:
        print(f"{r['shape']:<6}{r['part']:<64}{r.get('warps', ''):>6}{r['ms']:>8.3f}")


if __name__ == "__main__":
    main()
