"""How much of a pass the GPU spent working: its kernels' and copies' time, merged, over the span from the first
one's start to the last one's end.

Why: the sparse forms launch several small kernels per call, and timed one call at a time the GPU waited for the
host between them (about 0.8 ms per FP8 call at LTX's 27588 tokens on an H200). Back to
back the host runs ahead and those waits vanish. Whether they vanish inside a whole model forward, where other
modules' kernels keep the GPU busy while the host launches, is what this measures (``ditgate bench model
--gpu-busy``). The profiler adds its own host time to every launch, so the idle time it finds is an upper bound.

The same pass also sums the device time per kernel name: where two rows of one model differ (a compiled plan with
linear routes against one without, CUDA graphs against default compile), the kernels whose time moved say why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GpuBusy:
    span_ms: float  # first device activity's start to the last one's end
    busy_ms: float  # the union of the device activities' intervals
    activities: int  # kernels, copies and fills recorded
    kernels: tuple[tuple[str, float, int], ...] = ()  # (name, summed ms, count), longest first

    @property
    def idle_ms(self) -> float:
        return self.span_ms - self.busy_ms

    @property
    def fraction(self) -> float:
        return self.busy_ms / self.span_ms if self.span_ms > 0 else 1.0

    def text(self) -> str:
        return f"GPU busy {100 * self.fraction:.1f} % of {self.span_ms:.1f} ms (idle {self.idle_ms:.2f} ms)"


def kernels_text(kernels: tuple[tuple[str, float, int], ...], top: int = 8, width: int = 60) -> str:
    """"kernels: sm90_xmma_gemm... 41.20 ms x60, ...": where a pass's device time went (``GpuBusy.kernels``, or a
    bench row's), longest first."""
    return "kernels: " + ", ".join(f"{name[:width]} {ms:.2f} ms x{n}" for name, ms, n in kernels[:top])


def kernel_totals(events: Iterable[tuple[str, float]]) -> tuple[tuple[str, float, int], ...]:
    """``events``: (kernel name, duration in microseconds) -> (name, summed ms, count), longest first."""
    totals: dict[str, list[float]] = {}
    for name, us in events:
        entry = totals.setdefault(name, [0.0, 0])
        entry[0] += us / 1e3
        entry[1] += 1
    return tuple(sorted(((n, ms, int(c)) for n, (ms, c) in totals.items()), key=lambda t: -t[1]))


def busy_from_intervals(intervals: Iterable[tuple[float, float]]) -> GpuBusy:
    """``intervals``: (start, end) in microseconds, in any order, overlapping where streams ran side by side."""
    spans = sorted((s, e) for s, e in intervals if e >= s)
    if not spans:
        return GpuBusy(0.0, 0.0, 0)
    busy = 0.0
    start, end = spans[0]
    for s, e in spans[1:]:
        if s > end:
            busy += end - start
            start, end = s, e
        else:
            end = max(end, e)
    busy += end - start
    return GpuBusy((max(e for _, e in spans) - spans[0][0]) / 1e3, busy / 1e3, len(spans))


def measure_gpu_busy(fn: Callable[[], object], device: torch.device) -> GpuBusy | str:
    """Run ``fn`` once under torch.profiler's CUDA activity tracing; the reason instead where it cannot."""
    if device.type != "cuda":
        return "needs a CUDA device"
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(device)
    device_events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = busy_from_intervals((e.time_range.start, e.time_range.end) for e in device_events)
    if not busy.activities:
        return "the profiler recorded no device activity"
    totals = kernel_totals((e.name, e.time_range.end - e.time_range.start) for e in device_events)
    return dataclasses.replace(busy, kernels=totals)
