"""One decision for all ranks of a context-parallel denoiser.

Under diffusers' context parallelism every rank runs every attention site on its own shard, and the gate measures
on each rank. Left alone, ranks could settle differently (timing noise, a near tie), and one site would run one
rank's heads by one kernel and another rank's by another. So each verdict is settled across the ranks right after
the measurement that made it - a point every rank reaches in the same order, since every rank runs the same sites
on shards of one shape and holds the same verdicts - and so is the whole-model check's outcome:

- ranks that chose the same route keep rank 0's verdict word for word, so every rank holds the same record (the
  whole-model check takes routes back in the order of their measured gain: the same order on every rank);
- ranks that chose differently take the form that passed on every rank with the best slowest-rank ratio, exact forms
  before bounded ones, or the host where no form passed everywhere;
- the whole-model check times its routes again where any rank asks, and passes only where it passed on every
  rank.

The gate times the local op alone on each rank; the collectives here run after the timing, once per measured site
and shape and once per attempt of the whole-model check, on every rank alike. Under ``ulysses_anything`` or
``ring_anything`` shards may differ in length, so ranks could measure at different calls: there the verdicts are
the host's on every rank, decided without any collective.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..forms import Precision
from ..hosts.parallel import ContextParallel, group_of
from .verdict import OUTRANKED, Verdict


class RankAgreement:
    """The agreement of one plan: its denoisers, read for their context parallelism at each use (a model may be
    parallelised after ``attach``)."""

    def __init__(self, denoisers: list[tuple[str, torch.nn.Module]]) -> None:
        self.denoisers = denoisers

    def _parallel(self, path: str) -> tuple[ContextParallel, object] | None:
        """The context parallelism and process group of the denoiser that ``path`` (a site's module path, or a
        denoiser's name) lies in, or None where it has none."""
        for name, model in self.denoisers:
            if not name or path == name or path.startswith(f"{name}."):
                cp = ContextParallel.of_model(model)
                return (cp, group_of(model)) if cp is not None else None
        return None

    def is_parallel(self, path: str) -> bool:
        """Whether the denoiser of ``path`` runs under context parallelism (its ranks must take the same steps)."""
        return self._parallel(path) is not None

    def verdict(self, site_path: str, verdict: Verdict) -> Verdict:
        """The verdict every rank takes for the site at ``site_path``, from the one this rank measured."""
        found = self._parallel(site_path)
        if found is None:
            return verdict
        cp, group = found
        if cp.refusal():
            return _host(verdict, cp.refusal())
        gathered: list = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, verdict, group=group)
        return settle(gathered)

    def flags(self, name: str, flag: bool) -> list[bool]:
        """Every rank's ``flag`` for a decision of the whole-model check of denoiser ``name`` (this rank's alone
        where it has no context parallelism)."""
        found = self._parallel(name)
        if found is None or found[0].refusal():
            return [bool(flag)]
        gathered: list = [None] * dist.get_world_size(found[1])
        dist.all_gather_object(gathered, bool(flag), group=found[1])
        return gathered


def _host(verdict: Verdict, note: str) -> Verdict:
    return Verdict(verdict.site, verdict.shape_key, None, verdict.source, None, verdict.measured, verdict.refusals,
                   note=note)


def _passed(verdict: Verdict) -> set[str]:
    """The forms that passed every floor on the rank that measured ``verdict``: the chosen one, and those outranked
    that were run there (a form the contest left out on shared timing alone has no accuracy of this site)."""
    checked = {m.form for m in verdict.measured if math.isfinite(m.cosine)}
    passed = {r.form for r in verdict.refusals if r.kind == OUTRANKED and r.form in checked}
    return passed | {verdict.form} if verdict.form else passed


def settle(verdicts: list[Verdict]) -> Verdict:
    """One verdict from each rank's (in rank order), the same on every rank that settles the same list."""
    first = verdicts[0]
    keys = sorted({v.shape_key for v in verdicts})
    if len(keys) > 1:
        return _host(first, f"ranks measured different shapes ({', '.join(keys)}); the host serves all of them")
    if all(v.form == first.form for v in verdicts):
        return first
    chose = ", ".join(f"rank {r}: {v.form or 'host'}" for r, v in enumerate(verdicts))
    everywhere = set.intersection(*(_passed(v) for v in verdicts))
    if not everywhere:
        return _host(first, f"ranks chose differently ({chose}) and no form passed on every rank")

    def slowest(form: str) -> float:
        return min(m.ratio for v in verdicts for m in v.measured if m.form == form)

    precision = {m.form: m.precision for m in first.measured}
    exact = [f for f in everywhere if precision.get(f) == Precision.EXACT.value]
    form = max(sorted(exact or everywhere), key=slowest)
    chosen = next(m for m in first.measured if m.form == form)
    note = f"ranks chose differently ({chose}); {form} passed on every rank, {slowest(form):.3f}x on the slowest"
    return Verdict(first.site, first.shape_key, form, first.source, chosen, first.measured, first.refusals, note=note)
