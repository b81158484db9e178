"""The selector's choosing kernel (``tile_select.choose_and_list``) per warp count, at the LTX and Wan-14B long shapes'
tile grids (random scores, budget 0.3 over a video layout): ``do_bench`` medians in interleaved rounds, and whether
every warp count gives the lists of 4 warps.

    python benchmarks/experiments/choose_warps.py --out DIR [--warps 1 2 4 8] [--rounds 3]

Prints every row; writes choose-warps.json."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import triton.testing

from ditgate.kernels.tile_select import choose_and_list
from ditgate.sparse.layout import TokenLayout
from ditgate.sparse.selector import TileSelector
from json_rows import recorder  # beside this script (its directory is on the path)

SHAPES = {"ltx": (32, 27588, 192), "wan": (40, 32760, 128)}  # heads, sequence, query rows per tile


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="ditgate-out")
    ap.add_argument("--warps", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record, rows = recorder(out, "choose-warps.json", "benchmarks/experiments/choose_warps.py")
    for shape, (h, s, q_rows) in SHAPES.items():
        layout, selector = TokenLayout.video_then(s), TileSelector(128)
        geo, keep = selector.geometry(layout, torch.device("cuda"), q_rows), selector.keep_count(layout, 0.3, q_rows)
        scores = torch.randn(1, h, geo.n_rows, geo.n_cols, device="cuda")

        def run(w):
            return choose_and_list(scores, geo.fixed_i8, geo.fixed_score, geo.always_i8, keep, geo.width, num_warps=w)
        want = run(4)
        for w in args.warps:
            record(shape=shape, warps=w, same_lists=torch.equal(run(w), want))
        for r in range(args.rounds):
            for w in (args.warps if r % 2 == 0 else args.warps[::-1]):
                record(shape=shape, warps=w, round=r, us=1e3 * triton.testing.do_bench(lambda: run(w), warmup=25,
                                                                                        rep=100))
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
