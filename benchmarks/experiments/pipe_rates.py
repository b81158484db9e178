"""Which SM unit the softmax's instructions share: throughput of exp2 (``MUFU.EX2``), of the packed
conversions that turn P into the P·V operand (``F2FP``: fp32 pairs to e4m3 or bf16), and of the two mixed
in the proportion the softmax has them (two exp2s per conversion), on the GPU at hand.

Why: with an 8-bit P, the softmax issues one conversion per two exp2s. If the conversions run on the
exp2 unit, that unit carries 1.5 times the exp2 count and the FP8 kernel at head dim 64 sits near its
bound; if they run elsewhere, the bound is the exp2s alone. Each thread runs eight independent chains
(enough in flight to measure throughput, not latency), every program the same; times are do_bench
medians, reported as warp-instructions per microsecond per SM. The clock is not read: the ratios
between rows of one run say which units are shared.

    python benchmarks/experiments/pipe_rates.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
import triton.testing

EX2 = "ex2.approx.ftz.f32 $0, $1;"
# a pair of fp32 to two e4m3 bytes, the 16 bits then widened back to 32 (the chain needs a 32-bit value)
E4M3 = "{ .reg .b16 t; cvt.rn.satfinite.e4m3x2.f32 t, $1, $1; cvt.u32.u16 $0, t; }"
BF16 = "cvt.rn.bf16x2.f32 $0, $1, $1;"
WIDEN = "{ .reg .b16 t; mov.b32 {t, _}, $1; cvt.u32.u16 $0, t; }"  # the widening alone, to subtract
FFMA = "fma.rn.f32 $0, $1, 0f3F800001, 0f3F000000;"
IADD = "add.u32 $0, $1, 12345;"

OPS = {"ex2": EX2, "e4m3x2": E4M3, "bf16x2": BF16, "widen": WIDEN, "ffma": FFMA, "iadd": IADD}


@triton.jit
def _op(x, ASM: tl.constexpr):
    """One asm op on 32-bit registers (PTX takes .b32 registers as f32 operands)."""
    return tl.inline_asm_elementwise(ASM, "=r,r", [x], dtype=tl.float32, is_pure=False, pack=1)


@triton.jit
def _rates_kernel(X, ITERS, A: tl.constexpr, B: tl.constexpr, B_EVERY: tl.constexpr, BLOCK: tl.constexpr):
    """ITERS rounds of B_EVERY ops A then (if B) one op B, on BLOCK values (eight per thread)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs)
    for _ in range(ITERS):
        for _k in tl.static_range(B_EVERY):
            x = _op(x, A)
        if B != "":
            x = _op(x, B)
    tl.store(X + offs, x)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="ditgate-out")
    ap.add_argument("--iters", type=int, default=4096)
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    warps, per_thread = 8, 8
    block = warps * 32 * per_thread
    programs = sms * 8
    x = torch.rand(programs * block, device="cuda") * 0.5 + 0.25
    rows = []
    # (name, op A, op B or "", A's per B): each alone, then the softmax's mix
    cases = [("ex2", "ex2", "", 1), ("e4m3x2+widen", "e4m3x2", "", 1), ("widen", "widen", "", 1),
             ("bf16x2", "bf16x2", "", 1), ("ffma", "ffma", "", 1), ("iadd", "iadd", "", 1),
             ("2 ex2 + e4m3x2", "ex2", "e4m3x2", 2), ("2 ex2 + widen", "ex2", "widen", 2),
             ("2 ex2 + bf16x2", "ex2", "bf16x2", 2), ("2 ex2 + ffma", "ex2", "ffma", 2)]
    for name, a, b, every in cases:
        def call():
            _rates_kernel[(programs,)](x, args.iters, OPS[a], OPS[b] if b else "", every, block, num_warps=warps)

        call()
        ms = triton.testing.do_bench(call, warmup=10, rep=100)
        per_round = every + (1 if b else 0)
        warp_instr = programs * warps * per_thread * args.iters * per_round  # per-thread ops / thread = warp ops
        rows.append(dict(case=name, ms=ms, rounds=args.iters, ops_per_round=per_round,
                         warp_instr_per_us_per_sm=warp_instr / (ms * 1e3) / sms,
                         rounds_per_us_per_sm=programs * warps * per_thread * args.iters / (ms * 1e3) / sms))
        print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pipe-rates.json").write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M"), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "triton": triton.__version__, "command": "python benchmarks/experiments/pipe_rates.py", "rows": rows},
        indent=1))
    print("\ncase               ms    warp-instr/us/SM   rounds/us/SM")
    for r in rows:
        print(f"{r['case']:16} {r['ms']:8.3f} {r['warp_instr_per_us_per_sm']:12.1f} {r['rounds_per_us_per_sm']:12.1f}")


if __name__ == "__main__":
    main()
