"""Per-site dispatch: which form serves this call, with call-time fallback to the host path.

A ``SiteRouter`` is one attention call site (one module path, and the k-th attention call within one
invocation of that module's processor). The first call of each signature (raw shapes, dtype, device, mask,
flags) since the plan's generation last changed asks the plan's chooser for a decision and checks the chosen
form's reasons; the resolved route (``routes``) then serves every call of that signature with a dictionary
lookup, handing the call back to the host if the form raises. The ledger keeps the tallies; the observer hears
each distinct route once. Inside a torch.compile trace the site's stand-in (``traced.TracedSite``) asks
``resolve_traced`` instead, once, at trace time.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..forms import AttentionCall, AttentionInputs, Form, MaskKind
from ..hosts import Convention
from .ledger import HOST, SiteLedger
from .observer import RouteEvent
from .routes import (CallArgs, FormRoute, HostFn, HostRoute, MeasureRoute, PreparedRoute, Route, SelectedRoute,
                     ToHostLayout, call_of, signature)

logger = logging.getLogger("ditgate")

# why a route resolved inside a torch.compile trace went to the host
NOT_MEASURED_IN_GRAPH = "first seen inside a compiled graph, where nothing is measured; the host serves it (a call " \
    "at this shape outside the graph, or plan.calibrate(), measures it and recompiles)"
PADDING_NOT_IN_GRAPH = "inside a compiled graph the padding mask is kept: where it ends is data"


@dataclass(frozen=True)
class Decision:
    """What the chooser says for one call: a form name, or the host with a reason, or measure now."""

    form: str | None
    reason: str = ""
    measure: bool = False


class Chooser(Protocol):
    """``decide`` may depend only on the site, the call and the chooser's state; whenever that state changes
    (a verdict stored or reverted, a mode), the chooser's ``generation`` (an int attribute; a chooser without
    one never changes) must change too, since routes are kept per call signature until it does."""

    def decide(self, site: SiteRouter, call: AttentionCall) -> Decision: ...

    def measure(
        self, site: SiteRouter, call: AttentionCall, inputs: AttentionInputs, host: HostFn, to_host: ToHostLayout
    ) -> torch.Tensor: ...


_PLAN_SERIALS = itertools.count(1)  # a counter, not a cache: each plan's context takes the next number


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
    invalidations: int = 0  # bumped by ``invalidate``
    # this plan among the process's plans: two plans' generations never meet, so a graph traced under one plan is
    # never reused under another that happens to have counted as far
    serial: int = field(default_factory=lambda: next(_PLAN_SERIALS))

    @property
    def generation(self) -> int:
        """Changes whenever a route resolved before may no longer hold: the chooser's own ``generation`` (a new
        verdict, a new mode) plus this plan's invalidations (a disabled form, detach), above this plan's serial.
        Sites drop their routes when it changes, and compiled graphs, which guard on it, recompile."""
        return (self.serial << 40) + self.invalidations + getattr(self.chooser, "generation", 0)

    def invalidate(self) -> None:
        self.invalidations += 1

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
        self._routes: dict[tuple, Route] = {}  # call signature -> route, for the generation below
        self._generation = -1
        self.resolved = 0  # routes resolved (cache misses): what a test of the hot path counts

    # --- what the chooser and the gate use -------------------------------------------------------
    def reasons(self, form: Form, call: AttentionCall, probe: bool = True) -> tuple[str, ...]:
        key = (form.name, call.shape_key, probe)
        if key not in self._reasons:
            self._reasons[key] = tuple(form.not_supported_reasons(call, probe))
        return self._reasons[key]

    def usable(self, form_name: str, call: AttentionCall, probe: bool = True) -> tuple[str, ...]:
        """Reasons the named form cannot serve this call at this site (empty when it can); ``probe=False``: its
        declared envelope only (``Form.not_supported_reasons``)."""
        if form_name in self.ledger.disabled:
            return (self.ledger.disabled[form_name],)
        return self.reasons(self.context.forms[form_name], call, probe)

    def disable(self, form_name: str, reason: str) -> None:
        """Keep ``form_name`` off this site from now on, with the reason (routes resolved before are dropped)."""
        if form_name not in self.ledger.disabled:
            self.ledger.disabled[form_name] = reason
            self.context.invalidate()

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
    def observe(self, call: AttentionCall, route: str, reason: str) -> None:
        key = (route, reason, call.shape_key)
        if key in self._seen_routes:
            return
        self._seen_routes.add(key)
        self.context.observe(
            RouteEvent(self.name, self.role or self.role_hint, route, reason, call.shapes_text(), call.dtype,
                       call.mask.value)
        )

    def host_only(self, reason: str, host: HostFn) -> torch.Tensor:
        """A call no form may take (context-parallel, backend arguments, not 4-D): the host, counted."""
        if self.context.tally:
            self.ledger.hosted(reason)
        return host()

    def serve(self, args: CallArgs, host: HostFn, to_host: ToHostLayout) -> torch.Tensor:
        """Serve one call by the route its signature resolved to (resolved on the first call of the signature
        since the plan's generation last changed). Inside a torch.compile trace the route is resolved at trace
        time and traced instead (``traced.TracedSite``)."""
        sig = signature(args)
        generation = self.context.generation
        if generation != self._generation:
            self._routes.clear()
            self._generation = generation
        route = self._routes.get(sig)
        if route is None:
            route = self._resolve(sig, compiling=False)
            if route.keep:
                self._routes[sig] = route
        return route.serve(self, args, host, to_host)

    def _resolve(self, sig: tuple, compiling: bool) -> Route:
        """The route of a signature: the chooser's decision, checked against the form's reasons."""
        call = call_of(sig, self.context.capability(sig[4]))
        self.resolved += 1
        if self.role is None:
            self.role = "cross" if call.seq_q != call.seq_kv else self.role_hint
        self.shapes.setdefault(call.shape_key, call)
        decision = self.context.chooser.decide(self, call)
        if decision.measure:
            if not compiling:
                return MeasureRoute(call)
            decision = Decision(None, f"{NOT_MEASURED_IN_GRAPH} at {call.shape_key}")
        if decision.form is None:
            route: Route = HostRoute(call, decision.reason)
        else:
            route = self._form_route(call, self.context.forms[decision.form], compiling)
        if not isinstance(route, PreparedRoute):
            self.observe(call, route.name, route.reason)
        return route

    def _form_route(self, call: AttentionCall, form: Form, compiling: bool) -> Route:
        padded = call.mask is MaskKind.BOOLEAN and self.context.padding is not None
        if (form.spec.takes_selection or padded) and not compiling:
            return PreparedRoute(call, form)  # the cut and the selection read the call's data: per call
        if form.spec.takes_selection:  # in a graph: selected there, as the sparse stage plans at trace time
            if call.mask is not MaskKind.NONE:
                kept = PADDING_NOT_IN_GRAPH if padded else "no verified layout says what the mask hides"
                return HostRoute(call, f"sparse: a masked call stays dense ({kept})")
            if self.context.sparse is None:
                return HostRoute(call, "no sparse setting on this plan (attach(..., sparse=SparseSetting(...)))")
            blocked = self.usable(form.name, dataclasses.replace(call, mask=MaskKind.BLOCK))
            return HostRoute(call, f"{form.name}: {blocked[0]}") if blocked else SelectedRoute(call, form)
        blocked = self.usable(form.name, call)
        if blocked:
            why = f"{form.name}: {blocked[0]}"
            return HostRoute(call, f"{why} ({PADDING_NOT_IN_GRAPH})" if compiling and padded else why)
        return FormRoute(call, form)

    def serve_prepared(self, form: Form, call: AttentionCall, inputs: AttentionInputs, host: HostFn,
                       to_host: ToHostLayout) -> torch.Tensor:
        """A form whose call is prepared first (the padding cut, the sparse selection), decided per call."""
        try:  # the selection and the padding cut run the form's own code too (its pooling)
            call, inputs, dense = self.prepare(form, call, inputs)
        except Exception as exc:  # never fail a call the host could serve
            return self.failed(form, exc, call, host)
        if dense:
            return self._host(call, dense, host)
        blocked = self.usable(form.name, call)
        if blocked:
            return self._host(call, f"{form.name}: {blocked[0]}", host)
        try:
            out = inputs.finish(form.run(inputs))
        except Exception as exc:  # never fail a call the host could serve
            return self.failed(form, exc, call, host)
        if self.context.tally:
            self.ledger.served(form.name)
        self.observe(call, form.name, "")
        return to_host(out)

    def failed(self, form: Form, exc: Exception, call: AttentionCall, host: HostFn) -> torch.Tensor:
        """The host serves a call its form raised on; the ledger counts it and, past its limit, disables the form
        (and every route resolved so far is resolved again, compiled ones included)."""
        if self.ledger.failed(form.name, exc):
            logger.warning("ditgate: %s: form %s %s; the host serves this site from now on",
                           self.name, form.name, self.ledger.disabled[form.name])
            self.context.invalidate()
        return self._host(call, f"{form.name} raised", host)

    def _host(self, call: AttentionCall, reason: str, host: HostFn) -> torch.Tensor:
        if self.context.tally:
            self.ledger.hosted(reason)
        self.observe(call, HOST, reason)
        return host()

    # --- inside a torch.compile trace (``traced.TracedSite``) ----------------------------------------
    def resolve_traced(self, sig: tuple) -> tuple[str | None, str, bool]:
        """At trace time, eagerly: the form a compiled graph is to call for this signature, or None for the host,
        and why, and whether the sparse stage selects for it (``resolve_selection``). Nothing is measured: a call
        the chooser would measure goes to the host, with the reason."""
        route = self._resolve(sig, compiling=True)
        if isinstance(route, FormRoute):
            return route.form.name, "", isinstance(route, SelectedRoute)
        return None, route.reason, False

    def resolve_selection(self, form_name: str, sig: tuple) -> tuple[tuple | None, str]:
        """At trace time, eagerly: how a graph traced for the sparse stage's current ``graph_token`` selects for
        this call (a plain tuple, ``sparse.graph.GraphPlan``), or None and why the host serves it there."""
        call = call_of(sig, self.context.capability(sig[4]))
        stage = self.context.sparse
        rows = self.context.forms[form_name].selection_rows(call, stage.setting.block)
        plan, why = stage.graph_selection(self.name, self.module_path, self.role or self.role_hint, tuple(sig[0]),
                                          sig[1][2], sig[4], rows)
        return (None, f"sparse: {why}") if plan is None else (tuple(plan), "")
