"""The order of the programs of the passes that read the host's Q, K and V (the quantization's two passes, the
selector's pooling): one head's blocks in turn (heads outer, as before) against one block of every head in turn
(heads inner, ``quant_attention._block_and_head``), at the Wan-14B and LTX long shapes (random bf16 in diffusers'
[B, S, H, D] storage). Why: in that storage a token's row holds every head (4 KB at LTX, 10 KB at Wan-14B); with
heads outer, the programs running at once read one head's 128- or 256-byte slice of many tokens' rows, and the
passes moved their bytes at 2.8-3.6 TB/s of the H200's 4.8 (results 2026-12-04-h200-s17).

    python benchmarks/experiments/program_order.py --out DIR [--shapes ltx wan] [--rounds 3]

Parts: ``quantize`` as the Hopper schedule's sparse forms call it (with the selector's sums), its first pass and
its K and V pass alone, ``pool_tiles`` of Q and of K; then the whole sparse calls at budget 0.3 (FP8 with the
quantization pooling, bf16 with the selector pooling; ``fixed_costs.py``), each order in turn. Heads outer is set
for the whole calls by swapping the two functions' defaults for the call. Outputs are compared bit for bit
(the order changes no arithmetic). ``do_bench`` medians per round; a table last, program-order.json."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import torch
import triton
import triton.testing

from ditgate.kernels import hopper_attention as ha
from ditgate.kernels import quant_attention as qa
from ditgate.kernels import tile_select
from fixed_costs import SHAPES, plain_whole_call, random_inputs, whole_call_variants  # beside this script
from json_rows import recorder
from quantize_kernels import pass_launches


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200)


@contextlib.contextmanager
def heads_outer():
    """``quantize`` and ``pool_tiles`` with ``heads_inner=False`` by default, for calls that do not pass it."""
    saved = qa.quantize.__defaults__, tile_select.pool_tiles.__defaults__
    qa.quantize.__defaults__ = saved[0][:-1] + (False,)
    tile_select.pool_tiles.__defaults__ = (False,)
    try:
        yield
    finally:
        qa.quantize.__defaults__, tile_select.pool_tiles.__defaults__ = saved


def outer(fn):
    def call():
        with heads_outer():
            return fn()
    return call


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``, FP8 seen as its bytes (for ``torch.equal``)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="ditgate-out")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parts-only", action="store_true", help="no whole calls")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record, rows = recorder(out, "program-order.json", "benchmarks/experiments/program_order.py")
    for shape in args.shapes:
        q, k, v, scale, rows_q = random_inputs(shape)
        config = qa.KernelConfig(ha.ROWS_HALF, ha.ROWS_K)
        parts = {}
        for inner in (True, False):
            name = "heads inner" if inner else "heads outer"
            passes = pass_launches(q, k, v, inner)  # at quantize's warps: the first pass at its own, K and V at 4
            first = passes.first_pass(passes.q_programs + passes.kv_programs, passes.q_programs, qa.FIRST_PASS_WARPS)
            kv = passes.kv(0, 4)
            parts.update({
                ("quantize (sums)", name): lambda inner=inner: qa.quantize(q, k, v, "fp8", scale, config,
                                                                           permute_v=True, sums=True,
                                                                           heads_inner=inner),
                ("first pass", name): first, ("K and V pass", name): kv,
                ("pool_tiles Q", name): lambda inner=inner: tile_select.pool_tiles(q, rows_q, inner),
                ("pool_tiles K", name): lambda inner=inner: tile_select.pool_tiles(k, ha.ROWS_K, inner),
            })
        if not args.parts_only:
            fp8 = whole_call_variants(q, k, v, scale, rows_q)["whole call, quantization pools"]
            bf16 = plain_whole_call(q, k, v, scale, rows_q)
            parts.update({("FP8 sparse whole call", "heads inner"): fp8,
                          ("FP8 sparse whole call", "heads outer"): outer(fp8),
                          ("bf16 sparse whole call", "heads inner"): bf16,
                          ("bf16 sparse whole call", "heads outer"): outer(bf16)})
        for what in dict.fromkeys(what for what, _ in parts):
            if what in ("first pass", "K and V pass"):
                continue  # launches into buffers of their own, checked through quantize
            a, b = parts[(what, "heads inner")](), parts[(what, "heads outer")]()
            if isinstance(a, qa.Quantized):
                same = all(torch.equal(_bits(getattr(a, f)), _bits(getattr(b, f)))
                           for f in ("q", "q_scale", "k", "k_scale", "vt", "v_scale", "k_sums", "q_sums"))
            else:
                same = torch.equal(a, b)
            record(shape=shape, part=what, same_bits=same)
        for r in range(args.rounds):
            order = list(parts) if r % 2 == 0 else list(parts)[::-1]
            for what, name in order:
                record(shape=shape, part=what, order=name, round=r, ms=bench(parts[(what, name)]))
        del q, k, v, parts
        torch.cuda.empty_cache()
    print(f"{'shape':<6}{'part':<24}{'heads inner, ms':>28}{'heads outer, ms':>28}{'same bits':>10}")
    for shape in args.shapes:
        for what in dict.fromkeys(r["part"] for r in rows if r["shape"] == shape and "order" in r):
            ms = {name: " ".join(f"{r['ms']:.4f}" for r in rows if r["shape"] == shape and r["part"] == what
                                 and r.get("order") == name) for name in ("heads inner", "heads outer")}
            same = next((r["same_bits"] for r in rows if r["shape"] == shape and r["part"] == what
                         and "same_bits" in r), "")
            print(f"{shape:<6}{what:<24}{ms['heads inner']:>28}{ms['heads outer']:>28}{str(same):>10}")


if __name__ == "__main__":
    main()
