"""The sums behind a candidate's accuracy against the host's output, in one pass over both: Triton, on CUDA.

Why: the gate checks a candidate's accuracy at every site it may serve, on the site's live output (50 million
elements at Wan 2.1 1.3B's self-attention). ``gate.accuracy.compare``'s torch path converts slices to float64 and makes
about fourteen kernels a slice: at that size 12 slices, some 170 launches and 5 GB of memory traffic per check, a few
milliseconds each, paid at 30 sites even by a process whose timings all come from the cache. Here each program reads a
block of both outputs once and writes seven numbers: the block's sums of a·b, a², b² and (a−b)² in float32, the
reference's largest and smallest value, and how many elements of either were not finite. The float32 sums cover 4096
elements each (a tree inside the block: relative error about 1e-7) and are added in float64 after, so the cosine is
good to about 1e-6, well inside the floors it is held to (0.9999 at the tightest).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096
FIELDS = 7  # dot, a², b², (a−b)², max b, min b, not finite
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit(do_not_specialize=["N"])  # one compile for every size
def _sums_kernel(A, B, PART, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < N
    a = tl.load(A + offs, mask=inside, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=inside, other=0.0).to(tl.float32)
    bad = inside & (((a - a) != 0.0) | ((b - b) != 0.0))  # NaN or an infinity in either
    a = tl.where(bad, 0.0, a)
    b = tl.where(bad, 0.0, b)
    d = a - b
    row = PART + pid.to(tl.int64) * 7
    tl.store(row + 0, tl.sum(a * b, axis=0))
    tl.store(row + 1, tl.sum(a * a, axis=0))
    tl.store(row + 2, tl.sum(b * b, axis=0))
    tl.store(row + 3, tl.sum(d * d, axis=0))
    tl.store(row + 4, tl.max(tl.where(inside, b, float("-inf")), axis=0))
    tl.store(row + 5, tl.min(tl.where(inside, b, float("inf")), axis=0))
    tl.store(row + 6, tl.sum(bad.to(tl.float32), axis=0))


class _Pointer:
    """What Triton reads of a tensor argument to specialize a kernel (its dtype, an address aligned to 16 bytes, as
    every allocation of torch's is): enough to compile without allocating on the device."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def data_ptr(self) -> int:
        return 0


def prepare(dtype: torch.dtype) -> None:
    """Compile (or load from Triton's cache) the kernel for ``dtype`` on the current device, launching nothing and
    allocating nothing there: safe beside another thread's work, a CUDA graph's capture included."""
    _sums_kernel.warmup(_Pointer(dtype), _Pointer(dtype), _Pointer(torch.float32), BLOCK, BLOCK=BLOCK, num_warps=8,
                        grid=(1,))


def serves(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``sums`` takes these: two flat contiguous tensors of one dtype it reads, on one device."""
    return (a.dtype == b.dtype and a.dtype in DTYPES and a.device == b.device and a.dim() == b.dim() == 1
            and a.is_contiguous() and b.is_contiguous() and a.numel() == b.numel() > 0)


def sums(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float, float, float, float, bool]:
    """(Σab, Σa², Σb², Σ(a−b)², max b, min b, every element finite) of two flat outputs (``serves``), with one
    host synchronisation. Elements that are not finite count in the flag and are left out of the sums."""
    if not serves(a, b):
        raise ValueError("agreement sums take two flat contiguous tensors of one dtype (bf16, fp16, fp32) and size")
    blocks = triton.cdiv(a.numel(), BLOCK)
    part = torch.empty(blocks, FIELDS, dtype=torch.float32, device=a.device)
    _sums_kernel[(blocks,)](a, b, part, a.numel(), BLOCK=BLOCK, num_warps=8)
    total = part[:, :4].double().sum(0)
    extremes = torch.stack([part[:, 4].max(), part[:, 5].min(), part[:, 6].sum()]).double()
    dot, na2, nb2, d2, bmax, bmin, bad = torch.cat([total, extremes]).tolist()
    return dot, na2, nb2, d2, bmax, bmin, bad == 0
