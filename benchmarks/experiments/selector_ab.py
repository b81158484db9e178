"""A/B in one run: the tile selector's Triton kernels (``ditgate.kernels.tile_select``: pooling one head per
program; scores by a torch matmul, then a choose-and-list kernel) against an alternative
(``tile_select_grouped`` beside this file: pooling by groups of heads, then scoring, choosing and listing in
one kernel), at budget 0.3 on the LTX and Wan-14B long shapes. Each part and the sum of parts, medians of
CUDA-event samples; the lists of both are compared. Call b of results 2026-12-03-h200-s8 ran it with the
alternative in ``ditgate/kernels`` and the tree's kernels as a "before" copy; the labels are the same.

    python benchmarks/experiments/selector_ab.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import tile_select_grouped as after  # noqa: E402

from ditgate.gate.timing import warm_samples  # noqa: E402
from ditgate.kernels import tile_select as before  # noqa: E402
from ditgate.sparse.layout import TokenLayout  # noqa: E402
from ditgate.sparse.selector import TileSelector  # noqa: E402

SHAPES = {"ltx": (32, 27588, 64, 192), "wan": (40, 32760, 128, 128)}  # heads, tokens, head dim, query rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="ditgate-out")
    ap.add_argument("--budget", type=float, default=0.3)
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows = []

    def t(fn):
        return statistics.median(warm_samples(fn, dev, 40))

    for name, (h, s, d, q_rows) in SHAPES.items():
        g = torch.Generator(device="cuda").manual_seed(3)
        q, k = (torch.randn(1, s, h, d, device=dev, dtype=torch.bfloat16, generator=g).transpose(1, 2) for _ in range(2))
        layout = TokenLayout.video_then(s)
        sel = TileSelector(128, kernels=True)  # the tree's kernels
        geo = sel.geometry(layout, dev, q_rows)
        keep = sel.keep_count(layout, args.budget, q_rows)
        n_m, n = geo.n_rows, geo.n_cols
        qp_b, kp_b = before.pool_tiles(q, q_rows), before.pool_tiles(k, 128)
        qp_a, kp_a = after.pool_tiles(q, q_rows), after.pool_tiles(k, 128)
        pool_diff = max((qp_a - qp_b).abs().max().item(), (kp_a - kp_b).abs().max().item())

        def old_choose():
            scores = torch.matmul(qp_b, kp_b.transpose(-1, -2))
            return before.choose_and_list(scores, geo.fixed_i8, geo.fixed_score, geo.always_i8, keep, geo.width)

        def new_choose():
            return after.score_choose_and_list(qp_a, kp_a, geo.fixed_i8, geo.fixed_score, geo.always_i8, keep,
                                               geo.width)

        counts = sel.select(q, k, layout, args.budget, q_rows).kv_count
        used = torch.arange(geo.width, device=dev) < counts[..., None]
        a, b = new_choose(), old_choose()
        same = torch.equal(torch.where(used, a, -1), torch.where(used, b, -1))
        differing_rows = int((torch.where(used, a, -1) != torch.where(used, b, -1)).any(-1).sum())
        parts = {
            "before: pool q": lambda: before.pool_tiles(q, q_rows),
            "before: pool k": lambda: before.pool_tiles(k, 128),
            "before: scores (matmul)": lambda: torch.matmul(qp_b, kp_b.transpose(-1, -2)),
            "before: choose and list": lambda: before.choose_and_list(
                torch.matmul(qp_b, kp_b.transpose(-1, -2)), geo.fixed_i8, geo.fixed_score, geo.always_i8, keep,
                geo.width),
            "after: pool q": lambda: after.pool_tiles(q, q_rows),
            "after: pool k": lambda: after.pool_tiles(k, 128),
            "after: score, choose and list": new_choose,
            "before: select (whole)": lambda: sel.select(q, k, layout, args.budget, q_rows),
        }
        times = {part: t(fn) for part, fn in parts.items()}
        times["before: choose and list"] -= times["before: scores (matmul)"]  # timed with its matmul
        times["before: sum of parts"] = sum(v for p, v in times.items() if p.startswith("before") and "whole" not in p)
        times["after: sum of parts"] = sum(times[p] for p in ("after: pool q", "after: pool k",
                                                              "after: score, choose and list"))
        q_bytes = q.numel() * q.element_size()
        for part, ms in times.items():
            row = {"shape": name, "part": part, "ms": ms, "query_rows": q_rows, "tiles": [n_m, n], "keep": keep,
                   "lists_identical": same, "rows_differing": differing_rows, "pool_max_abs_diff": pool_diff}
            if "pool" in part:
                row["TB_per_s"] = q_bytes / ms * 1e-9
            rows.append(row)
            print(json.dumps(row), flush=True)
        del q, k
        torch.cuda.empty_cache()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "selector-ab.json").write_text(json.dumps(
        {"date": time.strftime("%Y-%m-%d %H:%M"), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
         "command": "python benchmarks/experiments/selector_ab.py " + " ".join(sys.argv[1:]), "rows": rows}, indent=1))
    print(f"\n{'shape':<6}{'part':<34}{'ms':>8}{'TB/s':>7}  lists identical")
    for r in rows:
        print(f"{r['shape']:<6}{r['part']:<34}{r['ms']:>8.4f}{r.get('TB_per_s', 0):>7.2f}  {r['lists_identical']} "
              f"({r['rows_differing']} rows differ)")


if __name__ == "__main__":
    main()
