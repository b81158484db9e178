"""Paired, interleaved timing of the host and a candidate on the same inputs.

Each round times both, alternating which goes first, and the verdict uses the median of the per-round
ratios (host / candidate) with its min and max: a ratio within the spread of its own rounds is noise.
CUDA events on the GPU; ``time.perf_counter`` around synchronised calls elsewhere.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Timing:
    ratio: float  # median over rounds of host_time / form_time; > 1 means the form is faster
    ratio_min: float
    ratio_max: float
    host_ms: float  # medians
    form_ms: float
    rounds: int


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# a call whose single timed call (launch included) is shorter than this is sampled behind one more, untimed call
LEAD_BELOW_MS = 2.0


def time_once(fn: Callable[[], object], device: torch.device, reps: int = 1, lead: bool = False) -> float:
    """Milliseconds for ``reps`` back-to-back calls of ``fn`` divided by ``reps``.

    ``lead`` (on a GPU): one more call goes first, untimed, so that the timed calls queue behind work in flight, as a
    pipeline's calls do: the sample is then a call's steady cost, its kernels or its host time, whichever is longer.
    Without it the first timed call's launch latency counts in full, which at image lengths weighs most on the forms
    that launch most from Python (the 8-bit forms' quantization), though a pipeline hides it behind the previous
    call's kernels. ``sampling`` asks for it for short calls only: a long call's launch latency is a small part of
    it, and one more long call per sample would lengthen the gate."""
    if device.type == "cuda":
        if lead:
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / reps
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync(device)
    return (time.perf_counter() - t0) * 1e3 / reps


@dataclass(frozen=True)
class Sampling:
    """How ``fn`` is sampled: ``reps`` back-to-back calls of at least the target together, behind an untimed call
    where ``lead`` (``time_once``)."""

    reps: int
    lead: bool


def sampling(fn: Callable[[], object], device: torch.device, target_ms: float) -> Sampling:
    """From one timed call: how many back-to-back calls make a sample of at least ``target_ms``, and whether the
    call is short enough (``LEAD_BELOW_MS``) to be sampled behind an untimed one. Where a form is compared with the
    host, the host's call decides the lead for both (``paired_timing``, the contest's screening): a form's own first
    call carries the very launch latency the lead is there to leave out."""
    once = max(time_once(fn, device), 1e-3)
    return Sampling(max(1, min(1000, int(target_ms / once + 0.999))), once < LEAD_BELOW_MS)


def paired_timing(host: Callable[[], object], form: Callable[[], object], device: torch.device, rounds: int,
                  target_ms: float = 1.0, lead: bool | None = None) -> Timing:
    """``rounds`` interleaved samples of each. Both sides are sampled alike: the same repetitions, and behind an
    untimed call where the host's call is short (``sampling``), or as ``lead`` says where given (a caller whose
    processes must make the same calls, such as the ranks of a context-parallel model, passes it)."""
    at_host, at_form = sampling(host, device, target_ms), sampling(form, device, target_ms)
    reps = max(at_host.reps, at_form.reps)
    lead = at_host.lead if lead is None else lead
    ratios, host_ms, form_ms = [], [], []
    for r in range(rounds):
        if r % 2 == 0:
            h = time_once(host, device, reps, lead)
            f = time_once(form, device, reps, lead)
        else:
            f = time_once(form, device, reps, lead)
            h = time_once(host, device, reps, lead)
        host_ms.append(h)
        form_ms.append(f)
        ratios.append(h / max(f, 1e-9))
    return Timing(
        ratio=statistics.median(ratios),
        ratio_min=min(ratios),
        ratio_max=max(ratios),
        host_ms=statistics.median(host_ms),
        form_ms=statistics.median(form_ms),
        rounds=rounds,
    )


def warm_samples(fn: Callable[[], object], device: torch.device, n: int, warmup: int = 3) -> list[float]:
    """Milliseconds of ``n`` calls of ``fn``, each timed alone, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    return [time_once(fn, device) for _ in range(n)]
