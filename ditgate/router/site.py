"""Per-site dispatch: which form serves this call, with call-time fallback to the host path.

A ``SiteRouter`` is one attention call site (one module path, and the k-th attention call within one
invocation of that module's processor). For every call it asks its plan's chooser for a decision,
checks the chosen form's reasons against the call, runs it, and hands the call back to the host if the
form raises. The ledger keeps the tallies; the observer hears each distinct route once.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..forms import AttentionCall, AttentionInputs, Form, MaskKind, describe_call
from ..hosts import Convention
from .ledger import HOST, SiteLedger
from .observer import RouteEvent

logger = logging.getLogger("ditgate")

HostFn = Callable[[], torch.Tensor]
ToHostLayout = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Decision:
    """What the chooser says for one call: a form name, or the host with a reason, or measure now."""

    form: str | None
    reason: str = ""
    measure: bool = False


class Chooser(Protocol):
    def decide(self, site: SiteRouter, call: AttentionCall) -> Decision: ...

    def measure(
        self, site: SiteRouter, call: AttentionCall, inputs: AttentionInputs, host: HostFn, to_host: ToHostLayout
    ) -> torch.Tensor: ...


@dataclass
class RouterContext:
    """Everything the sites of one plan share. Owned by the plan; nothing here is module-level."""

    forms: dict[str, Form]
    chooser: Chooser
    observe: Callable[[RouteEvent], None]
    max_failures: int = 3
    tally: bool = True  # False while the plan runs its own whole-model passes: those are not user calls
    capabilities: dict[int, tuple[int, int]] = field(default_factory=dict)
    sparse: object | None = None  # the plan's SparseStage, when attach(..., sparse=...) asked for one
    padding: object | None = None  # the plan's PaddingKeys: masks that hide only padding, served without it

    def capability(self, device: torch.device) -> tuple[int, int] | None:
        if device.type != "cuda":
            return None
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self.capabilities:
            self.capabilities[index] = torch.cuda.get_device_capability(index)
        return self.capabilities[index]


class SiteRouter:
    def __init__(self, context: RouterContext, name: str, module_path: str, call_index: int, role_hint: str,
                 convention: Convention) -> None:
        self.context = context
        self.name = name
        self.module_path = module_path
        self.call_index = call_index
        self.role_hint = role_hint
        self.role: str | None = None
        self.convention = convention
        self.ledger = SiteLedger(max_failures=context.max_failures)
        self.shapes: dict[str, AttentionCall] = {}
        self._reasons: dict[tuple[str, str], tuple[str, ...]] = {}
        self._seen_routes: set[tuple] = set()

    # --- what the chooser and the gate use -------------------------------------------------------
    def reasons(self, form: Form, call: AttentionCall) -> tuple[str, ...]:
        key = (form.name, call.shape_key)
        if key not in self._reasons:
            self._reasons[key] = tuple(form.not_supported_reasons(call))
        return self._reasons[key]

    def usable(self, form_name: str, call: AttentionCall) -> tuple[str, ...]:
        """Reasons the named form cannot serve this call at this site (empty when it can)."""
        if form_name in self.ledger.disabled:
            return (self.ledger.disabled[form_name],)
        return self.reasons(self.context.forms[form_name], call)

    def prepare(self, form: Form, call: AttentionCall, inputs: AttentionInputs,
                measuring: bool = False) -> tuple[AttentionCall, AttentionInputs, str]:
        """The call and inputs ``form`` is to see, and a reason when it is to stay dense (on the host when
        serving, a refusal when measuring).

        A boolean mask that hides only the padding at the end of its call's layout (``PaddingKeys``, e.g.
        HunyuanVideo's text tail) is dropped, and every form sees the keys before the padding: the same function,
        which forms that take no mask can serve. A block-sparse form on a maskless call then gets the sparse
        stage's selection as its mask; the selection is made over the whole sequence, whose padding tiles no list
        visits. A consumer that quantizes Q and K pools them for the selector in that same pass
        (``Form.pool_for_selection``), what it made riding along as ``AttentionInputs.prepared``, except where the
        keys were cut: its pooling would have quantized the padding with the rest.
        """
        whole_key, cut, kept = inputs.key, False, "no verified layout says what the mask hides"
        padding = self.context.padding
        if call.mask is MaskKind.BOOLEAN and padding is not None:
            found, kept = padding.cut(self.name, self.module_path, inputs.query, inputs.attn_mask)
            if found is not None:
                end = found.keys
                call = dataclasses.replace(call, mask=MaskKind.NONE, seq_kv=end)
                inputs = dataclasses.replace(inputs, key=inputs.key[:, :, :end], value=inputs.value[:, :, :end],
                                             attn_mask=None, zero_rows_from=end if found.zero_rows else None)
                cut = True
        if form.spec.takes_selection and call.mask is MaskKind.BOOLEAN:
            return call, inputs, f"sparse: a masked call stays dense ({kept})"
        if not form.spec.takes_selection or call.mask is not MaskKind.NONE:
            return call, inputs, ""
        stage = self.context.sparse
        if stage is None:
            return call, inputs, "no sparse setting on this plan (attach(..., sparse=SparseSetting(...)))"
        block = stage.setting.block
        rows = form.selection_rows(call, block)
        pool = None if cut else (lambda: form.pool_for_selection(call, inputs, rows or block, block))
        sel = stage.selection(self.name, self.module_path, self.role or self.role_hint, inputs.query, whole_key,
                              measuring, rows=rows, pool=pool)
        if sel.lists is None:
            return call, inputs, f"sparse: {sel.reason}"
        return (dataclasses.replace(call, mask=MaskKind.BLOCK),
                dataclasses.replace(inputs, attn_mask=sel.lists, prepared=sel.prepared), "")

    # --- the call path ---------------------------------------------------------------------------
    def _observe(self, call: AttentionCall, route: str, reason: str) -> None:
        key = (route, reason, call.shape_key)
        if key in self._seen_routes:
            return
        self._seen_routes.add(key)
        self.context.observe(
            RouteEvent(self.name, self.role or self.role_hint, route, reason, call.shapes_text(), call.dtype,
                       call.mask.value)
        )

    def host_only(self, reason: str, host: HostFn) -> torch.Tensor:
        if self.context.tally:
            self.ledger.hosted(reason)
        return host()

    def serve(self, inputs: AttentionInputs, host: HostFn, to_host: ToHostLayout) -> torch.Tensor:
        q, k, v = inputs.query, inputs.key, inputs.value
        call = describe_call(q, k, v, inputs.attn_mask, inputs.dropout_p, inputs.is_causal, inputs.enable_gqa,
                             self.context.capability(q.device))
        if self.role is None:
            self.role = "cross" if call.seq_q != call.seq_kv else self.role_hint
        self.shapes.setdefault(call.shape_key, call)
        decision = self.context.chooser.decide(self, call)
        if decision.measure:
            if self.context.tally:
                self.ledger.hosted("calibrating")
            self._observe(call, HOST, "calibrating")
            return self.context.chooser.measure(self, call, inputs, host, to_host)
        if decision.form is None:
            return self._host(call, decision.reason, host)
        form = self.context.forms[decision.form]
        try:  # the selection and the padding cut run the form's own code too (its pooling)
            call, inputs, dense = self.prepare(form, call, inputs)
        except Exception as exc:  # never fail a call the host could serve
            return self._failed(form, exc, call, host)
        if dense:
            return self._host(call, dense, host)
        blocked = self.usable(decision.form, call)
        if blocked:
            return self._host(call, f"{decision.form}: {blocked[0]}", host)
        try:
            out = inputs.finish(form.run(inputs))
        except Exception as exc:  # never fail a call the host could serve
            return self._failed(form, exc, call, host)
        if self.context.tally:
            self.ledger.served(form.name)
        self._observe(call, form.name, "")
        return to_host(out)

    def _failed(self, form: Form, exc: Exception, call: AttentionCall, host: HostFn) -> torch.Tensor:
        """The host serves a call its form raised on; the ledger counts it and, past its limit, disables the form."""
        if self.ledger.failed(form.name, exc):
            logger.warning("ditgate: %s: form %s %s; the host serves this site from now on",
                           self.name, form.name, self.ledger.disabled[form.name])
        return self._host(call, f"{form.name} raised", host)

    def _host(self, call: AttentionCall, reason: str, host: HostFn) -> torch.Tensor:
        if self.context.tally:
            self.ledger.hosted(reason)
        self._observe(call, HOST, reason)
        return host()
