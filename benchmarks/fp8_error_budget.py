"""Where the quantized kernels' error comes from: the kernels' numerics emulated in float64 on the CPU, one
rounding at a time, on the issue's bf16 random inputs (the shapes' key counts and head dims, a few query
rows). What it answers: whether a cosine of 0.999 to exact attention is in reach of FP8 Q·Kᵀ with FP8 P·V
at all, or which product has to change.

The roundings, as ``quant_attention.quantize`` and the kernels make them: Q in blocks of 64 rows and K
(minus its mean over the sequence) in blocks of 128 rows, each scaled by its absolute maximum to e4m3
(448) or int8 (127, round to nearest); P scaled so that its row maximum is 448 and cast to e4m3; V per
channel by its absolute maximum to e4m3. P's byte from FMAs (the Hopper schedule's ``byte_p``):
X = round(8 (x + 15)) for x the score minus the row max in log2 units, clamped to [0, 127], read as an e4m3
byte (the mantissa linear between powers of two), and summed as those values. One minus the cosine to exact
float64 attention, per source alone and all together, for the FP8 and INT8 modes ("Q and K in e4m3 only" is
also what FP8 Q·Kᵀ with an unrounded P·V would give, a mode the kernels do not have). CPU only; under a
minute.

    python benchmarks/fp8_error_budget.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

E4M3 = torch.float8_e4m3fn
SHAPES = {"ltx-1216x704x257": (27588, 64), "wan-14b-480p": (32760, 128)}  # keys, head dim


def _blocks(x: torch.Tensor, rows: int, fmt: str) -> torch.Tensor:
    """x rounded as the kernels store it: per block of ``rows`` rows, scaled by the block's absolute max."""
    n, d = x.shape
    pad = (-n) % rows
    xb = torch.nn.functional.pad(x, (0, 0, 0, pad)).reshape(-1, rows, d)
    top = 448.0 if fmt == "fp8" else 127.0
    scale = (xb.abs().amax(dim=(1, 2), keepdim=True) / top).clamp_min(1e-30)
    y = xb / scale
    y = y.to(E4M3).double() if fmt == "fp8" else y.round().clamp(-127, 127)
    return (y * scale).reshape(-1, d)[:n]


def _byte_values(x: torch.Tensor) -> torch.Tensor:
    """The e4m3 values of the bytes X = round(8 (x + 15)), x <= 0 in log2 units (``hopper_attention._byte_p``)."""
    byte = torch.round(8 * (x + 15)).clamp(0, 127).long()
    exponent, mantissa = byte >> 3, (byte & 7).double()
    return torch.where(exponent > 0, 2.0 ** (exponent.double() - 7) * (1 + mantissa / 8), mantissa / 8 * 2.0 ** -6)


def one_minus_cosine(q, k, v, qk: str | None, p8: bool | str, v8: bool) -> float:
    """1 - cosine of the emulated output to exact attention; ``qk`` None keeps Q and K exact; ``p8`` "bytes": P's
    byte from FMAs, summed as the tensor cores sum it."""
    d = q.shape[1]
    exact = torch.softmax(q @ k.T / d ** 0.5, dim=-1) @ v
    ks = k - k.mean(0, keepdim=True)  # smoothing: exact for softmax
    qq, kk = (q, ks) if qk is None else (_blocks(q, 64, qk), _blocks(ks, 128, qk))
    s = qq @ kk.T / d ** 0.5
    p = torch.exp(s - s.amax(-1, keepdim=True)) * 448.0
    total = p.sum(-1, keepdim=True)
    if p8 == "bytes":
        p = _byte_values((s - s.amax(-1, keepdim=True)) / torch.log(torch.tensor(2.0, dtype=s.dtype)))
        total = p.sum(-1, keepdim=True)
    elif p8:
        p = p.to(E4M3).double()
    vv = v
    if v8:
        vs = (v.abs().amax(0, keepdim=True) / 448.0).clamp_min(1e-30)
        vv = (v / vs).to(E4M3).double() * vs
    out = (p @ vv) / total
    return 1.0 - torch.nn.functional.cosine_similarity(out.flatten(), exact.flatten(), dim=0).item()


VARIANTS = {  # name: (Q·Kᵀ format or None, P in e4m3 (or "bytes": from FMAs), V in e4m3)
    "Q and K in e4m3 only": ("fp8", False, False),
    "Q and K in int8 only": ("int8", False, False),
    "P in e4m3 only": (None, True, False),
    "V in e4m3 only": (None, False, True),
    "fp8 mode (all)": ("fp8", True, True),
    "int8 mode (all)": ("int8", True, True),
    "int8 Q·Kᵀ, e4m3 P only": ("int8", True, False),
    "P's byte from FMAs only": (None, "bytes", False),
    "fp8 mode, P's bytes": ("fp8", "bytes", True),
    "int8 mode, P's bytes": ("int8", "bytes", True),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="ditgate-out")
    ap.add_argument("--rows", type=int, default=256, help="query rows per head (blocks of 64)")
    ap.add_argument("--seeds", type=int, default=2, help="independent input sets per shape")
    args = ap.parse_args()
    rows = []
    for shape, (keys, d) in SHAPES.items():
        for seed in range(args.seeds):
            g = torch.Generator().manual_seed(seed)
            q = torch.randn(args.rows, d, generator=g).bfloat16().double()
            k, v = (torch.randn(keys, d, generator=g).bfloat16().double() for _ in range(2))
            for name, (qk, p8, v8) in VARIANTS.items():
                err = one_minus_cosine(q, k, v, qk, p8, v8)
                rows.append({"shape": shape, "seed": seed, "variant": name, "one_minus_cosine": err})
                print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fp8-error-budget.json").write_text(json.dumps(
        {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
         "command": "python benchmarks/fp8_error_budget.py " + " ".join(sys.argv[1:]), "rows": rows}, indent=1))
    print(f"\n{'variant':<26}" + "".join(f"{s[:14]:>16}" for s in SHAPES) + "   (1 - cosine, mean of seeds)")
    for name in VARIANTS:
        cells = []
        for shape in SHAPES:
            errs = [r["one_minus_cosine"] for r in rows if r["shape"] == shape and r["variant"] == name]
            cells.append(f"{sum(errs) / len(errs):>16.2e}")
        print(f"{name:<26}" + "".join(cells))


if __name__ == "__main__":
    main()
