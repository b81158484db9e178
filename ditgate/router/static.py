"""The static chooser: the first form, in a given order, with no reasons against the call.

Used when the caller asks for no measurement (``attach(..., measure=False)``): the order is the
caller's ``forms=[...]`` or the documented exact priority (``forms.EXACT_PRIORITY``). A block-sparse
form is judged on the call as the sparse stage will hand it over (with key-block lists); a call the
stage keeps dense then goes to the host with the stage's reason.
"""

from __future__ import annotations

import dataclasses

from ..forms import AttentionCall, MaskKind
from .site import Decision, SiteRouter


class StaticChooser:
    def __init__(self, order: tuple[str, ...]) -> None:
        self.order = order

    def decide(self, site: SiteRouter, call: AttentionCall) -> Decision:
        refusals = []
        padded = call.mask is MaskKind.BOOLEAN and site.context.padding is not None and \
            site.context.padding.covers_path(site.module_path)  # the mask may be dropped at serve time
        for name in self.order:
            probe = call
            takes_selection = site.context.forms[name].spec.takes_selection
            if takes_selection and (call.mask is MaskKind.NONE or padded) and site.context.sparse is not None:
                probe = dataclasses.replace(call, mask=MaskKind.BLOCK)  # the stage selects at serve time, or says why
            elif padded:
                probe = dataclasses.replace(call, mask=MaskKind.NONE)
            reasons = site.usable(name, probe)
            if not reasons:
                return Decision(name)
            refusals.append(f"{name}: {reasons[0]}")
        return Decision(None, "no form serves this call (" + "; ".join(refusals) + ")")

    def measure(self, *args, **kwargs):  # never asked: decide() never returns measure=True
        raise AssertionError("the static chooser does not measure")
