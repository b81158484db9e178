"""The linear gate: each linear site's forms measured on its live input, verdicts beside the attention verdicts.

Each site's forms meet in the plan's ``contest``: speed is a property of (form, shape key), timed against the host
once per ``M:K:N:dtype`` in the plan's ``TimingBook`` and read by every other site with that key; accuracy is a
property of the site, checked on its own live input for each form that could still win (cosine and relative L2
against the host's output, the profile's linear floors).
The verdicts go into the plan's ``GateChooser.verdicts`` (site = module path, shape key = the linear key), so the
whole-model check judges attention and linear routes together and reverts the smallest gains first, and receipts
carry both.

After the whole-model check a site *settles*: where every verdict it has chose one form, that form's weights stay
on the device as the module's buffers and the host's weight leaves it (``keep_host``); where every verdict chose the
host, the quantized candidates are dropped; where verdicts differ per shape both stay (the report shows the bytes).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import torch
import torch.nn.functional as F

from ..forms import Precision
from ..forms.linear import LinearCall, LinearForm, check_linear_form_names
from ..hosts.linears import ALL_ROLES, TOKEN_ROLES
from ..router import Decision
from ..router.linear import LinearRouter
from .book import TimingBook, TimingKey
from .chooser import GateChooser
from .contest import Entrant, contest
from .profiles import Profile
from .replay import DEVICE_TIME, CaptureFailed, ReplayClock, replay_clocks
from .verdict import NOT_ALLOWED, RAISED, UNAVAILABLE, UNSUPPORTED, Refusal, Verdict

logger = logging.getLogger("ditgate.gate")


# The timing-key variant of a linear form timed for a compiled model (``LinearSetting.compiled``): kept apart in the
# cache from the same form's eager timing at the same shape key.
COMPILED_TIMING = "compiled: product alone"


@dataclass(frozen=True)
class LinearFloors:
    """A linear site's accuracy floors: its output against the host's on the same live input."""

    min_cosine: float
    max_rel_l2: float | None


# Per profile: balanced keeps INT8's error (rel L2 ~1 % on random inputs) and refuses FP8's (~3.7 %); speed takes both.
LINEAR_FLOORS = MappingProxyType({
    "balanced": LinearFloors(min_cosine=0.9995, max_rel_l2=0.03),
    "speed": LinearFloors(min_cosine=0.998, max_rel_l2=0.065),
})


@dataclass(frozen=True)
class LinearSetting:
    """``attach(..., linear=LinearSetting(...))``: which linear sites may be served by which linear forms.

    forms: candidate linear forms (None: the default ones, ``forms.linear.LINEAR_PRIORITY``; an opt-in form,
        ``LINEAR_OPT_IN``, only when named); for a plan that does not measure,
        the order in which the first one that serves a site is taken.
    roles: the roles routed (None: every role when measuring, the per-token roles ``TOKEN_ROLES`` when not).
    keep_host: where the host's weight of a quantized site waits for detach: "cpu" (pinned CPU memory; the device
        holds only the 8-bit weights) or "device" (kept beside them: no memory saved, the host path stays fast).
    min_cosine / max_rel_l2: override the profile's linear floors.
    compiled: the model will run under torch.compile: a form's speed is timed as its 8-bit product alone, on an
        input quantized beforehand, because inductor fuses the input's row-wise quantization into the kernel that
        produces the input (a norm, a modulation, an activation) and the product is what remains (a form whose
        quantization cannot fuse or adds kernels of its own to the graph, ``LinearForm.quantization_fuses`` False,
        is timed whole). Eager calls of such a plan still quantize on every call, so use it for the model you
        compile. Accuracy is checked as always, on
        the whole form. The whole-model check times the model with every linear route on the host (their speed is
        judged at their sites: its eager forwards run none of them as the graph will) and checks its output with
        every route.
    device_time: with ``compiled``, on a CUDA device, time each site's host product and form calls on the device,
        captured into CUDA graphs and replayed (``gate.replay``), instead of eagerly. Opt-in: the one gated plan made
        this way ran slower whole than eagerly timed ones (``docs/linear.md`` has the numbers; the cause is not
        measured yet).
    activation_quantization: how a compiled graph quantizes the input of a site whose input is an activation's
        output (``hosts.linears.LinearSite.after_activation``: the feed-forward's down projection), for the row-wise
        forms: "apart" (default), in a kernel of its own after the activation's (``forms.rowwise_op``), and a plan
        for a compiled model times such a site's form whole; "fused", in torch ops that inductor fuses into the
        activation's kernel, which then computes the activation twice (at Wan 2.1 1.3B's down projection on an H100:
        1.024 ms against 0.737 apart, and the fused route ran 0.915x the host).
    """

    forms: tuple[str, ...] | None = None
    roles: tuple[str, ...] | None = None
    keep_host: str = "cpu"
    min_cosine: float | None = None
    max_rel_l2: float | None = None
    compiled: bool = False
    activation_quantization: str = "apart"
    device_time: bool = False

    def __post_init__(self) -> None:
        if self.forms is not None:
            check_linear_form_names(self.forms)
        unknown = [r for r in self.roles or () if r not in ALL_ROLES]
        if unknown:
            raise ValueError(f"unknown linear role(s) {unknown}; roles: {', '.join(ALL_ROLES)}")
        if self.keep_host not in ("cpu", "device"):
            raise ValueError(f"keep_host must be 'cpu' or 'device', not {self.keep_host!r}")
        if self.activation_quantization not in ("apart", "fused"):
            raise ValueError(f"activation_quantization must be 'apart' or 'fused', not "
                             f"{self.activation_quantization!r}")

    def routed_roles(self, measuring: bool) -> tuple[str, ...]:
        return self.roles if self.roles is not None else (ALL_ROLES if measuring else TOKEN_ROLES)


def linear_setting(value: object) -> LinearSetting | None:
    """``attach``'s ``linear=`` argument as a setting: None/False (off), True (every form), form names, a setting."""
    if value is None or value is False:
        return None
    if value is True:
        return LinearSetting()
    if isinstance(value, LinearSetting):
        return value
    if isinstance(value, str):
        return LinearSetting(forms=(value,))
    if isinstance(value, Sequence):
        return LinearSetting(forms=tuple(value))
    raise TypeError(f"linear must be True, a LinearSetting or linear form names, not {type(value).__name__}")


def linear_floors(profile: Profile, setting: LinearSetting) -> LinearFloors:
    """The profile's linear floors, with the setting's overrides. Raises for a profile that allows no bounded form
    (the quality profile never quantizes a linear)."""
    if Precision.BOUNDED not in profile.precisions or profile.name == "quality":
        raise ValueError(f"linear forms are bounded-error (8-bit weights and activations); profile {profile.name!r} "
                         "never quantizes a linear (use profile='balanced' or 'speed')")
    base = LINEAR_FLOORS.get(profile.name, LinearFloors(profile.min_call_cosine, None))
    return LinearFloors(setting.min_cosine if setting.min_cosine is not None else base.min_cosine,
                        setting.max_rel_l2 if setting.max_rel_l2 is not None else base.max_rel_l2)


class LinearGateChooser:
    """The measuring chooser of a plan's linear sites, beside (and sharing the mode, verdicts, timing book and
    calibration budget of) its ``GateChooser``."""

    def __init__(self, gate: GateChooser, forms: dict[str, LinearForm], setting: LinearSetting,
                 floors: LinearFloors) -> None:
        self.gate = gate
        self.forms = forms
        self.setting = setting
        self.floors = floors
        # the contest judges a linear site by the linear floors; speed threshold and rounds are the profile's
        self.profile = dataclasses.replace(gate.profile, min_call_cosine=floors.min_cosine,
                                           max_call_rel_l2=floors.max_rel_l2)
        # why this plan times its sites eagerly although its setting asked for device time: the host's product could
        # not be captured in a CUDA graph (then no form's device time has anything to be compared with)
        self.device_time_off = ""

    def decide(self, site: LinearRouter, call: LinearCall) -> Decision:
        return self.gate.decide(site, call)  # the same modes and per-(site, shape key) verdicts as attention

    def measure(self, site: LinearRouter, call: LinearCall, x: torch.Tensor) -> torch.Tensor:
        started = time.perf_counter()
        with torch.no_grad():
            weight = site.host_weight(x.device)  # copied to the device once, where the site's host weight is held
            bias = site.module.bias

            def host() -> torch.Tensor:
                return F.linear(x, weight, bias)

            host_out = self.gate.call_host(host, x.device)
            if self.gate.budget_spent:
                verdict = self.gate._after_budget(site.name, call.shape_key)
            else:
                verdict = self._judge(site, call, x, host, host_out)
        self.gate.spent_s += time.perf_counter() - started
        if self.gate.agreement is not None:  # a context-parallel denoiser's ranks settle on one verdict
            verdict = self.gate.agreement.verdict(site.name, verdict)
        won = self.forms.get(verdict.form) if verdict.form is not None else None
        if self.setting.compiled and won is not None:  # the check's eager forwards do not run it as the graph will
            self.gate.per_site_speed.add((verdict.site, verdict.shape_key))
        self.gate.record(verdict)
        # only the forms this site's verdicts chose keep their 8-bit weights until it settles: a model's every form
        # at every site at once would hold as much again as its 16-bit weights
        site.keep_candidates({v.form for (name, _), v in self.gate.verdicts.items() if name == site.name})
        if verdict.form is None and site.custody.released_to is not None:
            site.unsettle()  # a live shape the host serves: its weight back on the device
        return host_out

    def _judge(self, site: LinearRouter, call: LinearCall, x: torch.Tensor, host: Callable[[], torch.Tensor],
               host_out: torch.Tensor) -> Verdict:
        refusals: list[Refusal] = []
        entrants: list[Entrant] = []
        # a plan for a compiled model that asks for ``device_time`` times on the device (``gate.replay``): the host's
        # product and each form's call replayed from CUDA graphs, as the graph runs them, with none of their Python
        replayed = (self.setting.compiled and self.setting.device_time and not self.device_time_off
                    and replay_clocks(x.device))
        host_clock = ReplayClock(host, f"the host's product at {site.name}", x.device) if replayed else None
        for name, form in self.forms.items():
            if self.setting.forms is not None and name not in self.setting.forms:
                refusals.append(Refusal(name, NOT_ALLOWED, f"not among the named linear forms "
                                                           f"{list(self.setting.forms)}"))
                continue
            reasons = site.usable(name, call)
            blocked = reasons[0] if reasons else site.mismatch(x)
            if blocked:
                kind = UNAVAILABLE if blocked.startswith("unavailable") else UNSUPPORTED
                refusals.append(Refusal(name, kind, blocked))
                continue
            try:
                weights = site.weights_for(name)  # made once per site, kept until it settles
            except Exception as exc:
                refusals.append(Refusal(name, RAISED, f"quantizing the weight: {type(exc).__name__}: {exc}"[:300]))
                continue

            def run(form=form, weights=weights) -> torch.Tensor:
                return site.run_form(form, x, weights)

            # else timed whole, as eagerly: a form whose quantization does not fuse, or a site quantizing apart
            alone = self.setting.compiled and form.quantization_fuses and not site.quantizes_apart
            timed = _product(form, x, weights, site.module.bias) if alone else None
            variant = COMPILED_TIMING if alone else ""
            if replayed:
                timed = ReplayClock(timed or run, f"{name} at {site.name}", x.device)
                variant = f"{COMPILED_TIMING if alone else 'compiled: whole'}, {DEVICE_TIME}"
            entrants.append(Entrant(name, form.precision.value, TimingKey(name, call.shape_key, variant), run, _same,
                                    lambda weights=weights: weights.nbytes, timed=timed, timed_host=host_clock,
                                    compiles_ahead=form.compiles_ahead))
        book = self.gate.book if self.profile.share_timing else TimingBook()
        result = contest(site.name, call.shape_key, entrants, host, host_out, self.profile, book, x.device)
        if book is not self.gate.book:
            self.gate.book.timed += book.timed
        if host_clock is not None and host_clock.failure is not None:  # no host time to compare with: eagerly again
            self._device_time_failed(site.name, host_clock.failure)
            return self._judge(site, call, x, host, host_out)
        chosen = result.chosen
        return Verdict(site.name, call.shape_key, chosen.form if chosen else None, "measured", chosen,
                       result.measured, tuple(refusals) + result.refusals)

    def _device_time_failed(self, site_name: str, exc: CaptureFailed) -> None:
        """The host's product at a site could not be captured in a CUDA graph: this site and every later one are timed
        eagerly (under the eager timing keys). Such a capture fails for a reason of the process (the driver, a
        profiler, another capture in flight), not of one site, and a plan whose every form were refused for want of
        a host time to compare with would leave the model as it came, silently."""
        self.device_time_off = str(exc)  # it names the site
        logger.warning("ditgate gate: linear sites timed eagerly, not on the device, from %s on: %s", site_name, exc)


def _product(form: LinearForm, x: torch.Tensor, weights, bias: torch.Tensor | None) -> Callable[[], torch.Tensor]:
    """The form's product on ``x`` quantized once, at its first timed call (``compiled``): what a compiled graph
    runs of the form apart from the fused quantization."""
    quantized: list = []

    def product() -> torch.Tensor:
        if not quantized:
            quantized.extend(form.quantize_input(x.reshape(-1, x.shape[-1]), weights))
        return form.product(quantized[0], quantized[1], x.dtype, weights, bias)

    return product


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def settle_sites(routers: Sequence[LinearRouter], verdicts: dict[tuple[str, str], Verdict]) -> None:
    """Each site's weights after calibration: one form everywhere -> its 8-bit weights replace the host's on the
    device; the host everywhere -> the candidates go and the module runs its own forward again (``step_aside``);
    mixed -> both stay (each shape served as its verdict says)."""
    chosen: dict[str, set[str | None]] = {}
    for (site, _), v in verdicts.items():
        chosen.setdefault(site, set()).add(v.form)
    for router in routers:
        forms = chosen.get(router.name)
        if not forms:
            continue  # never called: it measures on its first call
        if len(forms) == 1:
            router.settle(next(iter(forms)))
            if forms == {None}:
                router.step_aside()
