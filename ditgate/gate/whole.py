"""The whole-model check: after every site settled, the model once more with the chosen routes.

Per-site wins do not always add up (launch gaps, caches, a form that is faster alone but slows its
neighbours), and per-call accuracy does not bound the error of the whole. So the denoiser runs again
on the inputs of its calibration forward: one host pass and one routed pass, each timed, the routed
output compared with the host's. That is two forwards when the check passes. One pair of timings is
noisy, so a whole that looks slower is timed again in paired, interleaved rounds before anything is
taken back. If the whole is slower than the host, the routes with the smallest measured gain are taken
back; if its output breaks the profile's floor, the routes whose forms were least accurate at their own
sites (relative L2 error) go first, so that the fast accurate ones stay. Half of the remaining routes per
attempt, all of them on the last, each attempt one more routed pass, until it passes.

A plan for a compiled model judges its linear routes' speed at their sites (``GateChooser.per_site_speed``): an eager
forward runs none of them as the graph will. A row-wise form's verdict times the 8-bit product alone, since inductor
fuses each input's quantization into the kernel that makes it, where an eager forward runs it unfused, launch by launch
(on an image model's short linears the host's launches then outweigh the product: an H100 timed such a forward of
compiled Flux's plan at 0.51x). Its check runs one routed pass with every route for the output floors, and times a pass
where those sites take the host, so that the time judges the other routes; a slow whole then takes back only those.
That is three forwards when the check passes, two where every route is such a linear one (nothing is then timed: the
ratio is nan, and the note says so).

A model whose sites all stayed on the host needs no check (no forward). Where a check that passed for the same
model, inputs and routes is remembered in the timing cache (``whole_memo``), it is replayed: its take-backs are
applied and one routed pass is compared with the host output of the calibrating forward; only a replay whose output
misses the floors runs the full check.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable

import torch

from .accuracy import compare
from .chooser import HOST_PASS, LIVE, ROUTED_PASS, TIMING_PASS, GateChooser
from .timing import paired_timing, time_once
from .verdict import WholeModelCheck
from .whole_memo import RememberedCheck

logger = logging.getLogger("ditgate.gate")

MAX_ATTEMPTS = 3


def whole_model_check(name: str, prefix: str, forward: Callable[[], torch.Tensor], chooser: GateChooser,
                      device: torch.device, host_out: torch.Tensor | None = None,
                      remembered: RememberedCheck | None = None) -> WholeModelCheck:
    """``host_out``: the host's output for these inputs where the caller has it (the calibrating forward's), which a
    replay of ``remembered`` compares with. Returns the check; its ``why`` of a take-back is in ``note``."""
    started = time.perf_counter()
    check = _check(name, prefix, forward, chooser, device, host_out, remembered)
    check = dataclasses.replace(check, seconds=time.perf_counter() - started)
    logger.info("ditgate gate: whole-model check %s: %.3fx, cosine %.6f, %s (%d forwards, %.1f s)", name or "model",
                check.ratio, check.cosine, check.note, check.forwards, check.seconds)
    return check


def _smallest_gain_first(verdict) -> float:
    """A route's place when the whole is too slow: its measured ratio (0 where none was measured)."""
    return verdict.chosen.ratio if verdict.chosen is not None else 0.0


def _least_accurate_first(verdict) -> tuple[float, float]:
    """A route's place when the output misses its floors: the larger the relative L2 error its site measured for its
    form, the sooner (inf where this site measured none: no measurement, or another site's verdict shared after the
    budget was spent); among equals the smaller measured gain first."""
    chosen = verdict.chosen
    err = chosen.rel_l2 if chosen is not None and verdict.source != "shared" else math.nan
    return (-(math.inf if math.isnan(err) else err), _smallest_gain_first(verdict))


def _floors_ok(p, acc) -> bool:
    return acc.finite and acc.cosine >= p.min_output_cosine and (
        p.min_output_psnr is None or acc.psnr_db >= p.min_output_psnr)


def _check(name, prefix, forward, chooser, device, host_out, remembered) -> WholeModelCheck:
    p = chooser.profile
    forwards = 0
    # the ranks of a context-parallel model take each branch together: a forward on one rank only would hang them
    agree = chooser.agreement.flags if chooser.agreement is not None else lambda _, flag: [flag]

    def mine():
        return [v for v in chooser.routed() if not prefix or v.site.startswith(prefix)]

    def run(mode: str) -> torch.Tensor:
        nonlocal forwards
        forwards += 1
        chooser.mode = mode
        with torch.no_grad():
            return forward()

    def timed(mode: str) -> tuple[torch.Tensor, float]:
        out = []
        ms = time_once(lambda: out.append(run(mode)), device)
        return out[0], ms

    reverted: list[str] = []
    attempts = 0
    why = ""
    if not mine():
        return WholeModelCheck(name, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, math.inf, True, 0, (),
                               "no routes: the host serves every site", 0)
    try:
        by_name = {f"{v.site} @ {v.shape_key}": v for v in mine()}
        if remembered is not None and host_out is not None and all(r in by_name for r in remembered.reverted):
            replayed = _replay(name, by_name, remembered, chooser, host_out, lambda: run(ROUTED_PASS), agree)
            if replayed is not None:
                return replayed
            reverted = list(remembered.reverted)
            why = remembered.why
        host_out, host_ms = timed(HOST_PASS)
        while True:
            attempts += 1
            routes = mine()  # the timed pass serves those whose speed is not judged at their sites
            timed_apart = [v for v in routes if (v.site, v.shape_key) not in chooser.per_site_speed]
            apart = len(timed_apart) < len(routes)  # some routes' speed is judged at their sites
            if apart:  # every route for the output, then (if it passes) the time without those routes
                routed_out, routed_ms = run(ROUTED_PASS), math.nan
            else:
                routed_out, routed_ms = timed(ROUTED_PASS)
            acc = compare(routed_out, host_out)
            del routed_out
            floors_ok = all(agree(name, _floors_ok(p, acc)))  # one answer on every rank of a context-parallel model
            if apart and floors_ok and timed_apart:
                routed_ms = timed(TIMING_PASS)[1]
            ratio = lo = hi = host_ms / max(routed_ms, 1e-9)  # nan where nothing was timed
            h_ms, r_ms = host_ms, routed_ms
            # one pair is noisy: confirm before reverting (on every rank of a context-parallel model, if on any)
            if any(agree(name, floors_ok and bool(timed_apart) and ratio < p.min_whole_ratio)):
                timing = paired_timing(lambda: run(HOST_PASS), lambda: run(TIMING_PASS if apart else ROUTED_PASS),
                                       device, p.whole_rounds, target_ms=0.0, lead=False)  # the same on every rank
                ratio, lo, hi, h_ms, r_ms = timing.ratio, timing.ratio_min, timing.ratio_max, timing.host_ms, \
                    timing.form_ms
            passed = all(agree(name, floors_ok and (not timed_apart or ratio >= p.min_whole_ratio)))
            if passed or not routes:
                if not routes:
                    note = (f"every route reverted ({why})" if reverted
                            else "no routes: the host serves every site")
                else:
                    note = f"passed after reverting {len(reverted)} route(s): {why}" if reverted else "passed"
                if apart and not timed_apart:
                    note += "; not timed: every route's speed is judged at its site (a compiled plan's linear routes)"
                elif apart:
                    note += ("; timed without the routes judged at their sites (a compiled plan's linear routes), "
                             "their output checked with the rest")
                break
            timed_as = " (timed without the routes judged at their sites)" if apart else ""
            speed = "" if math.isnan(ratio) else f"whole model {ratio:.3f}x{timed_as}, "
            why = f"{speed}output cosine {acc.cosine:.6f} (floor {p.min_output_cosine}), PSNR {acc.psnr_db:.1f} dB"
            if floors_ok:  # too slow: only the routes the time judged, the smallest measured gains first
                routes = sorted(timed_apart, key=_smallest_gain_first)
            else:  # the output missed its floors: the routes least accurate at their own sites first
                routes = sorted(routes, key=_least_accurate_first)
            take = routes if attempts >= MAX_ATTEMPTS else routes[: max(1, len(routes) // 2)]
            for v in take:
                chooser.revert(v, f"reverted by the whole-model check: {why}")
                reverted.append(f"{v.site} @ {v.shape_key}")
            logger.info("ditgate gate: %s: %s; reverted %d route(s)", name, why, len(take))
    finally:
        chooser.mode = LIVE
    return WholeModelCheck(name, h_ms, r_ms, ratio, lo, hi, acc.cosine, acc.psnr_db, passed, attempts,
                           tuple(reverted), note, forwards)


def _replay(name, routes: dict, remembered: RememberedCheck, chooser: GateChooser, host_out: torch.Tensor,
            routed_pass: Callable[[], torch.Tensor], agree) -> WholeModelCheck | None:
    """The remembered check's take-backs (``routes``: "site @ shape_key" -> verdict), then one routed pass against
    ``host_out``; None (the full check follows, from the routes left) when its output misses the profile's floors."""
    for r in remembered.reverted:
        chooser.revert(routes[r], f"reverted by the whole-model check (remembered in the timing cache, measured "
                                   f"{remembered.measured}): {remembered.why}")
    acc = compare(routed_pass(), host_out)
    if not all(agree(name, _floors_ok(chooser.profile, acc))):
        logger.info("ditgate gate: %s: the remembered whole-model check's output missed the floors here (cosine "
                    "%.6f): checking in full", name or "model", acc.cosine)
        return None
    r = remembered
    note = (f"passed: timing remembered in the timing cache (measured {r.measured}), output checked here"
            + (f"; {len(r.reverted)} route(s) taken back as then ({r.why})" if r.reverted else ""))
    return WholeModelCheck(name, r.host_ms, r.routed_ms, r.ratio, r.ratio_min, r.ratio_max, acc.cosine, acc.psnr_db,
                           True, 1, r.reverted, note, 1, from_cache=True)
