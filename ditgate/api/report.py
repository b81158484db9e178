"""The typed record of a plan: sites, routes, counts, fallbacks, verdicts (JSON-serialisable)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from ..forms import FormInfo
from ..gate import Verdict, WholeModelCheck
from ..router import FailureCount, RouteCount


@dataclass(frozen=True)
class SiteRecord:
    name: str
    module: str
    role: str
    call_index: int
    convention: str
    shapes: tuple[str, ...]
    calls: int
    serving: str  # the route that served most calls (a form name, "host"), or "-" before any call
    routes: tuple[RouteCount, ...]
    failures: tuple[FailureCount, ...]
    verdicts: tuple[Verdict, ...]
    # routes torch.compile traced into graphs, ``calls`` counting traces: calls a compiled graph serves are not
    # counted in ``calls`` / ``routes`` (no Python of ours runs for them)
    compiled: tuple[RouteCount, ...] = ()


@dataclass(frozen=True)
class SkippedModule:
    """An attention module ditgate found but could not intercept, with the reason."""

    path: str
    reason: str


@dataclass(frozen=True)
class SparseRecord:
    """The sparse stage of a plan: its setting, and per denoiser the token layouts its last forward declared."""

    setting: str
    layouts: tuple[tuple[str, str], ...]  # (denoiser, its layouts in words, or why it has none)


@dataclass(frozen=True)
class LinearSiteRecord:
    """One linear site: what served its calls, its verdicts, and the bytes it holds on its device before and after."""

    name: str
    role: str
    shapes: tuple[str, ...]
    calls: int
    serving: str
    routes: tuple[RouteCount, ...]
    failures: tuple[FailureCount, ...]
    verdicts: tuple[Verdict, ...]
    weights: str  # the form whose 8-bit weights the module holds, or "host"
    bytes_before: int  # weight and bias on the module's device at attach
    bytes_now: int  # what the site holds there now (8-bit weights and scales, bias, the host weight if still there)
    aside: bool = False  # the host won every shape: the module runs its own forward again, its calls uncounted
    # calls whose input went past the scale a delayed-scaling form had for them, or held an inf or a NaN
    # (``forms.linear_delayed``)
    clamped_calls: int = 0


@dataclass(frozen=True)
class LinearRecord:
    """The linear sites of a plan, and their resident bytes in all."""

    keep_host: str  # where a quantized site's host weight waits for detach: "cpu" (pinned) or "device"
    sites: tuple[LinearSiteRecord, ...]
    bytes_before: int
    bytes_now: int
    # why the plan timed its sites eagerly although its setting asked for device time (``LinearSetting.device_time``):
    # the capture error of the first site whose host product could not be captured in a CUDA graph, which names it;
    # that site and every later one were timed eagerly (a receipt keeps it as ``linear_device_time_off``)
    device_time_off: str = ""
    # linear modules of the routed roles that the plan left to the host, with why (``hosts.linears.left_alone``: an
    # offloading hook, a LoRA fused into the weight, a DoRA adapter)
    left_alone: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PlanReport:
    ditgate_version: str
    mode: str  # "measured" | "static" | "receipt"
    profile: dict | None
    order: tuple[str, ...]  # static order, or the gate's candidates in precision-first order
    forms: tuple[FormInfo, ...]
    sites: tuple[SiteRecord, ...]
    skipped: tuple[SkippedModule, ...]
    whole_model: tuple[WholeModelCheck, ...]
    environment: dict
    detached: bool
    sparse: SparseRecord | None = None
    linear: LinearRecord | None = None
    # (form, heads) where a one-read quantization re-quantized heads whose carried statistics did not hold
    repaired_heads: tuple[tuple[str, int], ...] = ()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json())
        return path

    def routed_sites(self, form: str) -> list[SiteRecord]:
        return [s for s in self.sites if s.serving == form]
