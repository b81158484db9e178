"""The whole-model check's timing, remembered in the timing cache for a second process.

The check costs a host forward and a routed forward. What it learns about speed (the routed whole over the host
whole, and which routes it had to take back) is, like a form's timing, a property of the environment, the model, the
input shapes and the routes, not of the process. So a passing check is remembered in the timing cache under a key
of all of these, and a later process that reaches the same routes for the same model and inputs replays it: it
takes back what the check took back, and runs one routed forward whose output it compares with the calibrating
forward's own output (the host served every call of that forward, so it is the host's output for these inputs).
Accuracy is checked in every process; only the timing is shared. A replay whose output misses the profile's
floors falls back to the full check.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from .profiles import Profile
from .verdict import Verdict, WholeModelCheck

PREFIX = "whole|"  # entries of the timing cache that are whole-model checks (a form's key starts with its name)
# the rules a remembered check was judged by, in its key: a check of other rules is not replayed. 2: a compiled plan's
# linear routes judged at their sites, not in the check's timed pass (a check under 1 took them back when eager
# forwards were slow, and replaying it would take them back again); 3: every linear route of a compiled plan judged
# at its site, and an output below the floors taking back the routes least accurate at their sites first (a check
# under 2 took them back smallest gain first)
CHECK_RULES = 3


@dataclass(frozen=True)
class RememberedCheck:
    """What a passing whole-model check measured, enough to replay it."""

    ratio: float
    ratio_min: float
    ratio_max: float
    host_ms: float
    routed_ms: float
    reverted: tuple[str, ...]  # "site @ shape_key" of the routes it took back
    why: str  # why it took them back ("" when it took none)
    measured: str  # when (UTC, ISO 8601)

    @classmethod
    def of(cls, check: WholeModelCheck, when: str) -> RememberedCheck:
        return cls(check.ratio, check.ratio_min, check.ratio_max, check.host_ms, check.routed_ms, check.reverted,
                   check.note if check.reverted else "", when)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["reverted"] = list(self.reverted)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> RememberedCheck:
        names = {f.name for f in dataclasses.fields(cls)}
        if not names <= set(d):
            raise ValueError(f"a remembered whole-model check lacks {sorted(names - set(d))}")
        return cls(**{**{k: d[k] for k in names}, "reverted": tuple(d["reverted"])})


def _signature(value) -> object:
    """What of a forward's argument the check's timing depends on: a tensor's shape, dtype and device, a plain
    value as it is, containers element by element."""
    if isinstance(value, torch.Tensor):
        return ["tensor", list(value.shape), str(value.dtype), value.device.type]
    if isinstance(value, (list, tuple)):
        return [_signature(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _signature(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return type(value).__name__


def check_key(model: torch.nn.Module, args: tuple, kwargs: dict, profile: Profile, sparse: str,
              routes: Iterable[Verdict]) -> str:
    """The cache key of one whole-model check: the model's class and config, the forward's argument shapes, the
    profile, the sparse setting and the routes it starts from (site, shape key, form)."""
    config = getattr(model, "config", None)
    # diffusers' private keys are bookkeeping, and one of them (``_use_default_values``) is a set turned into a list:
    # its order changes from one process to the next
    public = {k: v for k, v in dict(config).items() if not str(k).startswith("_")} if config is not None else None
    body = {
        "model": type(model).__name__,
        "config": public,
        "args": _signature(list(args)),
        "kwargs": _signature(kwargs),
        # how calibration warms its forms up changes no rule a check is judged by
        "profile": {k: v for k, v in profile.to_dict().items() if k not in ("warm_ahead", "compile_ahead")},
        "sparse": sparse,
        "routes": sorted(f"{v.site} @ {v.shape_key} -> {v.form}" for v in routes),
        "rules": CHECK_RULES,
    }
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:32]
    return PREFIX + digest
