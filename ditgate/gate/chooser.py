"""The measuring chooser: calibrates each site on its live calls and serves the verdicts.

While calibrating, every call is served by the host (so calibration changes no result) and, the
first time a site sees a shape key, every candidate form is measured in place on that call's real
inputs: accuracy against the host's output, memory, then paired interleaved timing. Nothing of the
inputs is stored. Verdicts hold per (site, shape key) and nowhere else.

A shape key first seen after calibration is, by default, measured on that call (``on_new_shape=
"measure"``: the call pays the measuring once and is still served by the host); ``"host"`` instead
serves it by the host with the reason "not calibrated", for deployments that want no measuring after
start-up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from ..forms import SPARSE_PRIORITY, AttentionCall, AttentionInputs, Form, Precision
from ..router import Decision, SiteRouter
from .accuracy import compare
from .memory import measure_memory
from .profiles import Profile
from .timing import paired_timing
from .verdict import (
    LESS_ACCURATE,
    NOT_ALLOWED,
    OUTRANKED,
    OVER_MEMORY,
    RAISED,
    SLOWER,
    UNAVAILABLE,
    UNSUPPORTED,
    Measurement,
    Refusal,
    Verdict,
)

logger = logging.getLogger("ditgate.gate")

LIVE, CALIBRATING, HOST_PASS, ROUTED_PASS = "live", "calibrating", "host-pass", "routed-pass"
ON_NEW_SHAPE = ("measure", "host")


class GateChooser:
    def __init__(self, profile: Profile, forms: dict[str, Form], on_new_shape: str = "measure",
                 progress: Callable[[Verdict], None] | None = None, sparse_forms: tuple[str, ...] = ()) -> None:
        if on_new_shape not in ON_NEW_SHAPE:
            raise ValueError(f"on_new_shape must be one of {ON_NEW_SHAPE}, not {on_new_shape!r}")
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
        else:  # block-sparse forms only where a sparse setting (or the caller, by name) asks for them
            names = tuple(n for n in self.forms if n not in SPARSE_PRIORITY or n in self.sparse_forms)
        keep = [n for n in names if n in self.forms and self.forms[n].precision in p.precisions]
        exact = [n for n in keep if self.forms[n].precision is Precision.EXACT]
        bounded = [n for n in keep if self.forms[n].precision is Precision.BOUNDED]
        return exact + bounded

    # --- Chooser protocol --------------------------------------------------------------------------
    def decide(self, site: SiteRouter, call: AttentionCall) -> Decision:
        if self.mode == HOST_PASS:
            return Decision(None, "whole-model check: host pass")
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
        with torch.no_grad():
            host_out = host()
            verdict = self._measure_site(site, call, inputs, host, to_host, host_out)
        self.verdicts[(site.name, call.shape_key)] = verdict
        self.generation += 1
        logger.info("ditgate gate: %s @ %s -> %s", site.name, call.shape_key, verdict.summary)
        if self.progress is not None:
            self.progress(verdict)
        return host_out

    # --- measuring ---------------------------------------------------------------------------------
    def _measure_site(self, site, call, inputs, host, to_host, host_out) -> Verdict:
        p = self.profile
        device = inputs.query.device
        refusals: list[Refusal] = []
        winners: list[Measurement] = []
        measured: list[Measurement] = []
        allowed = set(self.candidates())
        for name, form in self.forms.items():
            if name in allowed:
                continue
            if p.forms is None and name in SPARSE_PRIORITY and name not in self.sparse_forms:
                refusals.append(Refusal(name, NOT_ALLOWED, "block-sparse form: only with attach(..., sparse=...)"))
            elif p.forms is not None and name not in p.forms:
                refusals.append(Refusal(name, NOT_ALLOWED, f"not among the named forms {list(p.forms)}"))
            else:
                refusals.append(Refusal(name, NOT_ALLOWED, f"{form.precision.value} form; profile {p.name} "
                                                           f"allows {sorted(x.value for x in p.precisions)}"))
        for name in self.candidates():
            form = self.forms[name]
            form_call, form_inputs, dense = site.prepare(form, call, inputs, measuring=True)
            if dense:
                refusals.append(Refusal(name, UNSUPPORTED, dense))
                continue
            reasons = site.usable(name, form_call)
            if reasons:
                kind = UNAVAILABLE if reasons[0].startswith("unavailable") else UNSUPPORTED
                refusals.append(Refusal(name, kind, "; ".join(reasons)))
                continue
            if form_inputs is not inputs:  # a sparse form pays its selection on every call: time it too
                def run(form=form):
                    prepared = site.prepare(form, call, inputs, measuring=True)[1]
                    return prepared.finish(form.run(prepared))
            else:
                def run(form=form):
                    return form.run(inputs)
            try:
                out = form_inputs.finish(form.run(form_inputs))  # warm-up (compiles, loads); accuracy sample
                acc = compare(to_host(out), host_out)
                del out
            except Exception as exc:
                refusals.append(Refusal(name, RAISED, f"{type(exc).__name__}: {exc}"[:300]))
                continue
            if not acc.finite or acc.cosine < p.min_call_cosine:
                refusals.append(Refusal(name, LESS_ACCURATE, f"cosine {acc.cosine:.6f} < {p.min_call_cosine} "
                                                             f"(rel L2 {acc.rel_l2:.2e})"))
                continue
            try:
                mem = measure_memory(run, device, form.resident_bytes)
                timing = paired_timing(host, run, device, p.rounds)
            except Exception as exc:
                refusals.append(Refusal(name, RAISED, f"{type(exc).__name__}: {exc}"[:300]))
                continue
            m = Measurement(name, form.precision.value, timing.ratio, timing.ratio_min, timing.ratio_max,
                            timing.host_ms, timing.form_ms, acc.cosine, acc.rel_l2, mem.peak_bytes,
                            mem.resident_bytes)
            measured.append(m)
            if p.max_extra_bytes is not None and max(m.peak_bytes, m.resident_bytes) > p.max_extra_bytes:
                refusals.append(Refusal(name, OVER_MEMORY, f"{max(m.peak_bytes, m.resident_bytes)} B > "
                                                           f"{p.max_extra_bytes} B"))
                continue
            if timing.ratio < p.min_speedup:
                refusals.append(Refusal(name, SLOWER, f"{timing.ratio:.3f}x [{timing.ratio_min:.3f}-"
                                                      f"{timing.ratio_max:.3f}] < {p.min_speedup}x at {call.shape_key}"))
                continue
            winners.append(m)
        chosen = self._pick(winners)
        for m in winners:
            if m is not chosen:
                refusals.append(Refusal(m.form, OUTRANKED, f"passed at {m.ratio:.3f}x but {chosen.form} "
                                                           f"({chosen.precision}) at {chosen.ratio:.3f}x was chosen"))
        return Verdict(site.name, call.shape_key, chosen.form if chosen else None, "measured", chosen,
                       tuple(measured), tuple(refusals))

    def _pick(self, winners: list[Measurement]) -> Measurement | None:
        """Fastest exact winner; a bounded form only if it beats that by the speed threshold too."""
        exact = [m for m in winners if m.precision == Precision.EXACT.value]
        bounded = [m for m in winners if m.precision != Precision.EXACT.value]
        best_exact = max(exact, key=lambda m: m.ratio, default=None)
        best_bounded = max(bounded, key=lambda m: m.ratio, default=None)
        if best_bounded is not None and (
            best_exact is None or best_bounded.ratio >= best_exact.ratio * self.profile.min_speedup
        ):
            return best_bounded
        return best_exact

    # --- used by the whole-model check and receipts ------------------------------------------------
    def routed(self) -> list[Verdict]:
        return [v for v in self.verdicts.values() if v.form is not None]

    def revert(self, verdict: Verdict, note: str) -> None:
        self.verdicts[(verdict.site, verdict.shape_key)] = Verdict(
            verdict.site, verdict.shape_key, None, "reverted", verdict.chosen, verdict.measured,
            verdict.refusals + (Refusal(verdict.form or "?", "reverted", note),), note=note,
        )
        self.generation += 1
