"""One site's contest among its candidate forms: timing shared through the book, accuracy checked here.

The old gate timed every candidate at every site in paired rounds: a model of thirty identical blocks paid thirty
times for one answer, 130 to 230 forwards of calibration. Here the work a site does is only what its verdict needs:

1. Every entrant the book knows nothing of at this key is run once (the warm-up, whose output is also this site's
   accuracy sample) and, if it passed, screened: timed alone (the better of two samples) against the host.
2. An entrant that cannot pass the speed gate on what is known (a screening ratio more than ``screen_margin``
   below ``min_speedup``, or paired rounds below it) is refused, at any site with that key, without running.
3. The *top* entrants, those within ``screen_margin`` of the best known ratio, are the only ones whose accuracy is
   checked at this site (one call each) and that get paired rounds (once per key, in the book). One that fails its
   floor here leaves the top, and the next one in reach enters it; the loop ends when every top entrant has a
   paired timing and passed here. Where two top entrants of one precision both have paired timings (a later site
   of a key, or a second process reading the cache), the slower waits behind the faster: it is not run here unless
   the faster fails this site's floors (paired ratios order forms reliably; the pick below could not take it).
4. The verdict picks among the top as before: the fastest exact form, a bounded one only if it beats that by the
   speed threshold too. The rest are refused as outranked, with the timing that put them out and where it was taken.

With ``screen_margin=None`` nothing is screened and every entrant is checked and paired (the per-site gate), and a
profile with ``share_timing=False`` gives each site a private book: that is the old gate, kept for comparison.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..forms import Precision
from .accuracy import DTYPES as ACCURACY_DTYPES
from .accuracy import Accuracy, accuracy_kernel, compare
from .book import BookTiming, TimingBook, TimingKey
from .memory import measure_memory
from .profiles import Profile
from .replay import prime, unreplayed
from .timing import paired_timing, sampling, sync, time_once
from .verdict import (LESS_ACCURATE, OUTRANKED, OVER_MEMORY, RAISED, SLOWER, UNAVAILABLE, UNSUPPORTED, Measurement,
                      Refusal)
from . import warm as first_calls
from .compile_ahead import compile_ahead

ACCURACY_CHECK = "accuracy check"  # how the accuracy check's kernel shows in a compile-ahead step's names and spend
SCREEN_TARGET_MS = 1.0  # one screening sample is this many milliseconds of back-to-back calls (at least one call)
SCREEN_SAMPLES = 2


@dataclass(frozen=True)
class Entrant:
    """One candidate at one site: how to run it on the site's live input, and its key in the book."""

    name: str
    precision: str  # a ``Precision`` value
    key: TimingKey
    run: Callable[[], torch.Tensor]  # one call on the live input, in the form's own layout
    to_host: Callable[[torch.Tensor], torch.Tensor]  # that output as the host's would be
    resident_bytes: Callable[[], int]
    # why it cannot run after all ("" when it can): the availability probe (its imports), deferred to the first time
    # this contest would run it, so that a form a known timing refuses is never imported
    ready: Callable[[], str] = lambda: ""
    # what is timed where it is not ``run`` itself (a linear form in a plan for a compiled model: its product alone,
    # or its call replayed from a CUDA graph), and the host's call it is timed against where not the contest's host
    # (the host's product replayed alike: ``gate.replay``)
    timed: Callable[[], torch.Tensor] | None = None
    timed_host: Callable[[], torch.Tensor] | None = None
    # its first call may run in a thread beside the other entrants' first calls (``warm``; ``Form.warms_in_thread``)
    warms_in_thread: bool = False
    # its first call may be made once dry, its kernels compiled beside the others' (``compile_ahead``)
    compiles_ahead: bool = False

    @property
    def clock(self) -> Callable[[], torch.Tensor]:
        return self.timed if self.timed is not None else self.run


@dataclass(frozen=True)
class ContestResult:
    chosen: Measurement | None
    measured: tuple[Measurement, ...]  # every entrant with a known timing (cosine NaN where not run here)
    refusals: tuple[Refusal, ...]


def _measurement(e: Entrant, t: BookTiming, acc: Accuracy | None) -> Measurement:
    return Measurement(e.name, e.precision, t.ratio, t.ratio_min, t.ratio_max, t.host_ms, t.form_ms,
                       acc.cosine if acc else math.nan, acc.rel_l2 if acc else math.nan, t.peak_bytes,
                       t.resident_bytes, rounds=t.rounds, screened=t.screened, timed_at=t.site,
                       from_cache=t.from_cache, first_ms=t.first_ms)


def pick(winners: list[Measurement], min_speedup: float) -> Measurement | None:
    """The fastest exact winner; a bounded one only if it beats that by the speed threshold too."""
    exact = [m for m in winners if m.precision == Precision.EXACT.value]
    bounded = [m for m in winners if m.precision != Precision.EXACT.value]
    best_exact = max(exact, key=lambda m: m.ratio, default=None)
    best_bounded = max(bounded, key=lambda m: m.ratio, default=None)
    if best_bounded is not None and (best_exact is None or best_bounded.ratio >= best_exact.ratio * min_speedup):
        return best_bounded
    return best_exact


class _Contest:
    def __init__(self, site: str, shape_key: str, entrants: list[Entrant], host: Callable[[], torch.Tensor],
                 host_out: torch.Tensor, profile: Profile, book: TimingBook, device: torch.device) -> None:
        self.site, self.shape_key, self.host, self.host_out = site, shape_key, host, host_out
        self.p, self.book, self.device = profile, book, device
        self.margin = profile.screen_margin if profile.screen_margin else math.inf
        self.live = list(entrants)
        self.accuracy: dict[str, Accuracy] = {}
        self.first_ms: dict[str, float] = {}
        self.warmed: dict[str, float] = {}  # name -> ms of its first call, made ahead beside the others' (``warm``)
        self.ahead_ms: dict[str, float] = {}  # name -> ms of the compile-ahead step its kernels compiled in
        self.refusals: list[Refusal] = []
        self.measured: list[Measurement] = []
        self._host_ms: dict[Callable, float] = {}  # the host's screening sample, per host clock
        self._host_lead: bool | None = None  # whether samples here go behind an untimed call (the host's call decides)

    def refuse(self, e: Entrant, kind: str, detail: str, timing: BookTiming | None = None) -> None:
        self.live.remove(e)
        self.refusals.append(Refusal(e.name, kind, detail))
        if timing is not None:  # what put it out stays in the verdict's measurements
            self.measured.append(_measurement(e, timing, self.accuracy.get(e.name)))

    def _spent(self, e: Entrant, started: float) -> None:
        self.book.spend(e.name, time.perf_counter() - started)

    def check_accuracy(self, e: Entrant) -> None:
        """One call on this site's input: the warm-up where nothing ran yet, and this site's accuracy sample."""
        started = time.perf_counter()
        try:
            self._check_accuracy(e)
        finally:
            self._spent(e, started)

    def _check_accuracy(self, e: Entrant) -> None:
        why = e.ready()
        if why:
            self.refuse(e, UNAVAILABLE if why.startswith("unavailable") else UNSUPPORTED, why)
            return
        started = time.perf_counter()  # what its first call costs, not its probe
        try:
            out = e.run()
            if self.book.get(e.key) is None:  # its first call at this key: what warming it up costs
                sync(self.device)
                self.first_ms[e.name] = self.warmed.get(e.name, (time.perf_counter() - started) * 1e3
                                                        + self.ahead_ms.get(e.name, 0.0))
            acc = compare(e.to_host(out), self.host_out)
            del out
        except Exception as exc:  # never fail the call: the host's output is already made
            self.refuse(e, RAISED, f"{type(exc).__name__}: {exc}"[:300])
            return
        if not acc.finite or acc.cosine < self.p.min_call_cosine:
            self.refuse(e, LESS_ACCURATE, f"cosine {acc.cosine:.6f} < {self.p.min_call_cosine} (rel L2 {acc.rel_l2:.2e})")
            return
        if acc.rel_l2 > self.p.call_rel_l2_floor:
            self.refuse(e, LESS_ACCURATE,
                        f"rel L2 {acc.rel_l2:.2e} > {self.p.call_rel_l2_floor:.3g} (cosine {acc.cosine:.6f})")
            return
        self.accuracy[e.name] = acc

    def warm(self) -> None:
        """The first calls of the entrants the book knows nothing of, made ahead: each would be run once here anyway.
        First the kernels of those that opt in compile all at once from a dry call (``compile_ahead``), then the
        first calls of those that may run in threads go side by side (``warm.warm_ahead``); a form whose kernels
        compiled ahead makes its first call in the contest, where it now costs a call. Entrants not ready stay for
        the contest to refuse with their reason."""
        if not self.p.warm_ahead or not first_calls.allowed_on(self.device):
            return
        fresh = []
        for e in self.live:
            if (e.warms_in_thread or e.compiles_ahead and self.p.compile_ahead) and self.book.get(e.key) is None:
                started = time.perf_counter()
                ready = not e.ready()
                self.book.spend(e.name, time.perf_counter() - started)  # its probe (imports) is its, as in a contest
                if ready:
                    fresh.append(e)
        probed = time.perf_counter()
        calls = [first_calls.WarmCall(e.name, e.run) for e in fresh if e.compiles_ahead] if self.p.compile_ahead else []
        if calls:  # the accuracy check's own kernel (``compare``) compiles in the same step, at no extra wall time
            calls.append(first_calls.WarmCall(ACCURACY_CHECK, self._compare_dry))
        ahead = compile_ahead(calls, self.device)
        threaded = time.perf_counter()
        for name in ahead.names:  # the step's wall time is part of each one's first call, and shared in the spend
            self.ahead_ms[name] = (threaded - probed) * 1e3
            self.book.spend(name, (threaded - probed) / len(ahead.names))
        calls = [first_calls.WarmCall(e.name, e.run) for e in fresh if e.warms_in_thread and e.name not in ahead.names]
        self.warmed = first_calls.warm_ahead(calls, self.device)
        if self.warmed:  # the wall time, shared among the forms that ran (those that raised too)
            for call in calls:
                self.book.spend(call.name, (time.perf_counter() - threaded) / len(calls))

    def _compare_dry(self) -> None:
        """The accuracy check's kernel launched on a few elements of the host's output, for the launch to be recorded
        (``warm``); nothing is read back, since a recorded launch writes nothing."""
        few = self.host_out.reshape(-1)[:16].contiguous()
        sums = accuracy_kernel() if few.is_cuda and few.dtype in ACCURACY_DTYPES else None
        if sums is not None:
            sums(few, few)

    def _screen_ms(self, fn: Callable[[], object]) -> float:
        """The better of two samples: one sample is what screening affords, the second keeps a single stall of the
        machine from putting a fast form out of reach. Every sample at this site takes the lead the host's call
        asked for (``timing.sampling``), so that the host's and the forms' samples compare."""
        how = sampling(fn, self.device, SCREEN_TARGET_MS)
        if self._host_lead is None:
            self._host_lead = how.lead  # the first sampled here is the host's
        return min(time_once(fn, self.device, how.reps, self._host_lead) for _ in range(SCREEN_SAMPLES))

    def screen(self, e: Entrant) -> None:
        started = time.perf_counter()
        try:
            self._screen(e)
        finally:
            self._spent(e, started)

    def _screen(self, e: Entrant) -> None:
        try:
            host = self.host_clock(e)
            if host not in self._host_ms:
                self._host_ms[host] = self._screen_ms(host)
            prime(e.clock)
            form_ms = self._screen_ms(e.clock)
        except Exception as exc:
            self.refuse(e, RAISED, f"{type(exc).__name__}: {exc}"[:300])
            return
        self.book.put(e.key, BookTiming.screening(self._host_ms[host], form_ms, self.site,
                                                  self.first_ms.get(e.name, 0.0)))

    def host_clock(self, e: Entrant) -> Callable[[], torch.Tensor]:
        """What ``e`` is timed against: its own host counterpart where it has one (primed), else the host's call."""
        if e.timed_host is None:
            return self.host
        prime(e.timed_host)
        return e.timed_host

    def pair(self, e: Entrant) -> None:
        started = time.perf_counter()
        try:
            self._pair(e)
        finally:
            self._spent(e, started)

    def _pair(self, e: Entrant) -> None:
        try:
            mem = measure_memory(unreplayed(e.clock), self.device, e.resident_bytes)
            host = self.host_clock(e)
            prime(e.clock)
            timing = paired_timing(host, e.clock, self.device, self.p.rounds)
        except Exception as exc:
            self.refuse(e, RAISED, f"{type(exc).__name__}: {exc}"[:300])
            return
        known = self.book.get(e.key)
        first = self.first_ms.get(e.name, known.first_ms if known is not None else 0.0)
        self.book.put(e.key, BookTiming.paired(timing, mem.peak_bytes, mem.resident_bytes, self.site, first))

    def slower_text(self, e: Entrant, t: BookTiming) -> str:
        m = _measurement(e, t, None)
        below = f", more than the screening margin {self.margin:g} below" if t.screened else ""
        return (f"{t.ratio:.3f}x [{t.ratio_min:.3f}-{t.ratio_max:.3f}] < {self.p.min_speedup}x{below} at "
                f"{self.shape_key} ({m.timing_text(self.site)})")

    def step(self) -> bool:
        """One action of the loop; True while it acted (refused, checked, screened or paired something). Accuracy
        and screening of everything in reach come before any paired rounds, so that no form is paired that a
        faster one, still unscreened, would have put out of reach."""
        known = {e.name: self.book.get(e.key) for e in self.live}
        for e in list(self.live):
            t = known[e.name]
            if t is None:
                continue
            bar = self.p.min_speedup / self.margin if t.screened else self.p.min_speedup
            if t.ratio < bar:
                self.refuse(e, SLOWER, self.slower_text(e, t), t)
                return True
            if not t.screened and self.p.max_extra_bytes is not None and \
                    max(t.peak_bytes, t.resident_bytes) > self.p.max_extra_bytes:
                self.refuse(e, OVER_MEMORY, f"{max(t.peak_bytes, t.resident_bytes)} B > {self.p.max_extra_bytes} B", t)
                return True
        best = max((t.ratio for t in known.values() if t is not None), default=0.0)
        top = self.top(known, best)
        for e in top:
            if e.name not in self.accuracy and self._leader(e, known, top) is None:
                self.check_accuracy(e)
                return True
        if self.margin != math.inf:
            for e in top:
                if known[e.name] is None:
                    self.screen(e)
                    return True
        for e in top:
            t = known[e.name]
            if t is None or t.screened:
                self.pair(e)
                return True
        return False

    @staticmethod
    def _leader(e: Entrant, known: dict[str, BookTiming | None], top: list[Entrant]) -> Entrant | None:
        """The entrant of ``e``'s precision with a higher paired ratio than ``e``'s, where both have one (None
        otherwise). Paired ratios order forms reliably, so ``e`` is not run here while its leader is live: if the
        leader passes this site's floors ``e`` cannot be picked; if it fails, it leaves and ``e`` may lead."""
        t = known[e.name]
        if t is None or t.screened:
            return None
        ahead = [o for o in top if o is not e and o.precision == e.precision and known[o.name] is not None
                 and not known[o.name].screened and known[o.name].ratio > t.ratio]
        return max(ahead, key=lambda o: known[o.name].ratio, default=None)

    def top(self, known: dict[str, BookTiming | None], best: float) -> list[Entrant]:
        return [e for e in self.live if known[e.name] is None or known[e.name].ratio * self.margin >= best]

    def result(self) -> ContestResult:
        known = {e.name: self.book.get(e.key) for e in self.live}
        best = max((t.ratio for t in known.values() if t is not None), default=0.0)
        top = self.top(known, best)
        led = [e for e in top if e.name not in self.accuracy]  # behind a faster form of their precision: not run
        top = [e for e in top if e.name in self.accuracy]
        winners = [_measurement(e, known[e.name], self.accuracy[e.name]) for e in top]
        chosen = pick(winners, self.p.min_speedup)
        for e in led:
            lead = self._leader(e, known, top + [e])
            ahead = f", behind {lead.name} at {known[lead.name].ratio:.3f}x, which passed here" if lead else ""
            self.measured.append(_measurement(e, known[e.name], None))
            self.refusals.append(Refusal(e.name, OUTRANKED, f"{known[e.name].ratio:.3f}x{ahead}; not run here"))
        for m in winners:
            if m is not chosen:
                self.refusals.append(Refusal(m.form, OUTRANKED, f"passed at {m.ratio:.3f}x but {chosen.form} "
                                                                f"({chosen.precision}) at {chosen.ratio:.3f}x was chosen"))
        measured = self.measured + winners
        for e in self.live:
            if e in top or e in led:
                continue
            t = known[e.name]
            m = _measurement(e, t, self.accuracy.get(e.name))
            measured.append(m)
            lead = max(winners, key=lambda w: w.ratio)
            unrun = "" if e.name in self.accuracy else "; not run here"
            self.refusals.append(Refusal(e.name, OUTRANKED, f"{t.ratio:.3f}x ({m.timing_text(self.site)}) more than "
                                                            f"{self.margin:g}x below {lead.form} at {lead.ratio:.3f}x"
                                                            + unrun))
        return ContestResult(chosen, tuple(measured), tuple(self.refusals))


def contest(site: str, shape_key: str, entrants: list[Entrant], host: Callable[[], torch.Tensor],
            host_out: torch.Tensor, profile: Profile, book: TimingBook, device: torch.device) -> ContestResult:
    """The verdict's measurements at one site (see the module docstring). The host's output is already made;
    nothing here changes what the caller returns."""
    c = _Contest(site, shape_key, entrants, host, host_out, profile, book, device)
    with torch.no_grad():
        c.warm()
        while c.step():
            pass
    return c.result()
