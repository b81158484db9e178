"""Three consumer warpgroups forced at Wan-14B's head dim 128 (which hopper_attention refuses): plan_launch
called directly, FP8 / INT8 / plain at two and three warpgroups, times and cosines (results s6, h)."""
import torch, triton.testing
from ditgate.kernels import hopper_attention as ha
from ditgate.kernels.quant_attention import KernelConfig, quantize
def call(q, k, v, qk, groups, schedule=3):
    out = torch.empty((q.shape[0], q.shape[2], q.shape[1], q.shape[3]), dtype=q.dtype, device=q.device).transpose(1, 2)
    sc = q.shape[3] ** -0.5
    qz = None if qk == "plain" else quantize(q, k, v, qk, sc, KernelConfig(64, 128), None, permute_v=True)
    launch = ha.plan_launch(q, k, v, qk, sc, out, qz, None, None, None, schedule, groups)
    launch.run()
    return out
S, H, D = 32760, 40, 128
q, k, v = [torch.randn(1, S, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3)]
ref = torch.nn.functional.scaled_dot_product_attention(q[:, :2], k[:, :2], v[:, :2]).float()
for qk in ("fp8", "int8", "plain"):
    for g in (2, 3):
        o = call(q, k, v, qk, g)[:, :2].float()
        cos = torch.nn.functional.cosine_similarity(o.flatten(), ref.flatten(), dim=0).item()
        ms = triton.testing.do_bench(lambda: call(q, k, v, qk, g), warmup=50, rep=300)
        print(f"wan {qk:6} groups {g}  {ms:.3f} ms  cos {cos:.6f}", flush=True)
