"""Where the quantized modes' fixed cost goes: ``quantize`` (as the Hopper schedule calls it) and its
parts, against the whole FP8 call, at the Wan-14B and LTX long shapes (bf16 [B, S, H, D] storage, as
diffusers hands it over). Why: the quantization passes run at every density, so they are what keeps the
FP8 block-sparse time above its share of the dense time (results s7)."""
import torch
import triton.testing

from ditgate.kernels import hopper_attention as ha
from ditgate.kernels import quant_attention as qa

SHAPES = {"wan-14b": (40, 32760, 128), "ltx": (32, 27588, 64)}


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200)


for name, (H, S, D) in SHAPES.items():
    q, k, v = (torch.randn(1, S, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    cfg = qa.KernelConfig(ha.ROWS_HALF, ha.ROWS_K)
    sc = D ** -0.5
    parts = {
        "fp8 call (hopper_attention)": lambda: ha.hopper_attention(q, k, v, qk="fp8"),
        "quantize (fp8, whole)": lambda: qa.quantize(q, k, v, "fp8", sc, cfg, None, permute_v=True),
        "k.mean over S (torch)": lambda: k.mean(dim=2, dtype=torch.float32),
        "aminmax of V over S (torch)": lambda: torch.aminmax(v, dim=2),
        "read Q once (q.sum, torch)": lambda: q.sum(dim=2, dtype=torch.float32),
    }
    for part, fn in parts.items():
        print(f"{name:8} {part:32} {bench(fn):8.3f} ms", flush=True)
    gb = 3 * q.numel() * 2 / 1e9
    print(f"{name:8} (Q, K, V are {gb:.2f} GB together in bf16)", flush=True)
    del q, k, v
    torch.cuda.empty_cache()
