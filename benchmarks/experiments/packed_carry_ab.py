"""A/B in one run: FP8 P carried across the loop as packed FP8 bytes (the working tree's
hopper_attention) against P carried as float16 and converted at the next step (the schedule as commit
6b3f915 left it, copied beside this file), three warpgroups at LTX's 32 x 27588 x 64, FP8 and INT8.
Interleaved do_bench medians, fresh random inputs per mode, cosine to cuDNN in float32. The "before"
module is not kept in the tree (it would be a second copy of the kernel); write it first:

    git show 6b3f915:ditgate/kernels/hopper_attention.py \
        | sed 's/^from .quant_attention import/from ditgate.kernels.quant_attention import/' \
        > benchmarks/experiments/hopper_attention_s7_before.py
"""
import sys

import torch
import triton.testing

sys.path.insert(0, "benchmarks/experiments")
import hopper_attention_s7_before as before  # noqa: E402

from ditgate.kernels import hopper_attention as after  # noqa: E402

H, S, D = 32, 27588, 64
for qk in ("fp8", "int8"):
    q, k, v = (torch.randn(1, S, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q[:, :4].float(), k[:, :4].float(), v[:, :4].float())
    for rnd in range(2):
        for name, mod in (("before", before), ("after", after)):
            out = mod.hopper_attention(q, k, v, qk=qk)
            cos = torch.nn.functional.cosine_similarity(out[:, :4].float().flatten(), ref.flatten(), dim=0).item()
            ms = triton.testing.do_bench(lambda: mod.hopper_attention(q, k, v, qk=qk), warmup=25, rep=200)
            print(f"ltx {qk:5} round {rnd} {name:7} {ms:8.3f} ms  cos {cos:.6f}", flush=True)
