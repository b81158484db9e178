"""Triton kernel launches recorded instead of run: what a call would launch, with the arguments it would pass.

Two users: ``same_code`` and ``hopper_compile`` compile the recorded launches for sm_90 on a machine without a GPU,
and the gate's ``compile_ahead`` makes a form's first call once with its launches recorded, then compiles all of them
at once before the real first call. The second runs in a process that other threads may be launching kernels in,
so recording is scoped to the thread that asked for it: a launch from any other thread runs as usual.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Launch:
    """One recorded launch: the kernel (a ``triton.runtime.jit.JITFunction``, Gluon's included) and its arguments
    (the grid left out: compiling does not depend on it)."""

    kernel: object
    args: tuple
    kwargs: dict


_local = threading.local()
_lock = threading.Lock()
_original = None  # JITFunction.run as it was when recording began; kept after, for calls already dispatched
_recorders = 0


def _dispatch(self, *args, grid, warmup, **kwargs):
    """``JITFunction.run`` while some thread records: this thread's launches are recorded (returning None, as Triton's
    own run does when a hook skips a launch), everything else goes to the original."""
    launches = getattr(_local, "launches", None)
    if launches is not None and not warmup:
        launches.append(Launch(self, args, kwargs))
        return None
    return _original(self, *args, grid=grid, warmup=warmup, **kwargs)


@contextlib.contextmanager
def recorded_launches() -> Iterator[list[Launch]]:
    """The launches this thread makes inside the block, recorded and not run (the list fills as they come). Torch's
    own operations still run: only Triton's kernels are skipped, so their outputs hold whatever the memory held."""
    from triton.runtime.jit import JITFunction

    global _original, _recorders
    with _lock:
        if _recorders == 0 and JITFunction.run is not _dispatch:  # (a recording left installed is not its own original)
            _original = JITFunction.run
            JITFunction.run = _dispatch
        _recorders += 1
    outer = getattr(_local, "launches", None)
    _local.launches = launches = []
    try:
        yield launches
    finally:
        _local.launches = outer
        with _lock:
            _recorders -= 1
            if _recorders == 0 and JITFunction.run is _dispatch:  # someone else's patch since stays theirs to undo
                JITFunction.run = _original


def recording() -> bool:
    """Whether this thread's Triton launches are being recorded (a dry call): what a form that keeps state between
    calls asks, since nothing its launches would write gets written."""
    return getattr(_local, "launches", None) is not None


def launches_of(call: Callable[[], object]) -> list[tuple]:
    """The kernel launches ``call`` makes, as (kernel, args, kwargs), none of them run (no GPU needed)."""
    with recorded_launches() as launches:
        call()
    return [(launch.kernel, launch.args, launch.kwargs) for launch in launches]
