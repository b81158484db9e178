"""Device-time clocks for a plan made for a compiled model: a call captured once into a CUDA graph, then replayed.

Why: a compiled graph runs a linear route as kernels launched by inductor's code (or replayed from a CUDA graph
under ``mode="reduce-overhead"``), none of ditgate's Python. Timed eagerly, a small product is bound by the host: the
form's Python path (its scales, ``torch._scaled_mm``'s dispatch) can outlast its kernel, so a site with few rows
(a text stream's 512 tokens) screened slower than ``F.linear`` and stayed on the host, where the graph would have
run the 8-bit product faster. Replayed from a graph, the host's product and the form's are both what the device
does. A call that cannot be captured raises ``CaptureFailed``: the contest refuses that form there (a call a CUDA
graph cannot hold has no device time to compare, and would not survive ``reduce-overhead`` either).

Captures share one side stream and one memory pool per device (``_Capturing``): the warm call runs on that stream
first, so that libraries' per-stream workspaces (cuBLAS's) are made outside any capture, and a graph's memory goes
back to the shared pool, for the next capture, when the graph is dropped.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# The timing-key variant of a call timed by ``ReplayClock``: kept apart in the book and the cache from the same
# call timed eagerly
DEVICE_TIME = "device time (CUDA graph replay)"


class CaptureFailed(RuntimeError):
    """A clock's call could not be captured into a CUDA graph (the message says why)."""


class _Capturing:
    """Per device: the side stream captures run on (the default stream cannot capture) and their shared pool."""

    def __init__(self) -> None:
        self._by_device: dict[int, tuple[torch.cuda.Stream, tuple]] = {}

    def of(self, device: torch.device) -> tuple[torch.cuda.Stream, tuple]:
        index = _index(device)
        if index not in self._by_device:
            with torch.cuda.device(index):
                self._by_device[index] = (torch.cuda.Stream(), torch.cuda.graph_pool_handle())
        return self._by_device[index]

    def retire(self, device: torch.device) -> None:
        """After a failed capture: the next capture gets a stream and pool of its own. A capture whose end fails
        (torch's ``capture_end`` raises before it stops routing allocations to the pool) leaves its pool recording,
        and every later capture into it would fail with it, the next site's host product's among them."""
        index = _index(device)
        held = self._by_device.pop(index, None)
        if held is not None:
            try:
                torch._C._cuda_endAllocateToPool(index, held[1])
            except Exception:
                pass  # already ended, or a torch without this call: the pool is dropped either way


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


_CAPTURING = _Capturing()


class ReplayClock:
    """``fn`` on ``device`` as a clock: its first call (``prime``) runs ``fn`` once on the capture stream (allocations,
    lazy set-up, compiles) and captures one more call into a CUDA graph; every call then replays that graph and returns
    the captured output (not read by the contest: accuracy is checked on the form's own call). Nothing runs until the
    clock is first used, so that an entrant the contest never times is never run here."""

    def __init__(self, fn: Callable[[], torch.Tensor], label: str, device: torch.device) -> None:
        self.fn, self.label, self.device = fn, label, device
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None
        self.failure: CaptureFailed | None = None  # a capture that failed is not tried again

    def prime(self) -> None:
        """Capture now, if not yet (untimed: a sample must not hold the warm call and the capture); a clock whose
        capture failed raises that failure again without running anything."""
        if self.failure is not None:
            raise self.failure
        if self.graph is None:
            try:
                self.graph, self.out = capture(self.fn, self.device)
            except Exception as exc:
                self.failure = CaptureFailed(f"{self.label} could not be captured in a CUDA graph for its device "
                                             f"time: {type(exc).__name__}: {str(exc)[:300]}")
                raise self.failure from exc

    def __call__(self) -> torch.Tensor:
        self.prime()
        self.graph.replay()
        return self.out


def capture(fn: Callable[[], torch.Tensor], device: torch.device) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """One call of ``fn`` after a warm one, both on the device's capture stream, captured into the shared pool.
    Not ``torch.cuda.graph``: it empties the allocator's cache at every capture."""
    stream, pool = _CAPTURING.of(device)
    current = torch.cuda.current_stream(device)
    graph = torch.cuda.CUDAGraph()
    stream.wait_stream(current)
    with torch.cuda.device(device), torch.cuda.stream(stream):
        fn()
        begun = False
        try:
            graph.capture_begin(pool=pool, capture_error_mode="thread_local")
            begun = True
            out = fn()
        except BaseException:
            if begun:
                try:
                    graph.capture_end()
                except Exception:
                    pass  # the call's own error is the one to report
            _CAPTURING.retire(device)
            raise
        try:
            graph.capture_end()
        except BaseException:
            _CAPTURING.retire(device)
            raise
    current.wait_stream(stream)
    return graph, out


def prime(fn: Callable[[], object]) -> None:
    """A clock's capture made before it is sampled (``ReplayClock.prime``); nothing for any other callable."""
    if isinstance(fn, ReplayClock):
        fn.prime()


def unreplayed(fn: Callable[[], object]) -> Callable[[], object]:
    """The call a clock replays (``fn`` itself for any other callable): what a memory measurement runs, since a
    replay allocates nothing."""
    return fn.fn if isinstance(fn, ReplayClock) else fn


def replay_clocks(device: torch.device) -> bool:
    """Whether clocks on ``device`` replay CUDA graphs (a CUDA device only: elsewhere calls are timed as they come)."""
    return device.type == "cuda"
