"""Per-site dispatch: the chosen form if it can serve the call, otherwise the host; ledger; observer."""

from .ledger import HOST, FailureCount, RouteCount, SiteLedger
from .module import ModuleRouter
from .observer import RouteEvent, make_observer
from .site import Chooser, Decision, RouterContext, SiteRouter
from .static import StaticChooser

__all__ = [
    "HOST",
    "Chooser",
    "Decision",
    "FailureCount",
    "ModuleRouter",
    "RouteCount",
    "RouteEvent",
    "RouterContext",
    "SiteLedger",
    "SiteRouter",
    "StaticChooser",
    "make_observer",
]
