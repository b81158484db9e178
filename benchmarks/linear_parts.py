"""The fp8 linear form's parts timed apart at Wan 1.3B's and Flux's shapes: bf16 F.linear (the host), the row-wise
quantization (torch ops, and ditgate's Triton kernel at a few block shapes), torch._scaled_mm alone (as the form
calls it, and with exact and fast accumulation, each with its cosine and relative L2 to float32 on fresh inputs), the
whole form; beside them the tensor-wise product and quantization (``fp8_tensor_linear``).

    python benchmarks/linear_parts.py [--out DIR]      (CUDA)
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing

from ditgate.forms.linear import Fp8RowwiseLinear, Fp8TensorwiseLinear, quantize_fp8, quantize_fp8_tensor
from ditgate.kernels.rowwise_quant import quantize_rows

SHAPES = [(32760, 1536, 1536), (32760, 1536, 8960), (32760, 8960, 1536), (4608, 3072, 3072), (4608, 3072, 12288)]
CONFIGS = [(8, 512, 4), (16, 256, 4), (4, 1024, 4), (1, 2048, 4), (2, 1024, 8), (32, 128, 4)]


def ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="ditgate-out")
    args = p.parse_args()
    rows = []
    form = Fp8RowwiseLinear()
    for m, k, n in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        qw = form.quantize(w)
        xq, xs = quantize_rows(x, True)
        row = {"shape": f"M{m}:K{k}:N{n}", "bytes_quant": m * k * 3}
        row["host_linear"] = ms(lambda: F.linear(x, w, b))
        row["quant_torch_ops"] = ms(lambda: quantize_fp8(x))
        for bm, bk, warps in CONFIGS:
            row[f"quant_triton_{bm}x{bk}w{warps}"] = ms(lambda: quantize_rows(x, True, bm, bk, warps))
        row["scaled_mm"] = ms(lambda: torch._scaled_mm(xq, qw.data.t(), scale_a=xs, scale_b=qw.scale, bias=b,
                                                       out_dtype=torch.bfloat16, use_fast_accum=form.fast_accumulation))
        row["scaled_mm_exact_accum"] = ms(lambda: torch._scaled_mm(xq, qw.data.t(), scale_a=xs, scale_b=qw.scale,
                                                                   bias=b, out_dtype=torch.bfloat16,
                                                                   use_fast_accum=False))
        row["scaled_mm_fast_accum"] = ms(lambda: torch._scaled_mm(xq, qw.data.t(), scale_a=xs, scale_b=qw.scale,
                                                                  bias=b, out_dtype=torch.bfloat16,
                                                                  use_fast_accum=True))
        row["form"] = ms(lambda: form.run(x, qw, b))
        ref = F.linear(x.float(), w.float(), b.float())
        fresh = torch.randn_like(x)
        ref_fresh = F.linear(fresh.float(), w.float(), b.float()).flatten()
        fq, fs = quantize_rows(fresh, True)
        for accum, fast in (("exact", False), ("fast", True)):
            product = torch._scaled_mm(fq, qw.data.t(), scale_a=fs, scale_b=qw.scale, bias=b, out_dtype=torch.bfloat16,
                                       use_fast_accum=fast)
            row[f"cosine_{accum}_accum"] = F.cosine_similarity(product.float().flatten(), ref_fresh, dim=0).item()
            row[f"rel_l2_{accum}_accum"] = ((product.float().flatten() - ref_fresh).norm() / ref_fresh.norm()).item()
        # the same product with one scale per tensor (cuBLAS's plain FP8 GEMM, no outer-vector scales)
        tensor_form = Fp8TensorwiseLinear()
        tw = tensor_form.quantize(w)
        xt, xts = quantize_fp8_tensor(x)
        row["scaled_mm_tensorwise"] = ms(lambda: torch._scaled_mm(xt, tw.data.t(), scale_a=xts, scale_b=tw.scale,
                                                                  bias=b, out_dtype=torch.bfloat16,
                                                                  use_fast_accum=tensor_form.fast_accumulation))
        row["quant_tensorwise_torch_ops"] = ms(lambda: quantize_fp8_tensor(x))
        row["cosine_tensorwise"] = F.cosine_similarity(tensor_form.run(x, tw, b).float().flatten(), ref.flatten(),
                                                       dim=0).item()
        out = form.run(x, qw, b).float()
        row["cosine"] = F.cosine_similarity(out.flatten(), ref.flatten(), dim=0).item()
        rows.append(row)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "linear-parts.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows},
                                                                 indent=1))
    best = {r["shape"]: min((v, k) for k, v in r.items() if k.startswith("quant_triton")) for r in rows}
    print("best quantization config per shape:", {s: (k, round(v, 4)) for s, (v, k) in best.items()})
    print("median over shapes:", {k: round(statistics.median(r[k] for r in rows), 4) for k in rows[0]
                                  if k.startswith("quant_") or k in ("host_linear", "scaled_mm", "form",
                                                                     "scaled_mm_tensorwise", "scaled_mm_exact_accum",
                                                                     "scaled_mm_fast_accum")})


if __name__ == "__main__":
    main()
