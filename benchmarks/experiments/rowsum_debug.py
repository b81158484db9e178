"""Temporary: why the row sum on the tensor cores is wrong in FP8 (and what it saves)."""
import torch
import triton.testing
from ditgate.kernels import hopper_attention as ha
from ditgate.kernels.quant_attention import KernelConfig, quantize


def call(q, k, v, qk, schedule, ones_n):
    out = torch.empty((q.shape[0], q.shape[2], q.shape[1], q.shape[3]), dtype=q.dtype, device=q.device).transpose(1, 2)
    sc = q.shape[3] ** -0.5
    qz = None if qk == "plain" else quantize(q, k, v, qk, sc, KernelConfig(128, 128), None, permute_v=True)
    launch = ha.plan_launch(q, k, v, qk, sc, out, qz, None, None, None, schedule)
    flags = dict(launch.flags, ONES_N=ones_n)
    ha._hopper_attn_kernel[launch.grid](*launch.args, **flags, num_warps=4)
    return out


def inputs(S, H, D):
    return [torch.randn(1, S, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3)]


for qk, schedule, ones_n in [("plain", 9, 8), ("fp8", 3, 8), ("fp8", 9, 8), ("fp8", 9, 16), ("fp8", 9, 32),
                             ("fp8", 7, 16), ("int8", 9, 16)]:
    for S in (128, 256, 1000):
        q, k, v = inputs(S, 2, 128)
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
        try:
            o = call(q, k, v, qk, schedule, ones_n).float()
        except Exception as exc:
            print(qk, schedule, ones_n, S, "ERROR", str(exc)[:200], flush=True)
            continue
        rel = ((o - ref).norm() / ref.norm()).item()
        s = (o * ref).sum(-1) / (ref * ref).sum(-1)
        resid = ((o - s[..., None] * ref).norm() / ref.norm()).item()
        print(f"{qk:6}{schedule:3}{ones_n:4}{S:6}  rel {rel:.4g}  row scale mean {s.mean().item():.4g} "
              f"std {s.std().item():.3g} min {s.min().item():.3g}  residual {resid:.3g}", flush=True)
torch.cuda.synchronize()
rows = []
for name, (S, H, D) in {"wan": (32760, 40, 128), "ltx": (27588, 32, 64)}.items():
    q, k, v = inputs(S, H, D)
    for qk, schedule, ones_n in [("plain", 3, 8), ("plain", 9, 8), ("plain", 10, 8), ("fp8", 3, 8), ("fp8", 9, 8),
                                 ("fp8", 9, 16), ("fp8", 10, 16), ("int8", 3, 8), ("int8", 9, 16)]:
        if qk == "plain" and ones_n > 8:
            continue
        ms = triton.testing.do_bench(lambda: call(q, k, v, qk, schedule, ones_n), warmup=100, rep=400)
        rows.append((name, qk, schedule, ones_n, ms))
        print(f"{name} {qk:6} schedule {schedule:3} ones {ones_n:3}  {ms:.3f} ms", flush=True)
