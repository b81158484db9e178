"""The gate's records: a verdict per site and shape key, and the reason every other form stepped aside."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# Kinds of refusal, each with a reason a person can read.
UNAVAILABLE = "unavailable"
UNSUPPORTED = "not supported"
NOT_ALLOWED = "not allowed"
SLOWER = "slower"
LESS_ACCURATE = "less accurate"
RAISED = "raised"
OVER_MEMORY = "over memory"
OUTRANKED = "outranked"
REVERTED = "reverted"


@dataclass(frozen=True)
class Refusal:
    form: str
    kind: str
    detail: str

    def text(self) -> str:
        return f"{self.form}: {self.kind} ({self.detail})"


@dataclass(frozen=True)
class Measurement:
    """One candidate measured at one site and shape."""

    form: str
    precision: str
    ratio: float
    ratio_min: float
    ratio_max: float
    host_ms: float
    form_ms: float
    cosine: float
    rel_l2: float
    peak_bytes: int
    resident_bytes: int
    # how the ratio was timed: paired rounds (1 with ``screened``: a single screening call), at which site (speed
    # is shared by every site with the shape key), and whether it came from the timing cache of an earlier process.
    # ``cosine`` and ``rel_l2`` are this site's own; NaN where the form was not run here (it could not win on the
    # shared timing, so its accuracy was not needed)
    rounds: int = 0
    screened: bool = False
    timed_at: str = ""
    from_cache: bool = False
    first_ms: float = 0.0  # its first call at this shape key (compiles, loads): what warming it up cost, once

    def timing_text(self, here: str) -> str:
        kind = "screening timing" if self.screened else f"{self.rounds} paired rounds"
        if self.from_cache:
            return f"{kind}, from the timing cache"
        return f"{kind}, " + ("timed here" if not self.timed_at or self.timed_at == here else f"shared from {self.timed_at}")


@dataclass(frozen=True)
class Verdict:
    site: str
    shape_key: str
    form: str | None  # None: the host serves this site at this shape
    source: str  # "measured" | "receipt" | "reverted" | "shared" (budget spent: another site's verdict) | "budget"
    chosen: Measurement | None
    measured: tuple[Measurement, ...]
    refusals: tuple[Refusal, ...]
    note: str = ""

    @property
    def summary(self) -> str:
        if self.form is not None and self.chosen is not None:
            c = self.chosen
            return (f"{self.form} {c.ratio:.2f}x [{c.ratio_min:.2f}-{c.ratio_max:.2f}] cos {c.cosine:.6f} "
                    f"({c.timing_text(self.site)})")
        if self.note:
            return f"host: {self.note}"
        return "host: " + ("; ".join(r.text() for r in self.refusals) or "no candidate")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Verdict:
        chosen = Measurement(**d["chosen"]) if d.get("chosen") else None
        return cls(
            site=d["site"],
            shape_key=d["shape_key"],
            form=d["form"],
            source=d["source"],
            chosen=chosen,
            measured=tuple(Measurement(**m) for m in d.get("measured", ())),
            refusals=tuple(Refusal(**r) for r in d.get("refusals", ())),
            note=d.get("note", ""),
        )


@dataclass(frozen=True)
class WholeModelCheck:
    """The model run once more with the chosen routes against the host, after all sites settled."""

    model: str
    host_ms: float
    routed_ms: float
    ratio: float
    ratio_min: float
    ratio_max: float
    cosine: float
    psnr_db: float
    passed: bool
    attempts: int
    reverted: tuple[str, ...]  # "site @ shape_key" of every route the check took back
    note: str
    forwards: int = 0  # forwards the check ran (passing: host and routed, a timed pass more where some routes' speed is
    # judged at their sites; one routed on a replay)
    seconds: float = 0.0  # wall time of the check
    from_cache: bool = False  # its timing replayed from the timing cache (``whole_memo``), its output checked here
