"""Where the tile selector's time goes, on the GPU, at the Wan-14B and LTX long self-attention shapes.

Per shape (bf16 random Q, K as B, S, H, D storage seen as B, H, S, D; one video layout, block 128):
the whole ``TileSelector.select`` at budget 0.3 through the torch path and through the two Triton
kernels (also with 192-row query tiles) (the default on CUDA; whether both give the same lists is printed and recorded), then parts
timed alone (pooling Q, pooling K, tile scores, top-k, each kernel), and one alternative pooling (a bf16 matrix product with a fixed
[tiles, S] averaging matrix, fp32 accumulation), with its largest difference to the float32 pooled
means. Medians of CUDA-event samples after warm-up; the fa4 dense time of each shape is in
``benchmarks/results``.

    python benchmarks/selector_breakdown.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from ditgate.gate import environment
from ditgate.gate.timing import warm_samples
from ditgate.sparse.layout import TokenLayout
from ditgate.sparse.selector import TileSelector, _pool

class SortSelector(TileSelector):
    """The same selector with the best tiles taken from a full row sort instead of ``topk``."""

    @staticmethod
    def _best(scores, keep):
        return scores.sort(dim=-1, descending=True).indices[..., :keep]


SHAPES = {"wan-14b-480p": (40, 32760, 128), "ltx-1216x704x257": (32, 27588, 64)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="ditgate-out")
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--budget", type=float, default=0.3)
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows = []

    def t(fn):
        return statistics.median(warm_samples(fn, dev, 30))

    for name, (h, s, d) in SHAPES.items():
        g = torch.Generator(device="cuda").manual_seed(3)
        q, k = (torch.randn(1, s, h, d, device=dev, dtype=torch.bfloat16, generator=g).transpose(1, 2) for _ in range(2))
        layout = TokenLayout.video_then(s)
        sel, sort_sel = TileSelector(args.block, kernels=False), SortSelector(args.block, kernels=False)
        fused = TileSelector(args.block)  # the default on CUDA: the two Triton kernels (kernels.tile_select)
        geo = sel.geometry(layout, dev)
        n, keep = geo.n_cols, sel.keep_count(layout, args.budget)
        qp, kp = _pool(q, args.block, n), _pool(k, args.block, n)
        scores = torch.einsum("bhmd,bhnd->bhmn", qp, kp)
        # the alternative: pooled = A @ x over the sequence, A [n, S] holding 1 / (tile length)
        starts = torch.arange(n, device=dev) * args.block
        lengths = (torch.clamp(starts + args.block, max=s) - starts).float()
        pos = torch.arange(s, device=dev)
        avg = ((pos[None, :] // args.block) == torch.arange(n, device=dev)[:, None]).float() / lengths[:, None]
        avg = avg.to(torch.bfloat16)
        flat = q.transpose(1, 2).reshape(1, s, h * d)  # a view of the B, S, H, D storage

        def gemm_pool():
            return torch.matmul(avg, flat[0]).view(n, h, d).permute(1, 0, 2)

        err = (gemm_pool().float() - qp[0]).abs().max().item()
        same = torch.equal(sel.select(q, k, layout, args.budget).kv_index, sort_sel.select(q, k, layout, args.budget).kv_index)
        print(f"{name}: row-sort selection identical to topk's: {same}", flush=True)
        a, b = sel.select(q, k, layout, args.budget), fused.select(q, k, layout, args.budget)
        used = torch.arange(a.kv_index.shape[-1], device=dev) < a.kv_count[..., None]
        same_fused = torch.equal(a.kv_count, b.kv_count) and torch.equal(a.kv_index[used], b.kv_index[used])
        print(f"{name}: Triton kernels' lists identical to the torch path's: {same_fused}", flush=True)
        from ditgate.kernels.tile_select import choose_and_list, pool_tiles
        parts = {
            "select (whole)": lambda: sel.select(q, k, layout, args.budget),
            "select (Triton kernels)": lambda: fused.select(q, k, layout, args.budget),
            "select 192-row (Triton)": lambda: fused.select(q, k, layout, args.budget, 192),
            "pool q (kernel)": lambda: pool_tiles(q, args.block),
            "pool q 192 (kernel)": lambda: pool_tiles(q, 192),
            "pool k (kernel)": lambda: pool_tiles(k, args.block),
            "scores (matmul)": lambda: torch.matmul(qp, kp.transpose(-1, -2)),
            "choose and list (kernel)": lambda: choose_and_list(scores, geo.fixed_i8, geo.fixed_score, geo.always_i8,
                                                                keep, geo.width),
            "pool q": lambda: _pool(q, args.block, n),
            "pool k": lambda: _pool(k, args.block, n),
            "scores (einsum + fixed)": lambda: torch.where(geo.fixed, geo.fixed_score,
                                                           torch.einsum("bhmd,bhnd->bhmn", qp, kp)),
            "topk": lambda: scores.topk(keep, dim=-1, sorted=False),
            "row sort, first keep": lambda: scores.sort(dim=-1, descending=True).indices[..., :keep],
            "select with row sort": lambda: sort_sel.select(q, k, layout, args.budget),
            "pool q by bf16 GEMM": gemm_pool,
        }
        for part, fn in parts.items():
            ms = t(fn)
            rows.append({"shape": name, "part": part, "ms": ms, "tiles": n, "keep": keep, "fused_lists_identical": same_fused,
                         **({"max_abs_diff_to_fp32_mean": err} if "GEMM" in part else {})})
            print(rows[-1], flush=True)
        del q, k, flat, avg
        torch.cuda.empty_cache()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "selector-breakdown.json").write_text(json.dumps(
        {"environment": environment(dev), "date": time.strftime("%Y-%m-%d"),
         "command": "python benchmarks/selector_breakdown.py " + " ".join(sys.argv[1:]), "rows": rows}, indent=2))
    print(f"{'shape':<18}{'part':<26}{'ms':>8}")
    for r in rows:
        print(f"{r['shape']:<18}{r['part']:<26}{r['ms']:>8.3f}")


if __name__ == "__main__":
    main()
