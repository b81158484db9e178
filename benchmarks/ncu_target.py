"""One launch of the Hopper schedule for Nsight Compute (``ncu -k regex:_hopper_attn_kernel -c 1``):
bf16 random inputs at a fifth of the work of a benchmark shape (8 heads instead of 40 at Wan-14B, 6
instead of 32 at LTX; the same sequence length and per-tile loop).

    python benchmarks/ncu_target.py fp8|plain|int8 [wan|ltx] [schedule]
"""

import sys

import torch

from ditgate.kernels.hopper_attention import hopper_attention

qk = sys.argv[1] if len(sys.argv) > 1 else "fp8"
heads, seq, dim = {"wan": (8, 32760, 128), "ltx": (6, 27588, 64)}[sys.argv[2] if len(sys.argv) > 2 else "wan"]
schedule = int(sys.argv[3]) if len(sys.argv) > 3 else None
q, k, v = (torch.randn(1, seq, heads, dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
hopper_attention(q, k, v, qk=qk, schedule=schedule)
torch.cuda.synchronize()
