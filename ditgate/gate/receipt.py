"""Receipts: the saved verdicts with the environment they were measured in, and a content hash.

Loading a receipt re-applies its routes without measuring when the environment matches; when it does
not, loading refuses with the differences (or, when asked, the sites are measured again). The context
parallelism of each denoiser is part of that environment: routes measured on a rank's heads (Ulysses) or key
chunks (ring) hold for that configuration alone, so a receipt measured under one is refused under another, or
without any.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from .env import differences
from .profiles import Profile
from .verdict import Verdict, WholeModelCheck

RECEIPT_VERSION = 1


class ReceiptError(ValueError):
    pass


class ReceiptMismatchError(ReceiptError):
    def __init__(self, diffs: list[str]) -> None:
        self.differences = diffs
        super().__init__("receipt was measured in another environment:\n  " + "\n  ".join(diffs)
                         + "\n(attach(..., receipt=path, on_mismatch='measure') measures again)")


@dataclass(frozen=True)
class Receipt:
    environment: dict
    models: dict  # component name -> {"class": ..., "sites": n}
    profile: Profile
    verdicts: tuple[Verdict, ...]
    whole_model: tuple[WholeModelCheck, ...]
    created: str
    # denoiser name -> its context parallelism (``hosts.parallel.ContextParallel.record``), for those that have one
    parallel: dict = field(default_factory=dict)
    # linear site -> the largest input absmax its form saw (``forms.linear_delayed``'s history): a plan re-applied
    # from the receipt starts there, so its compiled calls need no eager forward first
    linear_histories: dict = field(default_factory=dict)
    # why a plan that asked to time its linear sites on the device timed them eagerly (its verdicts' timing keys say
    # which), or "": a receipt re-applied elsewhere says what its linear verdicts were measured as
    linear_device_time_off: str = ""

    def payload(self) -> dict:
        return {
            "receipt_version": RECEIPT_VERSION,
            "created": self.created,
            "environment": self.environment,
            "models": self.models,
            "profile": self.profile.to_dict(),
            "verdicts": [v.to_dict() for v in self.verdicts],
            "whole_model": [w.__dict__ for w in self.whole_model],
            "parallel": self.parallel,
            "linear_histories": self.linear_histories,
            **({"linear_device_time_off": self.linear_device_time_off} if self.linear_device_time_off else {}),
        }

    def to_json(self) -> str:
        payload = self.payload()
        payload["sha256"] = content_hash(payload)
        return json.dumps(payload, indent=2, sort_keys=True, default=_jsonable)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json())
        return path

    def check_environment(self, current_env: dict, current_models: dict,
                          current_parallel: dict | None = None) -> list[str]:
        """Differences from here; ``current_parallel``: each context-parallel denoiser's record here (none: none)."""
        diffs = differences(self.environment, current_env)
        here = current_parallel or {}
        for name in sorted(set(self.parallel) | set(here)):
            if self.parallel.get(name) != here.get(name):
                diffs.append(f"context parallelism of {name or '(model)'}: receipt "
                             f"{_parallel_text(self.parallel.get(name))}, here {_parallel_text(here.get(name))}")
        for name, rec in self.models.items():
            here = current_models.get(name)
            if here != rec:
                diffs.append(f"model {name or '(model)'}: receipt {rec}, here {here}")
        for name in set(current_models) - set(self.models):
            diffs.append(f"model {name or '(model)'}: not in the receipt")
        return diffs


def _parallel_text(record: dict | None) -> str:
    if not record:
        return "none"
    return ", ".join(f"{k}={v}" for k, v in sorted(record.items()))


def _jsonable(x):
    if isinstance(x, float):
        return x
    if isinstance(x, (set, frozenset, tuple)):
        return list(x)
    return str(x)


def content_hash(payload: dict) -> str:
    body = {k: v for k, v in payload.items() if k != "sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=_jsonable)
    return hashlib.sha256(text.encode()).hexdigest()


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def load_receipt(path: str | Path) -> Receipt:
    try:
        payload = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ReceiptError(f"cannot read receipt {path}: {exc}") from exc
    if payload.get("receipt_version") != RECEIPT_VERSION:
        raise ReceiptError(f"receipt {path} has version {payload.get('receipt_version')}, expected {RECEIPT_VERSION}")
    # Hash over the JSON-normalised body (what was written), so floats and lists compare as saved.
    if payload.get("sha256") != content_hash(payload):
        raise ReceiptError(f"receipt {path} failed its content hash: it was changed after it was written")
    return Receipt(
        environment=payload["environment"],
        models=payload["models"],
        profile=Profile.from_dict(payload["profile"]),
        verdicts=tuple(Verdict.from_dict(v) for v in payload["verdicts"]),
        whole_model=tuple(WholeModelCheck(**{**w, "reverted": tuple(w["reverted"])}) for w in payload["whole_model"]),
        created=payload["created"],
        parallel=payload.get("parallel", {}),
        linear_histories=payload.get("linear_histories", {}),
        linear_device_time_off=payload.get("linear_device_time_off", ""),
    )
