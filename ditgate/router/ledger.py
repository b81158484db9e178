"""Per-site counts: which form served how many calls, which fell back to the host and why."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

HOST = "host"


@dataclass(frozen=True)
class RouteCount:
    route: str  # a form name, or "host"
    reason: str  # for host routes: why the host served it
    calls: int


@dataclass(frozen=True)
class FailureCount:
    form: str
    failures: int
    last_error: str
    disabled: bool


@dataclass
class SiteLedger:
    """Mutable tallies owned by one site of one plan (never shared, gone with the plan)."""

    max_failures: int = 3
    routes: Counter = field(default_factory=Counter)  # (route, reason) -> calls
    failures: Counter = field(default_factory=Counter)  # form -> failures
    last_error: dict[str, str] = field(default_factory=dict)
    disabled: dict[str, str] = field(default_factory=dict)
    # routes baked into torch.compile graphs: (route, reason) -> traces. Calls a compiled graph serves run no
    # Python of ours, so they are not counted in ``routes``; each trace that compiled a route in is.
    traces: Counter = field(default_factory=Counter)
    # the same, for the traces made since the plan's generation last changed (``RouterContext.generation``): what the
    # graphs of the current routes hold, where ``traces`` keeps every route any graph held since attach
    current_traces: Counter = field(default_factory=Counter)
    trace_generation: int | None = None

    def served(self, form: str) -> None:
        self.routes[(form, "")] += 1

    def hosted(self, reason: str) -> None:
        self.routes[(HOST, reason)] += 1

    def traced(self, route: str, reason: str, generation: int | None = None) -> None:
        self.traces[(route, reason)] += 1
        if generation != self.trace_generation:
            self.current_traces.clear()
            self.trace_generation = generation
        self.current_traces[(route, reason)] += 1

    def failed(self, form: str, error: BaseException) -> bool:
        """Count a call-time failure; True when this failure disables the form for the site."""
        self.failures[form] += 1
        self.last_error[form] = f"{type(error).__name__}: {error}"[:500]
        if self.failures[form] >= self.max_failures and form not in self.disabled:
            self.disabled[form] = f"disabled after {self.failures[form]} failures; last: {self.last_error[form]}"
            return True
        return False

    def route_counts(self) -> tuple[RouteCount, ...]:
        return tuple(RouteCount(r, why, n) for (r, why), n in sorted(self.routes.items(), key=lambda kv: -kv[1]))

    def trace_counts(self) -> tuple[RouteCount, ...]:
        """Like ``route_counts``, with ``calls`` the number of compiled graphs that traced the route."""
        return tuple(RouteCount(r, why, n) for (r, why), n in sorted(self.traces.items(), key=lambda kv: -kv[1]))

    def current_trace_counts(self) -> tuple[RouteCount, ...]:
        """``trace_counts`` of the traces since the plan's generation last changed."""
        return tuple(RouteCount(r, why, n)
                     for (r, why), n in sorted(self.current_traces.items(), key=lambda kv: -kv[1]))

    def failure_counts(self) -> tuple[FailureCount, ...]:
        return tuple(
            FailureCount(f, n, self.last_error.get(f, ""), f in self.disabled) for f, n in self.failures.items()
        )

    @property
    def calls(self) -> int:
        return sum(self.routes.values())

    @property
    def fallbacks(self) -> int:
        return sum(self.failures.values())
