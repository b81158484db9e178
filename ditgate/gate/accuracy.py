"""Accuracy of a candidate's output against the host's: cosine, relative L2, PSNR (in float64)."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Accuracy:
    cosine: float
    rel_l2: float
    psnr_db: float  # against the reference's peak-to-peak range; inf when identical
    finite: bool


CHUNK = 1 << 22  # elements per float64 slice: a few tens of MiB of temporaries however large the output
DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # what the one-read kernel reads (exact in float64)
# why the kernel failed in this process, once it has: the torch path serves every check after that
_KERNEL_FAILED: list[str] = []
# the kernel's compile (or load) per (dtype, dtype, device), started in a thread the first time a check needs it
_PREPARING: dict[tuple, Future] = {}
_PREPARER: list[ThreadPoolExecutor] = []  # one worker, made at the first need
FIRST_WAIT_S = 0.05  # what the first check waits for the kernel: a load from a cache, not a compile
logger = logging.getLogger("ditgate")


@functools.cache
def accuracy_kernel():
    """``kernels.accuracy_sums.accuracy_sums``, or None where Triton cannot be imported (loaded once, read-only)."""
    try:
        from ..kernels.accuracy_sums import accuracy_sums
    except Exception:  # no Triton, or one that fails to load: the torch path serves
        return None
    return accuracy_sums


def _on_gpu(t: torch.Tensor) -> bool:
    return t.is_cuda


def kernel_ready(a: torch.Tensor, b: torch.Tensor, wait: bool = False) -> bool:
    """Whether the one-read kernel for these operands' dtypes is compiled for their device. The first time a check
    asks, the kernel's compile (a fresh process's, about 0.6 s on an H100: a stock forward of Wan 2.1 1.3B) or its
    load (from Triton's cache, or from memory after a contest's compile-ahead step: milliseconds) starts in a
    thread, and the torch path serves the checks until it has ended, so that a calibration's first check does not
    wait for a compile; that first check waits ``FIRST_WAIT_S`` for it, which a load takes. ``wait``: block until it
    has ended (a benchmark's or a test's wish; ``DITGATE_ACCURACY_KERNEL_THREAD=0`` makes every check wait, as the
    first one did before, for a measurement of the difference). A compile that fails is logged once and leaves
    every later check to the torch path."""
    key = (a.dtype, b.dtype, a.device)
    job = _PREPARING.get(key)
    if job is None:
        if not _PREPARER:
            _PREPARER.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="ditgate-accuracy"))
        try:
            job = _PREPARING[key] = _PREPARER[0].submit(_prepare_kernel, a.dtype, b.dtype, a.device)
        except RuntimeError:  # the interpreter is shutting down: no new threads
            return False
        futures.wait([job], timeout=FIRST_WAIT_S)
    if wait or os.environ.get("DITGATE_ACCURACY_KERNEL_THREAD") == "0":
        job.exception()  # blocks until it has ended
    if not job.done():
        return False
    exc = job.exception()
    if exc is not None:
        if not _KERNEL_FAILED:
            _kernel_failed(exc)
        return False
    return True


def _prepare_kernel(a_dtype: torch.dtype, b_dtype: torch.dtype, device: torch.device) -> None:
    if accuracy_kernel() is None:
        raise RuntimeError("Triton cannot be imported")
    from ..kernels.accuracy_sums import compile_sums
    compile_sums(a_dtype, b_dtype, device)


def _kernel_failed(exc: BaseException) -> None:
    _KERNEL_FAILED.append(f"{type(exc).__name__}: {exc}"[:300])  # a verdict must not fail for the check's sake
    logger.warning("ditgate: the accuracy check's kernel failed (%s); its torch path serves from now on",
                   _KERNEL_FAILED[0])


def compare(out: torch.Tensor, ref: torch.Tensor, kernel: bool | None = None) -> Accuracy:
    """The three measures over every element, with float64 sums. On a GPU, in one read of both outputs
    (``kernels.accuracy_sums``: one launch, where the torch path below takes about twenty kernels and float64 copies
    per slice); elsewhere, or for other dtypes, a slice at a time in torch operations: the float64 temporaries stay a
    slice's (a non-contiguous output is copied once in its own dtype to be sliced). Whole-tensor float64 copies of a
    HunyuanVideo attention output (207M elements) are 6-7 GB beside a 26 GB model, which the allocator must find at
    every site a contest checks. One host synchronisation at the end. Not finite when either output holds a NaN or
    an infinity: a host output that does passes no form. ``kernel``: force the one-read kernel (True; under Triton's
    interpreter on a CPU) or the torch path (False); None picks the kernel for CUDA tensors it reads once it is
    compiled (``kernel_ready``). The two paths' figures differ only in the order of their float64 additions."""
    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} differs from the host's {tuple(ref.shape)}")
    if out.numel() == 0:
        raise ValueError("empty outputs: nothing to compare")
    a_all, b_all = out.detach().reshape(-1), ref.detach().reshape(-1)
    picked = (kernel is None and _on_gpu(a_all) and not _KERNEL_FAILED and a_all.dtype in DTYPES
              and b_all.dtype in DTYPES and accuracy_kernel() is not None and kernel_ready(a_all, b_all))
    sums = accuracy_kernel() if kernel or picked else None
    if kernel and sums is None:
        raise RuntimeError("the accuracy check's kernel cannot be loaded here (Triton missing or failing to import)")
    if sums is not None:
        try:
            with torch.cuda.device(a_all.device) if a_all.is_cuda else contextlib.nullcontext():  # its compiled copy
                dot, na2, nb2, d2, not_finite, bmax, bmin = sums(a_all.contiguous(), b_all.contiguous()).tolist()
        except Exception as exc:
            if kernel:
                raise
            _kernel_failed(exc)
        else:
            return _measures(not_finite == 0, dot, na2, nb2, d2, bmax, bmin, a_all.numel())
    zero = torch.zeros((), dtype=torch.float64, device=a_all.device)
    dot, na2, nb2, d2 = zero.clone(), zero.clone(), zero.clone(), zero.clone()
    bmax = torch.full((), -math.inf, dtype=torch.float64, device=a_all.device)
    bmin = torch.full((), math.inf, dtype=torch.float64, device=a_all.device)
    finite = torch.ones((), dtype=torch.bool, device=a_all.device)
    for start in range(0, a_all.numel(), CHUNK):
        a = a_all[start:start + CHUNK].double()
        b = b_all[start:start + CHUNK].double()
        finite &= torch.isfinite(a).all() & torch.isfinite(b).all()
        dot += a @ b
        na2 += a @ a
        nb2 += b @ b
        diff = a - b
        d2 += diff @ diff
        bmax = torch.maximum(bmax, b.max())
        bmin = torch.minimum(bmin, b.min())
    is_finite, dot, na2, nb2, d2, bmax, bmin = torch.stack(
        [finite.double(), dot, na2, nb2, d2, bmax, bmin]).tolist()
    return _measures(bool(is_finite), dot, na2, nb2, d2, bmax, bmin, a_all.numel())


def _measures(finite: bool, dot: float, na2: float, nb2: float, d2: float, bmax: float, bmin: float,
              n: int) -> Accuracy:
    if not finite:
        return Accuracy(float("nan"), float("inf"), float("-inf"), False)
    na, nb = math.sqrt(na2), math.sqrt(nb2)
    denom = na * nb
    cosine = dot / denom if denom > 0 else (1.0 if na == nb else 0.0)
    rel = math.sqrt(d2) / nb if nb > 0 else float(d2 > 0)
    mse = d2 / n
    span = bmax - bmin
    psnr = float("inf") if mse == 0 else (10 * math.log10(span * span / mse) if span > 0 else float("-inf"))
    return Accuracy(cosine=cosine, rel_l2=rel, psnr_db=psnr, finite=True)
