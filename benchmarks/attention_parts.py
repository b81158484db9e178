"""The 8-bit attention forms' parts timed apart at image and video lengths: where the time of ``fa3_fp8``, ``fp8``
and ``int8`` goes beside the exact kernels (cuDNN, FA3), to see what a faster 8-bit path at image lengths must cut.

Per shape (B=1, H heads, S tokens, head dim D; random bf16 in diffusers' B, S, H, D storage, B, H, S, D views):
- exact: cuDNN (SDPA), FA3 bf16 (``torch.ops.fa3_fwd.fwd``);
- fa3_fp8: ``quantize_heads`` whole and at another program size, its reducing launch alone, its quantizing
  launch alone (what one pass over the inputs with known scales would cost), the one pass at carried scales
  (``fp8_heads_carried``) with nothing to repair and with every head repaired, FA3's FP8 kernel alone on the
  copies, and the form whole, without a site (two passes) and at a site after its first call (one pass);
- ditgate's Hopper kernel: ``quantize_for_schedule`` alone, and in one read at carried statistics
  (``quant_passes_carried``), the kernel alone on those copies, the forms whole, without a site and at a site after
  its first call;
- a copy of Q, K and V (bytes read and written per ms: the card's bandwidth as torch reaches it).
Rows are interleaved over rounds; each figure is the median over rounds of ``do_bench`` medians (ms).

    python benchmarks/attention_parts.py [--out DIR] [--rounds N] [--shapes flux-1024 ...]     (CUDA, Hopper)
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

from ditgate.cli.bench_kernels import KERNEL_PRESETS
from ditgate.forms.base import AttentionInputs
from ditgate.forms.registry import create_forms
from ditgate.kernels import fp8_heads
from ditgate.kernels.fp8_heads_carried import quantize_heads_carried
from ditgate.kernels.hopper_attention import ROWS_HALF, ROWS_K, hopper_attention, quantize_for_schedule
from ditgate.kernels.quant_attention import KernelConfig, quantize
from ditgate.kernels.quant_passes_carried import HEADROOM, quantize_carried, split_statistics, statistics_size

SHAPES = ("flux-1024", "image-8192-hd128", "image-8192-hd64", "wan-14b-480p")
HEAD_VARIANTS = [(8192, 2), (16384, 4)]  # (elements per program, warps)


def ms(fn: Callable[[], object]) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def _heads_launches(q, k, v, which: str) -> Callable[[], None]:
    """One of ``quantize_heads``' two launches alone, on buffers made once (the accumulators left as the first
    call wrote them: the times do not depend on their values)."""
    D = q.shape[3]
    acc = torch.zeros(fp8_heads.accumulator_size(q, k), dtype=torch.int64, device=q.device)
    z = fp8_heads.quantize_heads(q, k, v, accumulators=acc)
    k_sums, amax = fp8_heads.split_accumulators(acc, k)
    p = fp8_heads.programs(q, k, v)
    if which == "reduce":
        return lambda: fp8_heads._reduce_kernel[p.grid](q, k, v, amax, k_sums, *p.strides, *p.shapes, D=D, DP=p.dp,
                                                         BLOCK=p.block, num_warps=fp8_heads.WARPS)
    return lambda: fp8_heads._quantize_kernel[p.grid](q, k, v, z.query, z.key, z.value, amax, k_sums, z.descale,
                                                       *p.strides, *p.shapes, D=D, DP=p.dp, BLOCK=p.block,
                                                       REVERSE=True, GRID_FIRST=False, num_warps=fp8_heads.WARPS)


def _carried(q, k, v, every_call_repaired: bool = False) -> Callable[[], object]:
    """``quantize_heads_carried`` as a site calls it, its two statistics buffers taking turns; with
    ``every_call_repaired`` the inputs alternate with a copy a thousand times larger, so every head of every call
    misses its carried scale (too small, then far too large) and is quantized again."""
    stats = [torch.zeros(fp8_heads.accumulator_size(q, k), dtype=torch.int64, device=q.device) for _ in range(2)]
    repaired = torch.zeros(1, dtype=torch.int32, device=q.device)
    fp8_heads.quantize_heads(q, k, v, accumulators=stats[0])
    inputs = [(q, k, v), tuple(t * 1000 for t in (q, k, v))] if every_call_repaired else [(q, k, v)]

    def call():
        z = quantize_heads_carried(*inputs[0], stats[0], stats[1], repaired)
        stats.reverse()
        inputs.reverse()
        return z
    return call


def _heads_whole(q, k, v, elements: int, warps: int) -> Callable[[], object]:
    def call():
        old = fp8_heads.ELEMENTS_PER_PROGRAM, fp8_heads.WARPS
        fp8_heads.ELEMENTS_PER_PROGRAM, fp8_heads.WARPS = elements, warps
        try:
            return fp8_heads.quantize_heads(q, k, v)
        finally:
            fp8_heads.ELEMENTS_PER_PROGRAM, fp8_heads.WARPS = old
    return call


def kernel_times(fn: Callable[[], object], calls: int = 20) -> dict[str, float]:
    """Mean device microseconds per call of each kernel ``fn`` launches (torch's profiler over ``calls`` calls)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    times: dict[str, float] = {}
    for event in prof.key_averages():
        us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0)
        if us:
            times[event.key[:60]] = round(us / calls, 2)
    return dict(sorted(times.items(), key=lambda kv: -kv[1]))


PROFILED = ("fp8_quant", "int8_quant", "fp8_quant_carried", "form_fa3_fp8_at_site", "form_fp8_at_site")


def rows_for(heads: int, seq: int, dim: int, forms: dict) -> dict[str, Callable[[], object]]:
    gen = torch.Generator(device="cuda").manual_seed(heads * seq + dim)
    q, k, v = (torch.randn(1, seq, heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
               for _ in range(3))
    qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))  # B, S, H, D: FA3's layout, no copy
    inputs = AttentionInputs(q, k, v)
    rows: dict[str, Callable[[], object]] = {}
    copies = [torch.empty_like(t) for t in (qs, ks, vs)]

    def copy_all():
        for dst, src in zip(copies, (qs, ks, vs)):
            dst.copy_(src)
    rows["copy_qkv"] = copy_all

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v)
    rows["cudnn"] = cudnn
    rows["fa3"] = lambda: torch.ops.fa3_fwd.fwd(qs, ks, vs, softmax_scale=None, is_causal=False, num_splits=1)
    for elements, warps in HEAD_VARIANTS:
        rows[f"heads_{elements}w{warps}"] = _heads_whole(q, k, v, elements, warps)
    # the default program size (8192 elements, 2 warps), as the keys say, so that they compare with earlier runs
    rows["heads_reduce_8192w2"] = _heads_launches(q, k, v, "reduce")
    rows["heads_quantize_8192w2"] = _heads_launches(q, k, v, "quantize")
    rows["heads_carried"] = _carried(q, k, v)
    rows["heads_carried_repairing"] = _carried(q, k, v, every_call_repaired=True)
    z = fp8_heads.quantize_heads(q, k, v)
    rows["fa3_fp8_kernel"] = lambda: torch.ops.fa3_fwd.fwd(z.query, z.key, z.value, q_descale=z.descale[0],
                                                           k_descale=z.descale[1], v_descale=z.descale[2],
                                                           softmax_scale=None, is_causal=False, num_splits=1)
    for mode in ("fp8", "int8"):
        scale = dim ** -0.5
        qz = quantize_for_schedule(q, k, v, mode, scale)
        out = torch.empty_like(qs).transpose(1, 2)
        rows[f"{mode}_quant"] = (lambda m=mode: quantize_for_schedule(q, k, v, m, scale))
        rows[f"{mode}_kernel"] = (lambda m=mode, z8=qz: hopper_attention(q, k, v, qk=m, scale=scale, prepared=z8,
                                                                         out=out))
        # in one read at statistics carried from a previous call (here this call's own: nothing to repair)
        last = torch.empty(statistics_size(k), dtype=torch.float32, device="cuda")
        quantize(q, k, v, mode, scale, KernelConfig(ROWS_HALF, ROWS_K), permute_v=True, statistics=last)
        split_statistics(last, k)[1].div_(HEADROOM.value)
        into, repaired = torch.empty_like(last), torch.zeros(1, dtype=torch.int32, device="cuda")
        rows[f"{mode}_quant_carried"] = (lambda m=mode, a=last, b=into, r=repaired: quantize_for_schedule(
            q, k, v, m, scale, quantizer=lambda *args, **kw: quantize_carried(*args[:6], a, b, r, *args[6:], **kw)))
    for name, form in forms.items():
        rows[f"form_{name}"] = (lambda f=form: f.run(inputs))
        # as a routed site runs it after its first call: in one read at what that call left
        at_site = AttentionInputs(q, k, v, site="attention-parts")
        rows[f"form_{name}_at_site"] = (lambda f=form, a=at_site: f.run(a))
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="ditgate-out")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--shapes", nargs="*", default=list(SHAPES))
    args = p.parse_args()
    forms = {n: f for n, f in create_forms(["fa3_fp8", "fp8", "int8"]).items() if f.availability().available}
    results = []
    for name in args.shapes:
        shape = KERNEL_PRESETS[name]
        rows = rows_for(shape.heads, shape.seq, shape.head_dim, forms)
        for fn in rows.values():  # compiles and first calls
            fn()
        torch.cuda.synchronize()
        times: dict[str, list[float]] = {key: [] for key in rows}
        for _ in range(args.rounds):
            for key, fn in rows.items():
                times[key].append(ms(fn))
        row = {"shape": name, "heads": shape.heads, "seq": shape.seq, "head_dim": shape.head_dim}
        row.update({key: statistics.median(values) for key, values in times.items()})
        row["kernels_us"] = {key: kernel_times(rows[key]) for key in PROFILED if key in rows}
        gb = 3 * shape.heads * shape.seq * shape.head_dim * 2 / 1e9
        row["copy_GBps"] = 2 * gb / (row["copy_qkv"] / 1e3)
        results.append(row)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()
                          if k != "kernels_us"}), flush=True)
        for key, kernels in row["kernels_us"].items():
            print(f"  {key}: " + ", ".join(f"{k} {v} us" for k, v in kernels.items()), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "attention-parts.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(),
                                                          "rows": results}, indent=1))
    keys = ["cudnn", "fa3", "fa3_fp8_kernel", "heads_8192w2", "heads_carried", "heads_carried_repairing",
            "form_fa3_fp8", "form_fa3_fp8_at_site", "fp8_quant", "fp8_quant_carried", "form_fp8", "form_fp8_at_site",
            "form_int8", "form_int8_at_site"]
    print("shape".ljust(18) + "".join(k[:14].rjust(15) for k in keys))
    for row in results:
        print(row["shape"].ljust(18) + "".join(f"{row.get(k, float('nan')):15.4f}" for k in keys))


if __name__ == "__main__":
    main()
