"""What inductor's fusion of a feed-forward's GELU with the row-wise FP8 quantization of its output costs, at the
down projections of Wan 2.1 1.3B and Flux 1024 (GPU).

In a compiled plan an ``fp8_linear`` site's input quantization is torch ops inside the graph
(``Fp8RowwiseLinear.graph_serve``), which inductor fuses into the kernel that makes the input. At the feed-forward's
down projection that kernel is the GELU: one reduction kernel computes each row's absmax of GELU(h), then GELU(h) again
to cast it. On an H100 (round 2l, Wan 10 blocks) that kernel took 1.08 ms per call where stock's GELU alone took
0.41. Variants, each on the same random bf16 ``h`` [M, K] (the up projection's output):

    gelu               compiled GELU alone (what stock runs)
    gelu+quant         compiled GELU and the row-wise quantization (graph_serve's torch ops), fused by inductor
    gelu, triton quant compiled GELU, then ditgate's one-launch Triton quantization (kernels.rowwise_quant)
    gelu+quant+mm      compiled GELU, quantization and the FP8 product (graph_serve whole)
    gelu+mm bf16       compiled GELU and the bf16 product (the host)
    gelu+quant, tuned  gelu+quant with inductor's coordinate-descent tuning of the kernel's blocks and warps
    gelu+quant, recip  gelu+quant with each row's reciprocal scale multiplied in, not divided by per element
    gelu | quant       compiled GELU, then the quantization compiled as a graph of its own (inductor's standalone
                       quantization kernel)

    PYTHONPATH=. python benchmarks/experiments/quant_fusion.py [--out DIR] [--shapes wan flux] [--no-tuned]
        [--quantization-only]

Medians of ``triton.testing.do_bench`` (warm-up 25, 100 ms). The generated code of ``gelu+quant`` goes to
``DIR/gelu-quant-<shape>.py``; its kernels' launch settings are printed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from ditgate.forms.linear import FP8_MAX, Fp8RowwiseLinear, quantize_fp8, rowwise_scale

SHAPES = {"wan": (32760, 8960, 1536), "flux": (4096, 12288, 3072)}  # M, K (the GELU's width), N


def gelu(h: torch.Tensor) -> torch.Tensor:
    return F.gelu(h, approximate="tanh")


def quantize_fp8_reciprocal(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``forms.linear.quantize_fp8`` with one reciprocal per row multiplied in (a rounding apart per element)."""
    scale = rowwise_scale(t, FP8_MAX)
    return (t.float() * scale.reciprocal()).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def compiled(fn):
    return torch.compile(fn, fullgraph=True, dynamic=False)


def ms(fn) -> float:
    import triton.testing
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def kernel_settings(code: str) -> list[str]:
    """The lines of inductor's generated module that say how each kernel launches (size hints, blocks, warps)."""
    keys = ("def triton_", "size_hints", "num_warps", "XBLOCK", "R0_BLOCK", "RBLOCK")
    return [line.strip()[:160] for line in code.splitlines() if any(k in line for k in keys)][:40]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="ditgate-out")
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--no-tuned", action="store_true", help="skip the coordinate-descent variant (it tunes for a while)")
    p.add_argument("--quantization-only", action="store_true", help="skip the variants with products")
    args = p.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    from torch._inductor.utils import run_and_get_code

    from ditgate.kernels.rowwise_quant import quantize_rows
    rows = []
    for shape in args.shapes:
        m, k, n = SHAPES[shape]
        gen = torch.Generator(device="cuda").manual_seed(0)
        h = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        w = (torch.randn(n, k, device="cuda", generator=gen) / k ** 0.5).to(torch.bfloat16)
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=gen)
        weights = Fp8RowwiseLinear().quantize(w)  # [N, K] e4m3 and [1, N] scales, as a site keeps them
        data, scale = weights.data, weights.scale
        row = {"shape": shape, "M": m, "K": k, "N": n}
        with torch.no_grad():
            fn = compiled(gelu)
            row["gelu"] = ms(lambda: fn(h))
            fused = compiled(lambda t: quantize_fp8(gelu(t)))
            (q_fused, s_fused), codes = run_and_get_code(fused, h)
            (out_dir / f"gelu-quant-{shape}.py").write_text("\n\n".join(codes))
            row["gelu+quant"] = ms(lambda: fused(h))
            row["gelu, triton quant"] = ms(lambda: quantize_rows(fn(h), True))
            q_triton, s_triton = quantize_rows(fn(h), True)
            row["same values"] = bool(torch.equal(q_fused.view(torch.uint8), q_triton.view(torch.uint8)))
            row["same scales"] = bool(torch.equal(s_fused, s_triton))
            recip = compiled(lambda t: quantize_fp8_reciprocal(gelu(t)))
            row["gelu+quant, recip"] = ms(lambda: recip(h))
            alone = compiled(quantize_fp8)
            row["gelu | quant"] = ms(lambda: alone(fn(h)))
            if not args.quantization_only:
                whole = compiled(lambda t: Fp8RowwiseLinear.graph_serve(gelu(t), data, scale, None, b, True))
                row["gelu+quant+mm"] = ms(lambda: whole(h))
                host = compiled(lambda t: F.linear(gelu(t), w, b))
                row["gelu+mm bf16"] = ms(lambda: host(h))
            if not args.no_tuned:
                with torch._inductor.config.patch(coordinate_descent_tuning=True):
                    tuned = compiled(lambda t: quantize_fp8(gelu(t)))
                    _, tuned_codes = run_and_get_code(tuned, h)
                row["gelu+quant, tuned"] = ms(lambda: tuned(h))
                (out_dir / f"gelu-quant-tuned-{shape}.py").write_text("\n\n".join(tuned_codes))
        rows.append(row)
        print(json.dumps(row))
        print(f"{shape}: the fused kernel's launch settings")
        for line in kernel_settings("\n\n".join(codes)):
            print("   ", line)
    (out_dir / "quant-fusion.json").write_text(json.dumps(rows, indent=1))
    names = [key for key in rows[0] if key not in ("shape", "M", "K", "N", "same values", "same scales")]
    print(f"{'variant':24}" + "".join(f"{r['shape']:>12}" for r in rows) + "   (ms, median)")
    for name in names:
        print(f"{name:24}" + "".join(f"{r.get(name, float('nan')):12.4f}" for r in rows))


if __name__ == "__main__":
    main()
