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

Two changes the kernels do not make, for the quantization in one pass: V scaled
per block of 128 keys (one scale for all channels, folded into P's exponent for that block: P' = P · s_j / S, S
the head's largest block scale, so P' stays within e4m3 and rounds after the shift; or s_j a power of two), which
needs no pass over all of V first; and K smoothed by the mean of its first 128 keys instead of all (any vector is
exact for softmax; only the rounding differs), which needs no pass over all of K first. ``--inputs structured``
adds what real keys and values have and random ones lack: channel offsets in K, channel scales spread over two
orders of magnitude in K and V, and a few tokens with V thirty times the rest.

    python benchmarks/fp8_error_budget.py --out DIR [--inputs random structured]
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


def _blocks(x: torch.Tensor, rows: int, fmt: str, pow2: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x rounded as the kernels store it: per block of ``rows`` rows, scaled by the block's absolute max (``pow2``:
    that scale rounded up to a power of two); and each row's scale."""
    n, d = x.shape
    pad = (-n) % rows
    xb = torch.nn.functional.pad(x, (0, 0, 0, pad)).reshape(-1, rows, d)
    top = 448.0 if fmt == "fp8" else 127.0
    scale = (xb.abs().amax(dim=(1, 2), keepdim=True) / top).clamp_min(1e-30)
    if pow2:
        scale = 2.0 ** torch.ceil(torch.log2(scale))
    y = xb / scale
    y = y.to(E4M3).double() if fmt == "fp8" else y.round().clamp(-127, 127)
    return (y * scale).reshape(-1, d)[:n], scale.reshape(-1, 1).expand(-1, rows).reshape(-1)[:n]


def _byte_values(x: torch.Tensor) -> torch.Tensor:
    """The e4m3 values of the bytes X = round(8 (x + 15)), x <= 0 in log2 units (``hopper_attention._byte_p``)."""
    byte = torch.round(8 * (x + 15)).clamp(0, 127).long()
    exponent, mantissa = byte >> 3, (byte & 7).double()
    return torch.where(exponent > 0, 2.0 ** (exponent.double() - 7) * (1 + mantissa / 8), mantissa / 8 * 2.0 ** -6)


def _v_rounded(v: torch.Tensor, v_scale: str) -> tuple[torch.Tensor, torch.Tensor]:
    """V as the kernels would store it, and each key's scale relative to the head's largest (1 per channel way):
    ``channel``: per channel over all keys (the kernels); ``block``: per 128 keys over all channels; ``block2``: that
    scale rounded up to a power of two."""
    if v_scale == "channel":
        vs = (v.abs().amax(0, keepdim=True) / 448.0).clamp_min(1e-30)
        return (v / vs).to(E4M3).double() * vs, torch.ones(v.shape[0], dtype=v.dtype)
    rounded, vs = _blocks(v, 128, "fp8", pow2=v_scale == "block2")
    return rounded, vs / vs.max()


def one_minus_cosine(q, k, v, qk: str | None, p8: bool | str, v8: bool, v_scale: str = "channel",
                     k_mean: str = "all") -> float:
    """1 - cosine of the emulated output to exact attention; ``qk`` None keeps Q and K exact; ``p8`` "bytes": P's
    byte from FMAs, summed as the tensor cores sum it. ``v_scale`` (``_v_rounded``): per block, each block's P is
    taken from its scores shifted by log2 of its scale over the head's largest, against the row's max of the shifted
    scores (what a kernel's running max would track), and rounded after the shift; its sum is scaled back.
    ``k_mean``: K smoothed by its mean over all keys or over its first 128."""
    d = q.shape[1]
    exact = torch.softmax(q @ k.T / d ** 0.5, dim=-1) @ v
    ks = k - (k if k_mean == "all" else k[:128]).mean(0, keepdim=True)  # smoothing: exact for softmax
    qq, kk = (q, ks) if qk is None else (_blocks(q, 64, qk)[0], _blocks(ks, 128, qk)[0])
    s = qq @ kk.T / d ** 0.5
    vv, relative = _v_rounded(v, v_scale) if v8 else (v, torch.ones(v.shape[0], dtype=v.dtype))
    shift = torch.log2(relative)[None, :]  # 0 with per-channel scales
    x = s / torch.log(torch.tensor(2.0, dtype=s.dtype)) + shift  # log2 units
    x = x - x.amax(-1, keepdim=True)  # the row's reference: its max over the shifted scores, as a kernel's running max
    if p8 == "bytes":
        p = _byte_values(x)
    elif p8:
        p = (2.0 ** x * 448.0).to(E4M3).double()
    else:
        p = 2.0 ** x * 448.0
    # each block's P carries its factor s_j / S: its sum is scaled back, and its product is with V / s_j (the stored
    # bytes) times S, which is vv / (s_j / S)
    total = (p / relative[None, :]).sum(-1, keepdim=True)
    out = (p @ (vv / relative[:, None])) / total
    return 1.0 - torch.nn.functional.cosine_similarity(out.flatten(), exact.flatten(), dim=0).item()


VARIANTS = {  # name: (Q·Kᵀ format or None, P in e4m3 (or "bytes": from FMAs), V in e4m3[, V's scales, K's mean])
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
    "V per 128 keys only": (None, False, True, "block"),
    "fp8, bytes, V per 128 keys": ("fp8", "bytes", True, "block"),
    "fp8, bytes, V per 128, pow2": ("fp8", "bytes", True, "block2"),
    "fp8, bytes, K mean of 128": ("fp8", "bytes", True, "channel", "first"),
    "fp8, bytes, both": ("fp8", "bytes", True, "block", "first"),
    "int8, bytes, both": ("int8", "bytes", True, "block", "first"),
}


def structured(keys: int, d: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V with what real ones have: K with channel offsets (N(0, 2)) and channel scales (log-normal, sigma 1),
    V with channel scales (log-normal, sigma 1.2) and one key in 1000 thirty times the rest."""
    k = torch.randn(keys, d, generator=g) * torch.exp(torch.randn(d, generator=g)) + 2 * torch.randn(d, generator=g)
    v = torch.randn(keys, d, generator=g) * torch.exp(1.2 * torch.randn(d, generator=g))
    outliers = torch.rand(keys, generator=g) < 1e-3
    v[outliers] *= 30
    return k.bfloat16().double(), v.bfloat16().double()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="ditgate-out")
    ap.add_argument("--rows", type=int, default=256, help="query rows per head (blocks of 64)")
    ap.add_argument("--seeds", type=int, default=2, help="independent input sets per shape")
    ap.add_argument("--inputs", nargs="+", default=["random"], choices=["random", "structured"])
    args = ap.parse_args()
    rows = []
    for inputs in args.inputs:
        for shape, (keys, d) in SHAPES.items():
            for seed in range(args.seeds):
                g = torch.Generator().manual_seed(seed)
                q = torch.randn(args.rows, d, generator=g).bfloat16().double()
                if inputs == "random":
                    k, v = (torch.randn(keys, d, generator=g).bfloat16().double() for _ in range(2))
                else:
                    k, v = structured(keys, d, g)
                for name, variant in VARIANTS.items():
                    err = one_minus_cosine(q, k, v, *variant)
                    rows.append({"inputs": inputs, "shape": shape, "seed": seed, "variant": name,
                                 "one_minus_cosine": err})
                    print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fp8-error-budget.json").write_text(json.dumps(
        {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
         "command": "python benchmarks/fp8_error_budget.py " + " ".join(sys.argv[1:]), "rows": rows}, indent=1))
    columns = [(inputs, shape) for inputs in args.inputs for shape in SHAPES]
    print(f"\n{'variant':<30}" + "".join(f"{(i[:6] + ' ' + s[:8]):>17}" for i, s in columns)
          + "   (1 - cosine, mean of seeds)")
    for name in VARIANTS:
        cells = []
        for inputs, shape in columns:
            errs = [r["one_minus_cosine"] for r in rows
                    if r["inputs"] == inputs and r["shape"] == shape and r["variant"] == name]
            cells.append(f"{sum(errs) / len(errs):>17.2e}")
        print(f"{name:<30}" + "".join(cells))


if __name__ == "__main__":
    main()
