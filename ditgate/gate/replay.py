"""Device-time clocks for a plan made for a compiled model: a call captured once into a CUDA graph, then replayed.

Why: a compiled graph runs a linear route as kernels launched by inductor's code (or replayed from a CUDA graph
under ``mode="reduce-overhead"``), none of ditgate's Python. Timed eagerly, a small product is bound by the host: the
form's Python path (its scales, ``torch._scaled_mm``'s dispatch) can outlast its kernel, so a site with few rows
(a text stream's 512 tokens) screened slower than ``F.linear`` and stayed on the host, where the graph would have
run the 8-bit product faster. Replayed from a graph, the host's product and the form's are both what the device
does. A capture that fails (an operation a graph cannot hold) leaves that clock to call eagerly, said in the log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

logger = logging.getLogger("ditgate")

# The timing-key variant of a call timed by ``ReplayClock``: kept apart in the book and the cache from the same
# call timed eagerly
DEVICE_TIME = "device time (CUDA graph replay)"


class ReplayClock:
    """``fn`` as a clock: on its first call it runs ``fn`` once (allocations, lazy set-up, compiles), captures one
    more call into a CUDA graph, and from then on each call replays that graph and returns the captured output.
    Capture happens only when the clock is first used, so that an entrant the contest never times is never run."""

    def __init__(self, fn: Callable[[], torch.Tensor], label: str) -> None:
        self.fn, self.label = fn, label
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None
        self.eager = False  # the capture failed: calls run ``fn`` itself

    def __call__(self) -> torch.Tensor:
        if self.graph is not None:
            self.graph.replay()
            return self.out
        if self.eager:
            return self.fn()
        self.fn()
        try:
            self.graph, self.out = capture(self.fn)
        except Exception as exc:
            self.eager = True
            logger.info("ditgate: %s could not be captured in a CUDA graph (%s: %s); it is timed eagerly",
                        self.label, type(exc).__name__, str(exc)[:200])
            return self.fn()
        self.graph.replay()
        return self.out


def capture(fn: Callable[[], torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """One call of ``fn`` captured on a side stream (the default stream cannot capture), in a pool of its own.
    Not ``torch.cuda.graph``: it collects garbage and empties the allocator's cache at every capture, which a
    calibration capturing a few dozen products would pay each time."""
    graph = torch.cuda.CUDAGraph()
    current = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(current)
    with torch.cuda.stream(side):
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            out = fn()
        finally:
            graph.capture_end()
    current.wait_stream(side)
    return graph, out


def replay_clocks(device: torch.device) -> bool:
    """Whether clocks on ``device`` replay CUDA graphs (a CUDA device only: elsewhere calls are timed as they come)."""
    return device.type == "cuda"
