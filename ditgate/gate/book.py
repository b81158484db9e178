"""The timing book: what is known of each form's speed at each shape key, shared by every site of a plan.

Speed is a property of (form, shape, device), not of the site: thirty identical blocks run the same kernels on
tensors of the same shape, so timing a form thirty times buys nothing. A plan keeps one ``TimingBook``; the first
site that needs a form's speed at a shape key times it, and every later site with that key reads the entry. An entry
is either a screening timing (a few calls timed alone: cheap, noisy: enough to drop a form that cannot win) or paired interleaved rounds (what
a verdict rests on). Accuracy is never in the book: it is a property of the site and is checked on each site's own
input (``contest``).

Where a ``TimingCache`` backs the book, an entry missing in this process is looked up in the cache file under the
environment's key (GPU, driver, torch, form versions), and what this process measured is written back by ``flush``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .cache import TimingCache
from .timing import Timing
from .whole_memo import RememberedCheck


@dataclass(frozen=True)
class TimingKey:
    """What a form's time depends on: the form, the call's shape key, and what else changes the work (``variant``:
    the keys a padding cut leaves, a sparse selection's budget, the host's calling convention)."""

    form: str
    shape_key: str
    variant: str = ""

    def text(self) -> str:
        return f"{self.form}|{self.shape_key}|{self.variant}"


@dataclass(frozen=True)
class BookTiming:
    """One form's speed against the host at one key: host time over form time (> 1: the form is faster)."""

    ratio: float
    ratio_min: float
    ratio_max: float
    host_ms: float
    form_ms: float
    screened: bool  # True: a screening timing (timed alone); False: paired interleaved rounds
    rounds: int
    peak_bytes: int = 0  # memory is a property of the shape too: measured with the paired rounds
    resident_bytes: int = 0
    site: str = ""  # the site it was timed at
    # the form's first call at this key (compiles, loads, autotuning): what warming it cost; where first calls ran
    # side by side (``gate.warm``), its own wall time in that overlap
    first_ms: float = 0.0
    from_cache: bool = False

    @classmethod
    def paired(cls, timing: Timing, peak_bytes: int, resident_bytes: int, site: str, first_ms: float) -> BookTiming:
        return cls(timing.ratio, timing.ratio_min, timing.ratio_max, timing.host_ms, timing.form_ms, False,
                   timing.rounds, peak_bytes, resident_bytes, site, first_ms)

    @classmethod
    def screening(cls, host_ms: float, form_ms: float, site: str, first_ms: float) -> BookTiming:
        ratio = host_ms / max(form_ms, 1e-9)
        return cls(ratio, ratio, ratio, host_ms, form_ms, True, 1, site=site, first_ms=first_ms)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("from_cache")
        return d

    @classmethod
    def from_dict(cls, d: dict) -> BookTiming:
        names = {f.name for f in dataclasses.fields(cls)} - {"from_cache"}
        return cls(**{k: d[k] for k in names if k in d}, from_cache=True)


class TimingBook:
    """Per plan: ``TimingKey`` -> ``BookTiming``. ``cache`` (optional) is read on a miss and written by ``flush``."""

    def __init__(self, cache: TimingCache | None = None, environment: dict | None = None) -> None:
        self.cache = cache
        self.environment = environment or {}
        self._entries: dict[TimingKey, BookTiming] = {}
        self._unsaved: dict[TimingKey, BookTiming] = {}
        self._checks: dict[str, RememberedCheck] = {}  # whole-model checks this process passed, to be saved
        self._cached: dict[str, dict] | None = None
        self.timed = 0  # timings this book made itself (screening calls and paired runs), for progress and tests
        self.cache_hits = 0
        self.spent_s: dict[str, float] = {}  # form -> seconds its contests took (first calls, accuracy, timing)

    def _cached_entry(self, text: str) -> dict | None:
        if self.cache is None:
            return None
        if self._cached is None:
            self._cached = self.cache.load(self.environment)
        return self._cached.get(text)

    def get(self, key: TimingKey) -> BookTiming | None:
        found = self._entries.get(key)
        if found is not None or self.cache is None:
            return found
        raw = self._cached_entry(key.text())
        if raw is None:
            return None
        try:
            found = BookTiming.from_dict(raw)
        except (TypeError, ValueError):  # an entry of another shape: ignored like a miss
            return None
        self._entries[key] = found
        self.cache_hits += 1
        return found

    def put(self, key: TimingKey, timing: BookTiming) -> None:
        self._entries[key] = timing
        self._unsaved[key] = timing
        self.timed += 1

    def spend(self, form: str, seconds: float) -> None:
        self.spent_s[form] = self.spent_s.get(form, 0.0) + seconds

    def remembered_check(self, key: str) -> RememberedCheck | None:
        """A whole-model check another process passed under ``key`` (``whole_memo.check_key``), from the cache."""
        raw = self._checks.get(key) or self._cached_entry(key)
        if raw is None or isinstance(raw, RememberedCheck):
            return raw
        try:
            return RememberedCheck.from_dict(raw)
        except (TypeError, ValueError, KeyError):  # an entry of another shape: ignored like a miss
            return None

    def remember_check(self, key: str, check: RememberedCheck) -> None:
        self._checks[key] = check

    def flush(self) -> None:
        """Write what this process measured to the cache (if any); a failure to write is logged by the cache."""
        if self.cache is None or not (self._unsaved or self._checks):
            return
        entries = {k.text(): t.to_dict() for k, t in self._unsaved.items()}
        entries.update({k: c.to_dict() for k, c in self._checks.items()})
        self.cache.save(self.environment, entries)
        self._unsaved.clear()
        self._checks.clear()

    def __len__(self) -> int:
        return len(self._entries)
