"""The static chooser: the first form, in a given order, with no reasons against the call.

Used when the caller asks for no measurement (``attach(..., measure=False)``): the order is the
caller's ``forms=[...]`` or the documented exact priority (``forms.EXACT_PRIORITY``).
"""

from __future__ import annotations

from ..forms import AttentionCall
from .site import Decision, SiteRouter


class StaticChooser:
    def __init__(self, order: tuple[str, ...]) -> None:
        self.order = order

    def decide(self, site: SiteRouter, call: AttentionCall) -> Decision:
        refusals = []
        for name in self.order:
            reasons = site.usable(name, call)
            if not reasons:
                return Decision(name)
            refusals.append(f"{name}: {reasons[0]}")
        return Decision(None, "no form serves this call (" + "; ".join(refusals) + ")")

    def measure(self, *args, **kwargs):  # never asked: decide() never returns measure=True
        raise AssertionError("the static chooser does not measure")
