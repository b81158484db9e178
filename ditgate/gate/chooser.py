"""The measuring chooser: calibrates each site on its live calls and serves the verdicts.

While calibrating, every call is served by the host (so calibration changes no result) and, the
first time a site sees a shape key, its candidate forms meet in a ``contest`` on that call's real
inputs: speed from the plan's ``TimingBook`` (timed once per form and shape key, by the first site
that needs it, or read from the timing cache), accuracy against this site's host output. Nothing of
the inputs is stored. Verdicts hold per (site, shape key) and nowhere else.

``budget_s`` caps the time spent measuring: once spent, a site still to be measured takes the verdict
another site reached for its shape key (without an accuracy check here, and says so), or the host.

A shape key first seen after calibration is, by default, measured on that call (``on_new_shape=
"measure"``: the call pays the measuring once and is still served by the host); ``"host"`` instead
serves it by the host with the reason "not calibrated", for deployments that want no measuring after
start-up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from ..forms import SPARSE_PRIORITY, AttentionCall, AttentionInputs, Form, Precision
from ..router import Decision, SiteRouter
from .book import TimingBook, TimingKey
from .contest import Entrant, contest
from .profiles import Profile
from .timing import sync
from .verdict import NOT_ALLOWED, UNAVAILABLE, UNSUPPORTED, Refusal, Verdict

logger = logging.getLogger("ditgate.gate")

LIVE, CALIBRATING, HOST_PASS, ROUTED_PASS = "live", "calibrating", "host-pass", "routed-pass"
# the whole-model check's timed pass where some routes' speed is judged per site alone (``per_site_speed``): those
# sites take the host in it, every other route is served
TIMING_PASS = "timing-pass"
ON_NEW_SHAPE = ("measure", "host")


class GateChooser:
    def __init__(self, profile: Profile, forms: dict[str, Form], on_new_shape: str = "measure",
                 progress: Callable[[Verdict], None] | None = None, sparse_forms: tuple[str, ...] = (),
                 book: TimingBook | None = None, budget_s: float | None = None) -> None:
        if on_new_shape not in ON_NEW_SHAPE:
            raise ValueError(f"on_new_shape must be one of {ON_NEW_SHAPE}, not {on_new_shape!r}")
        if budget_s is not None and budget_s < 0:
            raise ValueError(f"calibration_budget_s must be >= 0 (or None: no cap), got {budget_s}")
        self.profile = profile
        self.forms = forms
        self.on_new_shape = on_new_shape
        self.progress = progress
        # routes are kept per call signature until this changes (``router.Chooser``): bumped by every mode change
        # and every verdict stored or reverted; code that writes ``verdicts`` directly bumps it too
        self.generation = 0
        self.mode = LIVE
        self.sparse_forms = sparse_forms  # block-sparse consumers the plan's sparse setting names
        self.verdicts: dict[tuple[str, str], Verdict] = {}
        self.book = book if book is not None else TimingBook()
        self.budget_s = budget_s
        self.spent_s = 0.0  # seconds spent measuring so far (what the budget caps)
        self.host_s = 0.0  # of those, the host's own calls at the sites measured (its output is what they return)
        self.agreement = None  # a context-parallel model's ranks settle on one verdict (``agree.RankAgreement``)
        # (site, shape key) routes whose speed the whole-model check leaves to their own verdicts: a compiled plan's
        # linear routes, which the check's eager forwards do not run as the graph will (a row-wise form's input
        # quantization fuses into the kernel that makes it there; ``gate.linear.LinearSetting.compiled``)
        self.per_site_speed: set[tuple[str, str]] = set()

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        self._mode = mode
        self.generation += 1

    # --- candidates --------------------------------------------------------------------------------
    def candidates(self) -> list[str]:
        """Candidate form names in precision-first order (exact forms first), as the profile allows."""
        p = self.profile
        if p.forms is not None:
            names = p.forms
        else:  # block-sparse forms only where a sparse setting (or the caller, by name) asks for them; forms that
            # compile per shape only where named
            names = tuple(n for n in self.forms if (n not in SPARSE_PRIORITY or n in self.sparse_forms)
                          and (not self.forms[n].spec.compiles_per_shape or n in self.sparse_forms))
        keep = [n for n in names if n in self.forms and self.forms[n].precision in p.precisions]
        exact = [n for n in keep if self.forms[n].precision is Precision.EXACT]
        bounded = [n for n in keep if self.forms[n].precision is Precision.BOUNDED]
        return exact + bounded

    # --- Chooser protocol --------------------------------------------------------------------------
    def decide(self, site: SiteRouter, call: AttentionCall) -> Decision:
        if self.mode == HOST_PASS:
            return Decision(None, "whole-model check: host pass")
        if self.mode == TIMING_PASS and (site.name, call.shape_key) in self.per_site_speed:
            return Decision(None, "whole-model check: timed without this route (its speed judged at its site)")
        verdict = self.verdicts.get((site.name, call.shape_key))
        if self.mode == CALIBRATING:
            return Decision(None, "calibrating") if verdict is not None else Decision(None, measure=True)
        if verdict is None:
            if self.on_new_shape == "measure" and self.mode == LIVE:
                return Decision(None, measure=True)
            return Decision(None, f"shape {call.shape_key} not calibrated")
        if verdict.form is None:
            return Decision(None, verdict.summary)
        return Decision(verdict.form)

    def measure(self, site: SiteRouter, call: AttentionCall, inputs: AttentionInputs,
                host: Callable[[], torch.Tensor], to_host: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        started = time.perf_counter()
        with torch.no_grad():
            host_out = self.call_host(host, inputs.query.device)
            if self.budget_spent:
                verdict = self._after_budget(site.name, call.shape_key)
            else:
                verdict = self._measure_site(site, call, inputs, host, to_host, host_out)
        self.spent_s += time.perf_counter() - started
        if self.agreement is not None:
            verdict = self.agreement.verdict(site.module_path, verdict)
        self.record(verdict)
        return host_out

    def call_host(self, host: Callable[[], torch.Tensor], device: torch.device) -> torch.Tensor:
        """The host's call at a site being measured, finished and counted in ``host_s``: so that the contest's first
        synchronisation does not charge it to the first form it runs (at HunyuanVideo's 67576 tokens a host call is a
        tenth of a second or more)."""
        started = time.perf_counter()
        out = host()
        sync(device)
        self.host_s += time.perf_counter() - started
        return out

    def record(self, verdict: Verdict) -> None:
        """Keep a verdict made at a site (attention or linear), log it and tell the progress display."""
        self.verdicts[(verdict.site, verdict.shape_key)] = verdict
        self.generation += 1
        logger.info("ditgate gate: %s @ %s -> %s", verdict.site, verdict.shape_key, verdict.summary)
        if self.progress is not None:
            self.progress(verdict)

    # --- the calibration budget --------------------------------------------------------------------
    @property
    def budget_spent(self) -> bool:
        return self.budget_s is not None and self.spent_s >= self.budget_s

    def _after_budget(self, site: str, shape_key: str) -> Verdict:
        """A site reached after the budget: the verdict another site reached for this shape key, or the host."""
        spent = f"calibration budget of {self.budget_s:g} s spent"
        for v in self.verdicts.values():
            if v.shape_key == shape_key and v.source == "measured":
                return Verdict(site, shape_key, v.form, "shared", v.chosen, v.measured, v.refusals,
                               note=f"{spent}: the verdict of {v.site} for this shape, accuracy not checked here")
        return Verdict(site, shape_key, None, "budget", None, (), (),
                       note=f"{spent} before any site with this shape was measured")

    # --- measuring ---------------------------------------------------------------------------------
    def _not_allowed(self) -> list[Refusal]:
        p = self.profile
        refusals = []
        allowed = set(self.candidates())
        for name, form in self.forms.items():
            if name in allowed:
                continue
            if p.forms is None and name in SPARSE_PRIORITY and name not in self.sparse_forms:
                refusals.append(Refusal(name, NOT_ALLOWED, "block-sparse form: only with attach(..., sparse=...)"))
            elif p.forms is None and form.spec.compiles_per_shape:
                refusals.append(Refusal(name, NOT_ALLOWED, "compiles a kernel per shape (seconds each); measured only "
                                                           "when named: attach(..., forms=[...])"))
            elif p.forms is not None and name not in p.forms:
                refusals.append(Refusal(name, NOT_ALLOWED, f"not among the named forms {list(p.forms)}"))
            else:
                refusals.append(Refusal(name, NOT_ALLOWED, f"{form.precision.value} form; profile {p.name} "
                                                           f"allows {sorted(x.value for x in p.precisions)}"))
        return refusals

    def _variant(self, site: SiteRouter, form: Form, call: AttentionCall, form_call: AttentionCall) -> str:
        """What besides the shape key changes a form's work at this site: the host's calling convention, the keys
        a padding cut left, and a sparse selection's pattern and budget."""
        parts = [site.convention.value]
        if form_call.shape_key != call.shape_key:
            parts.append(form_call.shape_key)
        stage = site.context.sparse
        if form.spec.takes_selection and stage is not None:
            st = stage.setting
            parts.append(f"sparse:{st.pattern}:{st.schedule.budget:g}:{st.block}")
        return "|".join(parts)

    def _measure_site(self, site, call, inputs, host, to_host, host_out) -> Verdict:
        refusals = self._not_allowed()
        entrants: list[Entrant] = []
        for name in self.candidates():
            form = self.forms[name]
            form_call, form_inputs, dense = site.prepare(form, call, inputs, measuring=True)
            if dense:
                refusals.append(Refusal(name, UNSUPPORTED, dense))
                continue
            # availability (imports) only for a form that is to run, or to say why it cannot (unavailable first)
            reasons = site.usable(name, form_call, probe=False) and site.usable(name, form_call)
            if reasons:
                kind = UNAVAILABLE if reasons[0].startswith("unavailable") else UNSUPPORTED
                refusals.append(Refusal(name, kind, "; ".join(reasons)))
                continue
            if form_inputs is not inputs:  # a sparse form pays its selection (a padding cut, its cut) on every call
                def run(form=form):
                    prepared = site.prepare(form, call, inputs, measuring=True)[1]
                    return prepared.finish(form.run(prepared))
            else:
                def run(form=form):
                    return form.run(inputs)
            key = TimingKey(name, call.shape_key, self._variant(site, form, call, form_call))
            entrants.append(Entrant(name, form.precision.value, key, run, to_host, form.resident_bytes,
                                    ready=lambda name=name, c=form_call: "; ".join(site.usable(name, c)),
                                    warms_in_thread=form.warms_in_thread and not form.spec.compiles_per_shape,
                                    compiles_ahead=form.compiles_ahead and not form.spec.compiles_per_shape))
        book = self.book if self.profile.share_timing else TimingBook()
        result = contest(site.name, call.shape_key, entrants, host, host_out, self.profile, book,
                         inputs.query.device)
        if book is not self.book:
            self.book.timed += book.timed  # a private book's timings still count
        chosen = result.chosen
        return Verdict(site.name, call.shape_key, chosen.form if chosen else None, "measured", chosen,
                       result.measured, tuple(refusals) + result.refusals)

    # --- used by the whole-model check and receipts ------------------------------------------------
    def routed(self) -> list[Verdict]:
        return [v for v in self.verdicts.values() if v.form is not None]

    def revert(self, verdict: Verdict, note: str) -> None:
        self.verdicts[(verdict.site, verdict.shape_key)] = Verdict(
            verdict.site, verdict.shape_key, None, "reverted", verdict.chosen, verdict.measured,
            verdict.refusals + (Refusal(verdict.form or "?", "reverted", note),), note=note,
        )
        self.generation += 1
