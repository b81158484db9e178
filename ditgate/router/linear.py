"""Per-site dispatch for linear sites: which form serves this call, with call-time fallback to the host.

A ``LinearRouter`` is one ``nn.Linear`` of a denoiser. Its forward (the module's own, for this module only) asks the
plan's linear chooser for a decision, checks the chosen form's reasons and its weights against the call, runs it,
and hands the call to the host path if anything does not fit or the form raises; the ledger counts every call and
why the host served it. The host path is the host's own product, ``F.linear`` with the host's weight and bias: the
weight is the module's while the host keeps it, or the held original copied to the call's device (a call the form
cannot take at a site whose host weight left the device: another dtype, autograd, a module moved by offloading).

Inside torch.compile no call is counted, only each trace's route (``SiteLedger.traced``). The route is decided once
at trace time by plain Python that dynamo runs eagerly and keeps as a constant (``traced_route``, as the attention
sites' ``ModuleRouter.traced_route``): its arguments are the call's plain facts, the site's name and the plan's
generation, so the graph guards on those, not on the chooser's dictionaries and the forms' attributes that the
decision reads. Traced through, those cost about 70 guards per site, evaluated on every call of the compiled model.
The served path is torch ops alone. Everything else here (``decide`` and the routes it keeps) runs eagerly only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from ..forms.linear import LinearCall, LinearForm, QuantizedWeight, describe_linear, linear_call
from ..forms.linear_graph import GRAPH_SERVES
from ..hosts.linear_weights import PAYLOAD_DATA, PAYLOAD_SCALE, PAYLOAD_STATE, WeightCustody
from ..hosts.linears import LinearSite
from .ledger import HOST, SiteLedger
from .observer import RouteEvent
from .site import Decision, RouterContext
from .traced import plain_sizes

logger = logging.getLogger("ditgate")


class LinearChooser(Protocol):
    def decide(self, site: LinearRouter, call: LinearCall) -> Decision: ...

    def measure(self, site: LinearRouter, call: LinearCall, x: torch.Tensor) -> torch.Tensor: ...


@dataclass
class LinearContext:
    """What the linear sites of one plan share (owned by the plan): forms, chooser, and the attention routers'
    context for the tally switch, the observer and the capability cache."""

    forms: dict[str, LinearForm]
    chooser: LinearChooser
    route: RouterContext
    keep_host: str = "cpu"
    # a compiled graph quantizes an activation's output in a kernel of its own
    # (``LinearSetting.activation_quantization``)
    quantize_apart: bool = True


def _compiling() -> bool:
    return torch.compiler.is_compiling()


class LinearRouter:
    def __init__(self, context: LinearContext, site: LinearSite) -> None:
        self.context = context
        self.name = site.path
        self.role = site.role
        self.after_activation = site.after_activation
        self.module = site.module
        self.custody = WeightCustody(site.path, site.module)
        self.ledger = SiteLedger(max_failures=context.route.max_failures)
        self.shapes: dict[str, LinearCall] = {}
        self.candidates: dict[str, QuantizedWeight] = {}  # a form's weights made while measuring, before settling
        self._reasons: dict[tuple[str, str], tuple[str, ...]] = {}
        self._seen_routes: set[tuple] = set()
        self._routes: dict[tuple, object] = {}  # call signature -> what serves it, for the generation below
        self._generation = -1
        self._aside = False
        self.eager_served: set[str] = set()  # forms an eager call at this site ran (``LinearForm.needs_eager_call``)
        # detach ran: a hook installed after attach that kept this forward (``WeightCustody.remove_forward`` cannot take
        # it out from under the hook) gets the module's own product, never a form's
        self.detached = False
        self.custody.install_forward(self.forward)

    # --- weights -------------------------------------------------------------------------------------
    def weights_for(self, form: str) -> QuantizedWeight:
        """The form's weights for this site: the settled ones, or made now from the host's weight (kept until the
        site settles)."""
        if self.custody.payload_form == form:
            return self.custody.payload()
        if form not in self.candidates:
            self.candidates[form] = self.context.forms[form].quantize(self.host_weight(self.custody.device))
            if form in self.eager_served:  # new weights, a new state: no eager call has started it
                self.eager_served.discard(form)
                self.context.route.invalidate()
        return self.candidates[form]

    def host_weight(self, device: torch.device) -> torch.Tensor:
        return self.custody.host_weight(device)

    def settle(self, form: str | None) -> None:
        """Keep ``form``'s weights in the module (the host's weight leaves the device per the plan's ``keep_host``),
        or, for None, the host's weight alone; the other candidates' weights are dropped."""
        if form is not None and self.custody.payload_form != form:
            weights = self.weights_for(form)
            self.custody.hold_payload(form, weights)
            self.custody.release_host(self.context.keep_host)
            self.context.route.invalidate()  # a graph reads settled weights another way (``_traced``): trace again
        self.candidates.clear()

    def keep_candidates(self, forms: set[str | None]) -> None:
        """Drop the weights made while measuring for every form but ``forms``."""
        for name in [n for n in self.candidates if n not in forms]:
            del self.candidates[name]

    def unsettle(self) -> None:
        """The host's weight back on the device (a live shape the host serves at a quantized site)."""
        self.custody.bring_back_host()

    # --- what the chooser and the gate use -------------------------------------------------------
    def usable(self, form: str, call: LinearCall) -> tuple[str, ...]:
        if form in self.ledger.disabled:
            return (self.ledger.disabled[form],)
        key = (form, call.shape_key + f":grad={int(call.needs_grad)}:{call.device_type}")
        if key not in self._reasons:
            self._reasons[key] = tuple(self.context.forms[form].not_supported_reasons(call))
        return self._reasons[key]

    @property
    def quantizes_apart(self) -> bool:
        """Whether a compiled graph quantizes this site's input in a kernel of its own (an activation's output, and
        the plan's ``activation_quantization`` "apart"): what its row-wise forms' ``graph_serve`` does, and why a
        plan for a compiled model times their calls here whole."""
        return self.after_activation and self.context.quantize_apart

    def describe(self, x: torch.Tensor) -> LinearCall:
        needs_grad = torch.is_grad_enabled() and (x.requires_grad or self.custody.requires_grad)
        return describe_linear(x, self.module.out_features, needs_grad, self.context.route.capability(x.device))

    def run_form(self, form: LinearForm, x: torch.Tensor, weights: QuantizedWeight) -> torch.Tensor:
        out = form.run(x.reshape(-1, x.shape[-1]), weights, self.module.bias)
        if form.needs_eager_call and form.name not in self.eager_served:  # eager only: a trace runs _traced
            self.eager_served.add(form.name)
            self.context.route.invalidate()  # a graph traced before this call kept the host here: trace again
        return out.reshape(*x.shape[:-1], out.shape[-1])

    def run_host(self, x: torch.Tensor) -> torch.Tensor:
        """The host's own product (``nn.Linear.forward``) with the host's weight on the call's device."""
        return F.linear(x, self.host_weight(x.device), self.module.bias)

    # --- the call path ---------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """A call whose signature resolved to a route since the plan's generation last changed replays it (a dict
        lookup: a denoiser makes hundreds of linear calls per forward, and deciding one costs tens of microseconds
        of Python); any other call is decided (``decide``)."""
        if not isinstance(x, torch.Tensor) or x.ndim == 0:
            return self.run_host(x)
        if _compiling():
            return self._traced(x)
        if self.detached:  # still called through a hook installed after attach: the host's product
            return self.run_host(x)
        generation = self.context.route.generation
        if generation != self._generation:
            self._routes.clear()
            self._generation = generation
        weight = self.module._parameters["weight"]
        sig = (x.shape, x.dtype, x.device, weight.device, weight.dtype,
               torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad),
               torch.is_autocast_enabled(x.device.type))
        route = self._routes.get(sig)
        if route is not None:
            return route(x)
        return self.decide(x, sig)

    def _host_route(self, reason: str):
        def host(x: torch.Tensor) -> torch.Tensor:
            if self.context.route.tally:
                self.ledger.hosted(reason)
            return self.run_host(x)

        return host

    def _form_route(self, form: LinearForm, call: LinearCall):
        def serve(x: torch.Tensor) -> torch.Tensor:
            try:
                out = self.run_form(form, x, self.weights_for(form.name))
            except Exception as exc:  # never fail a call the host could serve
                return self._failed(form, exc, call, x)
            if self.context.route.tally:
                self.ledger.served(form.name)
            return out

        return serve

    def decide(self, x: torch.Tensor, sig: tuple | None = None) -> torch.Tensor:
        """Decide this call's route (and keep it under ``sig``, unless it measures), then serve the call."""
        call = self.describe(x)
        self.shapes.setdefault(call.shape_key, call)
        decision = self.context.chooser.decide(self, call)
        if decision.measure:
            self._tally_host(call, "calibrating")
            return self.context.chooser.measure(self, call, x)
        reason = decision.reason if decision.form is None else self._blocked(decision.form, call, x)
        if reason and decision.form is not None:
            reason = f"{decision.form}: {reason}"
        if reason or decision.form is None:
            if sig is not None:
                self._routes[sig] = self._host_route(reason)
            return self._host(call, reason, x)
        form = self.context.forms[decision.form]
        if sig is not None:
            self._routes[sig] = self._form_route(form, call)
        try:
            out = self.run_form(form, x, self.weights_for(form.name))
        except Exception as exc:  # never fail a call the host could serve
            return self._failed(form, exc, call, x)
        if self.context.route.tally:
            self.ledger.served(form.name)
        self._observe(call, form.name, "")
        return out

    def _blocked(self, form: str, call: LinearCall, x: torch.Tensor) -> str:
        """Why ``form`` cannot serve this call here (empty when it can): its envelope, or the call not fitting the
        site (``mismatch``)."""
        reasons = self.usable(form, call)
        return reasons[0] if reasons else self.mismatch(x)

    # --- inside a compiled graph ---------------------------------------------------------------
    def _traced(self, x: torch.Tensor) -> torch.Tensor:
        """The call as a graph holds it: the route ``traced_route`` decided for its facts, then the form's torch ops
        (a form whose Python raises while it is traced leaves this graph to the host's product; an operator that
        fails inside the compiler's own tracing fails the compile). A site whose weights are
        settled runs its form's ``graph_serve`` on the module's payload buffers, reached through one constant mapping
        (``forms.linear_graph``): no guard on this site's path to the form or to the weights' holder."""
        name, _, dtypes, fast, apart = self.traced_route(
            self.context.route.generation, self.name, plain_sizes(x.shape), x.dtype, x.device, bool(x.requires_grad),
            torch.is_grad_enabled(), torch.is_autocast_enabled(x.device.type))
        if name is None:
            return self.run_host(x)
        try:
            module = self.module
            if dtypes is None:  # weights made while measuring, not settled in the module: read where they are kept
                weights = self.weights_for(name)
                data, scale, state = weights.data, weights.scale, weights.state
            else:
                buffers = module._buffers
                data, scale = buffers[PAYLOAD_DATA].view(dtypes[0]), buffers[PAYLOAD_SCALE].view(dtypes[1])
                state = buffers[PAYLOAD_STATE].view(dtypes[2]) if dtypes[2] is not None else None
            out = GRAPH_SERVES[name](x.reshape(-1, x.shape[-1]), data, scale, state, module.bias, fast, apart)
            return out.reshape(*x.shape[:-1], out.shape[-1])
        except Exception:
            return self.run_host(x)

    @torch._dynamo.assume_constant_result
    def traced_route(self, generation: int, site: str, shape: tuple[int, ...], dtype: torch.dtype,
                     device: torch.device, requires_grad: bool, grad_enabled: bool,
                     autocast: bool) -> tuple[str | None, str, tuple[torch.dtype, ...] | None, bool, bool]:
        """At trace time, eagerly: the form a compiled graph calls for this call, or None for the host, and why; the
        dtypes of the form's weights where they are settled in the module's payload buffers (data, scale, state or
        None; None where they are not); the form's ``fast_accumulation``; and whether the input is quantized in a
        kernel of its own (``quantizes_apart``). ``generation`` (the plan's, unique
        among the process's plans) and ``site`` (this router's name) are read in the trace, so dynamo guards on both:
        a new verdict, a disabled form, a settled site, a new mode or another plan traces again, and a graph that
        two modules share (the same code compiled twice) is not reused for a site it was not traced for. Nothing is
        measured in a trace: a call the chooser would measure goes to the host there, until an eager call at its
        shape measures it."""
        name, why = self._route_of(shape, dtype, device, requires_grad, grad_enabled, autocast) if not self.detached \
            else (None, "the plan was detached")
        self.ledger.traced(name or HOST, why, generation)  # what the graph holds here, per trace (not per call)
        settled = name is not None and name == self.custody.payload_form
        fast = bool(getattr(self.context.forms[name], "fast_accumulation", False)) if name is not None else False
        return name, why, self.custody.payload_dtypes() if settled else None, fast, self.quantizes_apart

    def _route_of(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, requires_grad: bool,
                  grad_enabled: bool, autocast: bool) -> tuple[str | None, str]:
        needs_grad = grad_enabled and (requires_grad or self.custody.requires_grad)
        call = linear_call(shape, dtype, device.type, self.module.out_features, needs_grad,
                           self.context.route.capability(device))
        decision = self.context.chooser.decide(self, call)
        if decision.measure:
            return None, f"shape {call.shape_key} not measured yet: an eager call measures it, not a compiled one"
        if decision.form is None:
            return None, decision.reason
        reasons = self.usable(decision.form, call)
        weight = self.module._parameters["weight"]
        why = reasons[0] if reasons else (self._needs_eager_call(decision.form)
                                          or mismatch_of(dtype, device, autocast, weight.dtype, weight.device))
        return (None, f"{decision.form}: {why}") if why else (decision.form, "")

    def _needs_eager_call(self, form: str) -> str:
        """For a form whose state starts at an eager call (``LinearForm.needs_eager_call``): why a graph cannot run it
        here yet (empty when it can)."""
        if not self.context.forms[form].needs_eager_call:
            return ""
        if form not in self.eager_served:
            return ("its input scale starts at an eager call of this site and none has run (run one forward before "
                    "compiling)")
        if not self.history_started(form):
            return ("its input scale starts at an eager call's input absmax, and every input this site had was zero "
                    "(this graph keeps the host here until it is traced again)")
        return ""

    def history_started(self, form: str) -> bool:
        """Whether the form's state at this site holds a nonzero input absmax: a compiled call casts at the scale the
        history gives, so a history of zeros would clamp every element of a real input. Runs eagerly at trace time
        (inside ``traced_route``, whose answer dynamo keeps as a constant of the graph, with no guard) and reads the
        device there; reads only weights that exist (a form with none here has no history). Nothing inside a graph
        counts the host's calls, so a site kept on the host this way is logged, once per trace."""
        weights = self.custody.payload() if self.custody.payload_form == form else self.candidates.get(form)
        if weights is not None and (weights.state is None or bool(weights.state[0].item() > 0)):
            return True
        logger.warning("ditgate: %s at %s: every input this site had was zero, so its input scale has not started; "
                       "this compiled graph keeps the host here until it is traced again", form, self.name)
        return False

    def mismatch(self, x: torch.Tensor) -> str:
        """Why no form may serve this input at this site, whatever its envelope (empty when one may): another dtype
        than the host's weight, another device than the module's, autocast on."""
        weight = self.module._parameters["weight"]
        return mismatch_of(x.dtype, x.device, torch.is_autocast_enabled(x.device.type), weight.dtype, weight.device)

    def _tally_host(self, call: LinearCall, reason: str) -> None:
        if self.context.route.tally:
            self.ledger.hosted(reason)
        self._observe(call, HOST, reason)

    def _host(self, call: LinearCall, reason: str, x: torch.Tensor) -> torch.Tensor:
        self._tally_host(call, reason)
        return self.run_host(x)

    def _failed(self, form: LinearForm, exc: Exception, call: LinearCall, x: torch.Tensor) -> torch.Tensor:
        self._routes.clear()  # the next call decides again (past the limit, without this form)
        if self.ledger.failed(form.name, exc):
            logger.warning("ditgate: %s: linear form %s %s; the host serves this site from now on",
                           self.name, form.name, self.ledger.disabled[form.name])
            self.context.route.invalidate()  # graphs decided their routes as constants: trace them again
        return self._host(call, f"{form.name} raised", x)

    def _observe(self, call: LinearCall, route: str, reason: str) -> None:
        key = (route, reason, call.shape_key)
        if key in self._seen_routes:
            return
        self._seen_routes.add(key)
        self.context.route.observe(RouteEvent(self.name, self.role, route, reason, call.shapes_text(), call.dtype,
                                              "-"))

    # --- a site the host won everywhere -----------------------------------------------------------
    @property
    def aside(self) -> bool:
        """True while the module runs its own forward again (``step_aside``): calls cost what they cost before attach,
        and are not counted."""
        return self._aside

    def step_aside(self) -> None:
        """Give the module its own forward back where the host serves every call it was measured at and no form's
        weights are held: a denoiser makes hundreds of linear calls per forward, and on an image model the router's
        few microseconds per call, where it only hands the call to the host, cost more than the forms won elsewhere."""
        if self._aside or self.custody.payload_form is not None or self.candidates:
            return
        self.custody.remove_forward()
        self._aside = True

    def step_back(self) -> None:
        """The routed forward again (a new shape to measure)."""
        if self._aside:
            self.custody.install_forward(self.forward)
            self._aside = False

    # --- the way back --------------------------------------------------------------------------
    def detach(self) -> None:
        self.detached = True
        self.candidates.clear()
        self.eager_served.clear()
        self.custody.restore()


def mismatch_of(dtype: torch.dtype, device: torch.device, autocast: bool, weight_dtype: torch.dtype,
                weight_device: torch.device) -> str:
    """``LinearRouter.mismatch`` from the call's plain facts (what a trace passes ``traced_route``)."""
    if dtype != weight_dtype:
        return f"input {str(dtype).removeprefix('torch.')}, host weight {str(weight_dtype).removeprefix('torch.')}"
    if device != weight_device:
        return f"input on {device}, the module's weights on {weight_device}"
    return "autocast is on" if autocast else ""


class StaticLinearChooser:
    """A plan that does not measure: each site's form is fixed at attach (``settle``); a call that form cannot take
    goes to the host with the reason."""

    def __init__(self, chosen: dict[str, tuple[str | None, str]]) -> None:
        self.chosen = chosen  # site name -> (form or None, why the host serves it)

    def decide(self, site: LinearRouter, call: LinearCall) -> Decision:
        form, why = self.chosen.get(site.name, (None, "not chosen"))
        return Decision(form, why)

    def measure(self, *args, **kwargs):  # never asked: decide() never returns measure=True
        raise AssertionError("the static linear chooser does not measure")
