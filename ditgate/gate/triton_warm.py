"""Triton made ready in a thread from ``attach`` on: its cache key, then the gate's accuracy kernel.

Why: a process's first Triton launch, even of a kernel in Triton's disk cache, first computes
``triton.runtime.cache.triton_key()``: SHA-256 over Triton's compiler sources and its whole ``libtriton.so`` (415 MB in
Triton 3.6). On this project's CPU machine that took 0.33 s of the 0.39 s that loading four cached kernels took, and
on an H100 a second process's speed calibration of Wan 2.1 1.3B spent 0.36 s "loading" four kernels: a sixth of its
2.06 s. ``hashlib`` releases the GIL while it hashes, so in a thread the key is made while the process does other
work between ``attach`` and the contest's first Triton call (a pipeline's text encoder, the model's first blocks, the
forms' probes). The contest waits for the key before the first call of a form that launches Triton kernels
(``wait_for_key``): never longer than computing the key there would take.

Then the thread compiles (or loads) ``kernels.agreement_sums`` for the model's dtype, and ``gate.accuracy.compare``
takes that one-pass kernel only once it is ready (``agreement_ready``): a process that launches no Triton kernel of
its own (the quality profile's forms are FA3's and cuDNN's) never waits for Triton to check accuracy.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import time

import torch

_lock = threading.Lock()
_thread: threading.Thread | None = None
_key_made = threading.Event()
_agreement_ready: set[tuple[torch.device, torch.dtype]] = set()


def _make_key() -> None:
    try:
        from triton.runtime.cache import triton_key

        triton_key()  # functools.lru_cache: every later caller in this process finds it made
    except Exception:  # a Triton without it, or an unreadable library: its first launch computes (or fails) as before
        pass
    finally:
        _key_made.set()


def _ready_agreement(device: torch.device, dtype: torch.dtype) -> None:
    try:
        from ..kernels import agreement_sums

        with torch.cuda.device(device):
            agreement_sums.prepare(dtype)
        _agreement_ready.add((device, dtype))
    except Exception:  # compare keeps its slices
        pass


def _on_device(device: torch.device) -> torch.device:
    """``cuda`` with its index (the current device's where none is named), as tensors on it report theirs."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _work(device: torch.device, dtype: torch.dtype) -> None:
    _make_key()
    if device.type == "cuda":
        _ready_agreement(device, dtype)


def start(device: torch.device, dtype: torch.dtype) -> bool:
    """Begin, once per process, in a daemon thread; False where there is nothing to do: no Triton, or its
    interpreter (``TRITON_INTERPRET=1``: nothing compiles, so nothing needs the key)."""
    global _thread
    if os.environ.get("TRITON_INTERPRET") == "1" or importlib.util.find_spec("triton") is None:
        return False
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_work, args=(_on_device(device), dtype), name="ditgate-triton-warm", daemon=True)
            _thread.start()
    return True


def wait_for_key() -> float:
    """Seconds spent waiting for the thread to make Triton's key (0 when it was never started or has made it)."""
    if _thread is None or _key_made.is_set():
        return 0.0
    started = time.perf_counter()
    _key_made.wait()
    return time.perf_counter() - started


def agreement_ready(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the accuracy kernel for ``dtype`` on ``device`` is compiled and loaded in this process."""
    return (_on_device(device), dtype) in _agreement_ready
