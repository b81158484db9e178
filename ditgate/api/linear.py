"""The linear sites of one plan: installing their routers, settling their weights, reporting them, and detaching.

``attach(..., linear=...)`` makes one ``LinearPart``. A plan that measures installs a router on every linear site of
the setting's roles and lets the gate decide per site and shape key; a plan that does not measure fixes each site's
form at attach (the first of the setting's forms whose envelope serves the site's K, N, dtype and device) and
quantizes it at once. Either way the plan's ``fuse_lora`` guard refuses fusing while any site is quantized.
"""

from __future__ import annotations

import logging

import torch

from ..forms.linear import LinearCall, LinearForm
from ..forms.linear_delayed import delayed_clamped_calls
from ..gate.linear import LinearSetting, settle_sites
from ..gate.verdict import Verdict
from ..hosts.held_guards import guard_casts, guard_load_state_dict, guard_pipeline_casts
from ..hosts.linear_weights import guard_fuse_lora
from ..hosts.linears import find_linear_sites, fused_away
from ..router import HOST, RouterContext
from ..router.linear import LinearChooser, LinearContext, LinearRouter, StaticLinearChooser
from .report import LinearRecord, LinearSiteRecord

logger = logging.getLogger("ditgate")


def serving_route(counts, traces=()) -> str:
    """The route that served most live calls of a site (calibration calls aside); where no live call was counted,
    the route compiled graphs traced most since the plan's routes last changed (``traces``: the ledger's
    ``current_trace_counts``, so that a graph traced before calibration or before a verdict was reverted does not
    count; calls a graph serves run none of our Python, so a compiled model's only counted calls are its
    calibration's); "host" when only calibration ran, "-" before any call."""
    live = [c for c in counts if c.reason != "calibrating"]
    if live:
        return max(live, key=lambda c: c.calls).route
    if traces:
        return max(traces, key=lambda c: c.calls).route
    return HOST if counts else "-"


def _static_call(router: LinearRouter, capability) -> LinearCall:
    """The site as a call whose rows are not known yet (the envelope's row limits are checked per call)."""
    weight = router.module.weight
    return LinearCall(rows=0, in_features=router.module.in_features, out_features=router.module.out_features,
                      dtype=str(weight.dtype).removeprefix("torch."), device_type=weight.device.type,
                      capability=capability, needs_grad=False)


def tensor_shapes(args: tuple, kwargs: dict) -> tuple:
    """The shapes of a forward's tensor arguments, positional and by name (what decides its linear shape keys)."""
    return (tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor)),
            tuple((k, tuple(v.shape)) for k, v in kwargs.items() if isinstance(v, torch.Tensor)))


class LinearPart:
    def __init__(self, setting: LinearSetting, forms: dict[str, LinearForm], chooser: LinearChooser,
                 route: RouterContext, measuring: bool) -> None:
        self.setting = setting
        self.measuring = measuring
        self.context = LinearContext(forms=forms, chooser=chooser, route=route, keep_host=setting.keep_host,
                                     quantize_apart=setting.activation_quantization == "apart")
        self.routers: list[LinearRouter] = []
        self.denoisers: list[tuple[str, torch.nn.Module]] = []
        # linears of the routed roles the plan leaves to the host, with why (``hosts.linears.left_alone``)
        self.left_alone: list[tuple[str, str]] = []
        self._unguard: list = []

    def install(self, denoisers: list[tuple[str, torch.nn.Module]], pipeline: object = None) -> None:
        """Routers for the linear sites of ``denoisers`` (of ``pipeline``, where attach was given one: its ``to``
        is guarded too), and the guards that refuse what would change a held weight partway."""
        self.denoisers = list(denoisers)
        if pipeline is not None:
            self._unguard.append(guard_pipeline_casts(pipeline))
        roles = set(self.setting.routed_roles(self.measuring))
        for name, model in denoisers:
            for site in find_linear_sites(model, prefix=name):
                if site.role in roles and site.left_alone:
                    self.left_alone.append((site.path, site.left_alone))
                elif site.role in roles:
                    self.routers.append(LinearRouter(self.context, site))
            self._unguard += [guard_fuse_lora(model, self.quantized_sites), guard_casts(model),
                              guard_load_state_dict(model)]
        if self.left_alone:
            logger.warning("ditgate: %d linear module(s) left to the host, first %s: %s", len(self.left_alone),
                           *self.left_alone[0])

    def quantized_sites(self) -> list[str]:
        return [r.name for r in self.routers if r.custody.payload_form is not None or r.candidates]

    def settle_static(self) -> None:
        """A plan that does not measure: the first form (in the setting's order) whose envelope serves each site,
        its weights made now; the reasons of every form for a site none serves."""
        assert isinstance(self.context.chooser, StaticLinearChooser)
        order = self.setting.forms or tuple(self.context.forms)
        for router in self.routers:
            call = _static_call(router, self.context.route.capability(router.module.weight.device))
            refusals = []
            for name in order:
                reasons = self.context.forms[name].not_supported_reasons(call, rows_known=False)
                if not reasons:
                    self.context.chooser.chosen[router.name] = (name, "")
                    router.settle(name)
                    break
                refusals.append(f"{name}: {reasons[0]}")
            else:
                self.context.chooser.chosen[router.name] = (None, "no linear form serves this site ("
                                                            + "; ".join(refusals) + ")")
                router.step_aside()
        self._say_unstarted()

    def settle(self, verdicts: dict[tuple[str, str], Verdict], histories: dict[str, float] | None = None) -> None:
        """Each site's weights per its verdicts; ``histories`` (a receipt's, site -> the largest input absmax seen)
        start the per-site state of forms that keep one, so that a compiled graph serves those sites without an eager
        forward first."""
        settle_sites(self.routers, verdicts)
        self._release_fused_away({name for name, _ in verdicts})
        for form in {r.custody.payload_form for r in self.routers} - {None}:
            self.context.forms[form].availability()  # probed here, not in a compiled call (its timer breaks a graph)
        for r in self.routers if histories else ():
            weights = r.custody.payload()
            if r.name in histories and weights is not None and weights.state is not None:
                with torch.no_grad():
                    weights.state[0].fill_(float(histories[r.name]))
                r.eager_served.add(r.custody.payload_form)
        self._say_unstarted()

    def _release_fused_away(self, judged: set[str]) -> None:
        """The projections a fused projection computes in their place (``hosts.linears.fused_away``: the model runs
        diffusers' fused projections) and that calibration never called: their host weights leave the device as a
        quantized site's do (``keep_host``), so that a fused model holds its projections once. ``judged``: the sites
        with verdicts (a receipt's too), left as their verdicts settled them. A later call (after
        ``unfuse_qkv_projections``) is a new shape: measured, and its weight back on the device if the host wins."""
        away: dict[torch.nn.Module, str] = {}
        for _, model in self.denoisers:
            away.update(fused_away(model))
        for r in self.routers:
            fused = away.get(r.module)
            if fused is not None and not r.shapes and r.name not in judged and r.custody.payload_form is None:
                r.custody.release_host(self.setting.keep_host,
                                       f"held (not called while its attention runs the fused projection {fused})")

    def histories(self) -> dict[str, float]:
        """Site -> the largest input absmax its settled form has seen, for the sites whose form keeps such a history
        and whose history started (what a receipt carries; reads the device)."""
        found = {}
        for r in self.routers:
            weights = r.custody.payload()
            if weights is not None and weights.state is not None and r.custody.payload_form in r.eager_served:
                found[r.name] = float(weights.state[0].item())
        return found

    def _say_unstarted(self) -> None:
        """Once, where sites settled on a form whose calls need an eager call first (``needs_eager_call``) and none
        ran there yet (a plan that does not measure, or a receipt without their histories): compiled calls there run the
        host, and nothing inside a graph counts them."""
        waiting: dict[str, int] = {}
        for r in self.routers:
            form = r.custody.payload_form
            if form is not None and self.context.forms[form].needs_eager_call and form not in r.eager_served:
                waiting[form] = waiting.get(form, 0) + 1
        for form, sites in waiting.items():
            logger.warning("ditgate: %s serves %d linear site(s) whose input scale starts at their first eager call; "
                           "run one forward eagerly before torch.compile, or the compiled graph keeps them on the host",
                           form, sites)

    def aside(self, prefix: str = "") -> list[LinearRouter]:
        """The sites (under ``prefix``) running their module's own forward since the host won them everywhere."""
        return [r for r in self.routers if r.aside and r.name.startswith(prefix)]

    def wake_on_new_shapes(self, model: torch.nn.Module, prefix: str, args: tuple, kwargs: dict):
        """A pre-hook on ``model`` that routes its stepped-aside sites again at the first eager forward whose tensor
        inputs have other shapes than ``args``/``kwargs`` (the calibrating forward's): their new shape keys are then
        measured like attention's (``on_new_shape="measure"``). One comparison per forward, not per linear call.
        Inside a compiled graph it does nothing: there the sites stay aside, as the host. The handle, or None where
        no site under ``prefix`` stepped aside."""
        if not self.aside(prefix):
            return None
        measured = tensor_shapes(args, kwargs)

        def pre(module, args, kwargs):
            if torch.compiler.is_compiling() or tensor_shapes(args, kwargs) == measured:
                return
            self.wake(prefix)
            handle.remove()

        handle = model.register_forward_pre_hook(pre, with_kwargs=True)
        return handle

    def wake(self, prefix: str = "") -> int:
        """Route the sites under ``prefix`` that stepped aside again (a forward of a shape not measured yet); how many."""
        woken = self.aside(prefix)
        for r in woken:
            r.step_back()
        return len(woken)

    def record(self, verdicts: dict[tuple[str, str], Verdict]) -> LinearRecord:
        by_site: dict[str, list[Verdict]] = {}
        for v in verdicts.values():
            by_site.setdefault(v.site, []).append(v)
        sites = []
        for r in self.routers:
            counts = r.ledger.route_counts()
            sites.append(LinearSiteRecord(
                name=r.name, role=r.role, shapes=tuple(r.shapes), calls=r.ledger.calls,
                serving=serving_route(counts, r.ledger.current_trace_counts()),
                routes=counts, failures=r.ledger.failure_counts(), verdicts=tuple(by_site.get(r.name, ())),
                weights=r.custody.payload_form or HOST, bytes_before=r.custody.bytes_before(), aside=r.aside,
                bytes_now=r.custody.bytes_now(),
                clamped_calls=delayed_clamped_calls(r.custody.payload(), *r.candidates.values())))
        return LinearRecord(self.setting.keep_host, tuple(sites), sum(s.bytes_before for s in sites),
                            sum(s.bytes_now for s in sites), self.device_time_off, tuple(self.left_alone))

    @property
    def device_time_off(self) -> str:
        """Why a plan that asked to time its sites on the device timed them eagerly (``LinearGateChooser``), or ""."""
        return getattr(self.context.chooser, "device_time_off", "")

    def detach(self) -> None:
        """Every site restored, then the guards off; a site that fails to restore (memory for its weight's copy back)
        does not keep the others or the guards in place: its error is raised after, and a second detach retries it."""
        failed: list[BaseException] = []
        for r in self.routers:
            try:
                r.detach()
            except Exception as exc:
                failed.append(exc)
                logger.error("ditgate: %s could not be restored: %s: %s", r.name, type(exc).__name__, exc)
        for unguard in self._unguard:
            unguard()
        self._unguard.clear()
        if failed:
            raise failed[0]
