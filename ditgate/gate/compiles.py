"""What Triton compiled, and what it loaded from its disk cache, while a block of code ran.

Why: a first process's calibration is mostly its forms' first calls, and a first call is mostly kernel compiles
(the 8-bit forms' quantization passes and attention kernels, the sparse stage's selector). Whether a slow first
process is compiling, loading, or measuring decides what to cut, so ``ditgate bench calibration`` reports it
per run. Triton calls ``knobs.compilation.listener`` once per ``triton.compile``, on a cache hit too; the listener
is process-wide, so ``watch_compiles`` chains to any listener already set and restores it after.
"""

from __future__ import annotations

import contextlib
import importlib.util
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class KernelCompiles:
    """Triton's compiles in one watched block: ``compiled`` kernels built (their seconds, by kernel name) and
    ``loaded`` ones read from the disk cache (a second process's first calls)."""

    compiled: int = 0
    loaded: int = 0
    compile_s: float = 0.0
    load_s: float = 0.0
    by_kernel: dict[str, float] = field(default_factory=dict)  # kernel name -> seconds compiling it (misses only)

    def text(self) -> str:
        if not self.compiled and not self.loaded:
            return "no Triton kernel compiled or loaded"
        top = ", ".join(f"{name} {s:.2f} s" for name, s in sorted(self.by_kernel.items(), key=lambda kv: -kv[1])[:4])
        return (f"Triton compiled {self.compiled} kernels in {self.compile_s:.2f} s"
                + (f" ({top})" if top else "") + f", loaded {self.loaded} from its cache in {self.load_s:.2f} s")


class _Tally:
    """The listener's running counts: Triton may compile in several threads at once (``gate.warm``), hence the lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.compiled = self.loaded = 0
        self.compile_s = self.load_s = 0.0
        self.by_kernel: dict[str, float] = {}

    def __call__(self, *, src, times, cache_hit: bool, **_) -> None:
        seconds = times.total / 1e6  # Triton's CompileTimes are in microseconds
        name = getattr(getattr(src, "fn", None), "__name__", None) or getattr(src, "name", None) or "kernel"
        with self.lock:
            if cache_hit:
                self.loaded += 1
                self.load_s += seconds
            else:
                self.compiled += 1
                self.compile_s += seconds
                self.by_kernel[name] = self.by_kernel.get(name, 0.0) + seconds

    def result(self) -> KernelCompiles:
        with self.lock:
            return KernelCompiles(self.compiled, self.loaded, round(self.compile_s, 4), round(self.load_s, 4),
                                  {k: round(v, 4) for k, v in self.by_kernel.items()})


@contextlib.contextmanager
def watch_compiles() -> Iterator[_Tally]:
    """Count Triton's compiles and cache loads inside the block; ``.result()`` of what it yields gives them. Where
    Triton is missing, or has no compilation listener (older than 3.4), it yields a tally that stays empty."""
    tally = _Tally()
    knobs = None
    if importlib.util.find_spec("triton") is not None:
        try:
            from triton import knobs
        except ImportError:
            pass
    if knobs is None or not hasattr(knobs.compilation, "listener"):
        yield tally
        return
    before = knobs.compilation.listener

    def listen(**kwargs) -> None:
        tally(**kwargs)
        if before is not None:
            before(**kwargs)

    knobs.compilation.listener = listen
    try:
        yield tally
    finally:
        knobs.compilation.listener = before
