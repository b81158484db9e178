"""One launch of the Hopper schedule for Nsight Compute (``ncu -k regex:_hopper_attn_kernel -c 1``):
bf16 random inputs at a fifth of the work of a benchmark shape (8 heads instead of 40 at Wan-14B, 6
instead of 32 at LTX; the same sequence length and per-tile loop).

    python benchmarks/ncu_target.py fp8|plain|int8 [wan|ltx] [--schedule N] [--lists L] [--tc-sum 0|1]
        [--narrow 0|1|2] [--lazy 0|1] [--heads H]

``--lists L``: random ascending block lists of L key blocks per query block (the program's rows: 192 at
LTX, 128 at Wan), as ``pin_ab.py`` makes them; the other flags are ``hopper_attention``'s, default as
ditgate's forms launch it.
"""

import argparse

import torch

from ditgate.kernels.hopper_attention import DEFAULT_GROUPS, ROWS_HALF, ROWS_K, hopper_attention

ap = argparse.ArgumentParser()
ap.add_argument("qk", nargs="?", default="fp8", choices=["fp8", "plain", "int8"])
ap.add_argument("shape", nargs="?", default="wan", choices=["wan", "ltx"])
ap.add_argument("--schedule", type=int)
ap.add_argument("--lists", type=int)
ap.add_argument("--tc-sum", type=int, choices=[0, 1])
ap.add_argument("--narrow", type=int, choices=[0, 1, 2])
ap.add_argument("--lazy", type=int, choices=[0, 1])
ap.add_argument("--heads", type=int, help="instead of a fifth of the shape's")
args = ap.parse_args()
heads, seq, dim = {"wan": (8, 32760, 128), "ltx": (6, 27588, 64)}[args.shape]
heads = args.heads or heads
groups = DEFAULT_GROUPS[dim]
q, k, v = (torch.randn(1, seq, heads, dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
call = dict(qk=args.qk, schedule=args.schedule, groups=groups, narrow=args.narrow,
            tc_sum=None if args.tc_sum is None else bool(args.tc_sum),
            lazy=None if args.lazy is None else bool(args.lazy))
if args.lists is not None:
    n_m, n_n = -(-seq // (ROWS_HALF * groups)), -(-seq // ROWS_K)
    order = torch.argsort(torch.rand(1, heads, n_m, n_n, device="cuda"), dim=-1)[..., :max(1, min(args.lists, n_n))]
    call.update(kv_index=order.sort(dim=-1).values.to(torch.int32).contiguous(),
                kv_count=torch.full((1, heads, n_m), min(args.lists, n_n), dtype=torch.int32, device="cuda"))
hopper_attention(q, k, v, **call)
torch.cuda.synchronize()
