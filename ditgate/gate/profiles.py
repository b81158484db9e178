"""Profiles: a named decision about a deployment's precision, floors and speed threshold.

``quality`` (the default) allows exact forms only; ``balanced`` and ``speed`` may use bounded-error
forms within their floors. ``forms=[...]`` from the caller outranks the profile's candidate list (the
caller may name bounded forms under any profile) but never its floors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType

from ..forms import Precision, check_form_names


def scale_floor(min_call_cosine: float) -> float:
    """A per-call relative-L2 floor that a form whose error is only noise passes at the cosine floor with room to
    spare: twice sqrt(2 (1 - cosine)), the relative L2 of an output at that cosine with the host's norm. Cosine alone
    is blind to scale: an attention form returning twice the host's output has cosine 1 (and relative L2 1)."""
    return 2 * (2 * (1 - min_call_cosine)) ** 0.5  # unrounded: a cosine floor near 1 would round it to 0


@dataclass(frozen=True)
class Profile:
    name: str
    precisions: frozenset[Precision]
    min_call_cosine: float
    min_output_cosine: float
    min_output_psnr: float | None = None
    forms: tuple[str, ...] | None = None  # candidates; None: every form of an allowed precision
    min_speedup: float = 1.02
    min_whole_ratio: float = 1.0  # the whole-model check reverts routes below this (1.0: never slower)
    rounds: int = 5  # paired timing rounds per candidate and site
    whole_rounds: int = 3  # paired rounds of the whole-model check
    max_extra_bytes: int | None = None  # a form whose peak or resident memory exceeds this is refused
    # one timed call drops a form more than this factor slower than the best known (or than the speed threshold);
    # None: no screening, every candidate gets paired rounds (``contest``)
    screen_margin: float | None = 1.10
    share_timing: bool = True  # False: each site times its forms itself (the per-site gate, for comparison)
    # a per-call floor on relative L2 beside the cosine (a linear site's: its profile's linear floor,
    # ``gate.linear.LINEAR_FLOORS``); None: ``scale_floor`` of the cosine floor (``call_rel_l2_floor``)
    max_call_rel_l2: float | None = None
    # a contest's new entrants make their first calls (compiles) side by side in threads before any timing (``warm``)
    warm_ahead: bool = True
    # ...and, before that, their Triton kernels compile all at once from a dry first call (``compile_ahead``; only
    # where ``warm_ahead`` is on)
    compile_ahead: bool = True

    def __post_init__(self) -> None:
        if self.min_speedup <= 0:
            raise ValueError(f"min_speedup must be > 0, got {self.min_speedup}")
        if not 0 < self.min_call_cosine <= 1 or not 0 < self.min_output_cosine <= 1:
            raise ValueError("cosine floors must lie in (0, 1]")
        if self.rounds < 1 or self.whole_rounds < 1:
            raise ValueError("rounds must be >= 1")
        if self.screen_margin is not None and self.screen_margin < 1:
            raise ValueError(f"screen_margin must be >= 1 (or None: no screening), got {self.screen_margin}")

    @property
    def call_rel_l2_floor(self) -> float:
        """The per-call relative-L2 floor a contest applies: ``max_call_rel_l2``, else ``scale_floor`` of the
        cosine floor (so that a profile made from another with a looser cosine floor has a looser one too)."""
        return self.max_call_rel_l2 if self.max_call_rel_l2 is not None else scale_floor(self.min_call_cosine)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["precisions"] = sorted(p.value for p in self.precisions)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Profile:
        """A profile as ``to_dict`` wrote it; keys a later ditgate added are left out, so that its receipts load."""
        known = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        d["precisions"] = frozenset(Precision(p) for p in d["precisions"])
        if d.get("forms") is not None:
            d["forms"] = tuple(d["forms"])
        return cls(**d)


_EXACT = frozenset({Precision.EXACT})
_ANY = frozenset({Precision.EXACT, Precision.BOUNDED})


PROFILES = MappingProxyType(
    {
        "quality": Profile("quality", _EXACT, min_call_cosine=0.9999, min_output_cosine=0.999),
        "balanced": Profile("balanced", _ANY, min_call_cosine=0.999, min_output_cosine=0.995),
        "speed": Profile("speed", _ANY, min_call_cosine=0.99, min_output_cosine=0.98),
    }
)


class UnknownProfileError(ValueError):
    pass


def resolve_profile(profile: str | Profile, forms: tuple[str, ...] | list[str] | None = None,
                    min_speedup: float | None = None, extra_forms: tuple[str, ...] = ()) -> Profile:
    if isinstance(profile, str):
        if profile not in PROFILES:
            raise UnknownProfileError(f"unknown profile {profile!r}; known profiles: {', '.join(PROFILES)}")
        profile = PROFILES[profile]
    elif not isinstance(profile, Profile):
        raise TypeError(f"profile must be a name or a Profile, not {type(profile).__name__}")
    changes: dict = {}
    if forms is not None:
        forms = check_form_names(forms, extra_forms)
        if not forms:
            raise ValueError("forms=[] names no form; leave it out to use the profile's candidates")
        changes["forms"] = tuple(forms)
        # The caller named these forms: their precision is the caller's decision.
        changes["precisions"] = _ANY
    if min_speedup is not None:
        changes["min_speedup"] = float(min_speedup)
    return dataclasses.replace(profile, **changes) if changes else profile
