"""The route observer: each distinct route of a site reported once (site, role, form, shapes, dtype, mask).

By default routes go to the ``ditgate.routes`` logger at debug level. Setting ``DITGATE_LOG_ROUTES=1``
also prints them to stderr, and ``attach(..., on_route=fn)`` hands each event to ``fn``.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger("ditgate.routes")


@dataclass(frozen=True)
class RouteEvent:
    site: str
    role: str
    route: str
    reason: str
    shapes: str
    dtype: str
    mask: str

    def text(self) -> str:
        why = f" ({self.reason})" if self.reason else ""
        return f"{self.site} [{self.role}] -> {self.route}{why}: {self.shapes} {self.dtype} mask={self.mask}"


def make_observer(callback: Callable[[RouteEvent], None] | None = None) -> Callable[[RouteEvent], None]:
    to_stderr = os.environ.get("DITGATE_LOG_ROUTES", "").lower() not in ("", "0", "false", "no")

    def observe(event: RouteEvent) -> None:
        logger.debug("route %s", event.text())
        if to_stderr:
            print(f"ditgate route: {event.text()}", file=sys.stderr)
        if callback is not None:
            callback(event)

    return observe
