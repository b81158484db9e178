"""torch's compiled flex_attention on a CPU against SDPA, per head dim and key length: the largest error over a few
fresh inputs (NaN where one came out NaN). What ``forms.flex`` refuses on a CPU rests on this.

    .venv/bin/python benchmarks/experiments/flex_cpu_keys.py --head-dims 16 32 64 128 --keys 8 16 20 24 40 56 72 120 200
"""

import argparse

import torch
from torch.nn.attention.flex_attention import flex_attention


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--head-dims", type=int, nargs="+", default=[16, 64])
    p.add_argument("--keys", type=int, nargs="+", default=[8, 16, 20, 24, 40, 56, 72, 120, 200])
    p.add_argument("--queries", type=int, default=32)
    p.add_argument("--inputs", type=int, default=6)
    args = p.parse_args()
    torch._dynamo.config.recompile_limit = 1000
    compiled = torch.compile(flex_attention, fullgraph=True, dynamic=False)
    for d in args.head_dims:
        row = []
        for sk in args.keys:
            worst = 0.0
            for _ in range(args.inputs):
                q, k, v = torch.randn(1, 2, args.queries, d), torch.randn(1, 2, sk, d), torch.randn(1, 2, sk, d)
                err = (compiled(q, k, v) - torch.nn.functional.scaled_dot_product_attention(q, k, v)).abs().max()
                worst = float("nan") if err.isnan() else max(worst, err.item())
                if worst != worst:
                    break
            row.append(f"{sk}: {worst:.2g}")
        print(f"head dim {d}: " + ", ".join(row))


if __name__ == "__main__":
    main()
