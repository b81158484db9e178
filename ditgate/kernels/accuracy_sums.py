"""The sums the gate's accuracy measures need (``gate.accuracy.compare``), in one read of the two outputs.

Every verdict checks a candidate's output against the host's at its site: cosine, relative L2 and PSNR, from the
sums a.b, a.a, b.b, (a-b).(a-b), the reference's range and whether both are finite. In torch operations that takes a
float64 copy of each operand and about twenty kernels per slice of 4M elements: at a Wan 2.1 attention output
(50M elements) some 240 launches and several GB of traffic per check, at every attention and linear site a
calibration checks. Here one launch reads both operands once in their own dtype: each program takes a block of
elements, forms the products in float64 and writes its partial sums; torch adds the programs' partials in a fixed
order, so the same inputs give the same figures on every run (no atomics).

Numerics: bf16, fp16 and float32 values are exact in float64, and so are the products of two of them; each element
is formed in float64 as in the torch path (the difference and its square rounded to float64, as there), and only the
order of the additions differs from it.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

BLOCK = 4096
SUMS = 7  # dot, |a|^2, |b|^2, |a-b|^2, non-finite count, max(b), min(b)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit
def _not_finite(x):
    return ((x != x) | (tl.abs(x) == float("inf"))).to(tl.float64)


@triton.jit(do_not_specialize=["n"])  # one compiled kernel per pair of dtypes, whatever the length
def _sums_kernel(A, B, PARTIALS, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    a = tl.load(A + offs, mask=inside, other=0).to(tl.float64)
    b = tl.load(B + offs, mask=inside, other=0).to(tl.float64)
    d = a - b
    out = PARTIALS + pid.to(tl.int64) * 7
    tl.store(out + 0, tl.sum(a * b, axis=0))
    tl.store(out + 1, tl.sum(a * a, axis=0))
    tl.store(out + 2, tl.sum(b * b, axis=0))
    tl.store(out + 3, tl.sum(d * d, axis=0))
    tl.store(out + 4, tl.sum(_not_finite(a) + _not_finite(b), axis=0))
    tl.store(out + 5, tl.max(tl.where(inside, b, float("-inf")), axis=0))
    tl.store(out + 6, tl.min(tl.where(inside, b, float("inf")), axis=0))


def compile_sums(a_dtype: torch.dtype, b_dtype: torch.dtype, device: torch.device) -> None:
    """Compile the kernel for one pair of dtypes on ``device``, or load it from Triton's cache, without running it or
    allocating (``gate.accuracy.kernel_ready`` does this in a thread, ahead of the checks): Triton stands a
    placeholder at address 0 for each pointer, so the kernel is the one that operands aligned to 16 bytes (any
    allocation's start) and shorter than 2**31 elements launch; ``n`` is not specialised."""
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        _sums_kernel.warmup(a_dtype, b_dtype, torch.float64, BLOCK, BLOCK=BLOCK, grid=(1,))


def accuracy_sums(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float64 [7] on the operands' device: a.b, a.a, b.b, (a-b).(a-b), how many elements of either are not finite,
    max(b), min(b), over flat contiguous ``a`` and ``b`` of one length (each bf16, fp16 or float32). No host
    synchronisation: the caller reads the seven numbers once."""
    if a.dim() != 1 or b.dim() != 1 or a.numel() != b.numel() or not (a.is_contiguous() and b.is_contiguous()):
        raise ValueError(f"two flat contiguous operands of one length expected, got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    if a.dtype not in DTYPES or b.dtype not in DTYPES:
        raise ValueError(f"dtypes {a.dtype}, {b.dtype}: the kernel reads {', '.join(map(str, DTYPES))}")
    n = a.numel()
    programs = triton.cdiv(n, BLOCK)
    partials = torch.empty((programs, SUMS), dtype=torch.float64, device=a.device)
    _sums_kernel[(programs,)](a, b, partials, n, BLOCK=BLOCK)
    return torch.cat([partials[:, :5].sum(0), partials[:, 5].max().reshape(1), partials[:, 6].min().reshape(1)])
