"""``attach`` and ``Plan``: one verb that routes a model's attention, and the object that undoes it.

``attach(pipe_or_model)`` finds every attention site of every denoiser, puts a routed clone of each
processor in place (nothing process-wide is patched), and returns a ``Plan``. By default the plan
measures: the first forward of each denoiser (or the caller's ``calibrate`` callable) calibrates every
site on its real inputs while the host serves the calls, then a whole-model check confirms the routes.
``measure=False`` skips measurement: the first usable form of the caller's ``forms`` (or of the
documented exact priority) serves each call. ``plan.detach()`` puts back the original processor
objects: the model is then exactly as it was. ``linear=...`` routes the denoisers' ``nn.Linear`` sites too
(``api.linear``): 8-bit forms gated per site beside attention, the host's weights restored on detach.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import __version__
from ..forms import EXACT_PRIORITY, Form, Precision, check_form_names, create_forms, form_info
from ..forms.linear import LINEAR_OPT_IN, LINEAR_PRIORITY, create_linear_forms, linear_classes
from ..gate import (
    GateChooser,
    Profile,
    Receipt,
    ReceiptMismatchError,
    Verdict,
    WholeModelCheck,
    environment,
    load_receipt,
    resolve_profile,
    whole_model_check,
)
from ..gate.agree import RankAgreement
from ..gate.book import TimingBook
from ..gate.cache import TimingCache
from ..gate.chooser import CALIBRATING, LIVE
from ..gate.linear import LinearGateChooser, LinearSetting, linear_floors, linear_setting
from ..gate.progress import CalibrationProgress
from ..gate.receipt import now
from ..gate.whole_memo import RememberedCheck, check_key
from ..hosts import (EagerForward, denoisers_of, disarm, find_attention_modules, is_routed, model_output,
                     plan_interception, routed_processor)
from ..hosts.intercept import guard_copies
from ..hosts.parallel import parallel_records
from ..hosts.pipeline import compiled_wrappers
from ..hosts.regional import make_room
from ..hosts.stateful_hooks import stateful_hooks_skipped
from ..kernels import triton_key_memo
from ..router import ModuleRouter, RouteEvent, RouterContext, StaticChooser, make_observer
from ..router.linear import StaticLinearChooser
from ..sparse.padding import PaddingKeys
from ..sparse.stage import SparseSetting, SparseStage
from .explain import explain as render_explain
from .linear import LinearPart, serving_route
from .report import PlanReport, SiteRecord, SkippedModule, SparseRecord

logger = logging.getLogger("ditgate")


class AlreadyAttachedError(RuntimeError):
    pass


@dataclass
class _Attached:
    module: torch.nn.Module
    original: object
    routed: object
    router: ModuleRouter


def _device_of(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _models_info(denoisers) -> dict:
    return {name: {"class": type(m).__name__, "attention_modules": len(find_attention_modules(m))}
            for name, m in denoisers}


class Plan:
    """The routes of one attach. Owns every piece of state ditgate holds for these models."""

    def __init__(self, target: object, denoisers: list[tuple[str, torch.nn.Module]], forms: dict[str, Form],
                 chooser, mode: str, profile: Profile | None, order: tuple[str, ...],
                 on_route: Callable[[RouteEvent], None] | None, progress: bool | None = None) -> None:
        self.target = target
        self.denoisers = denoisers
        self.forms = forms
        self.chooser = chooser
        self.mode = mode
        self.profile = profile
        self.order = order
        self.context = RouterContext(forms=forms, chooser=chooser, observe=make_observer(on_route))
        self._attached: list[_Attached] = []
        self._skipped: list[SkippedModule] = []
        self._hooks: list = []
        self._whole: list[WholeModelCheck] = []
        self._calibrated: set[str] = set()
        self._measured: set[str] = set()  # denoisers measured on a forward, their whole-model check still to run
        self._captured: dict[str, tuple[tuple, dict]] = {}
        self._host_outputs: dict[str, torch.Tensor] = {}  # each calibrating forward's output: the host's
        self._checking = False
        self._detached = False
        self._progress_bar = progress  # None: a bar on a terminal, log lines elsewhere
        self._progress: CalibrationProgress | None = None
        self.device = _device_of(denoisers[0][1])
        self.linear: LinearPart | None = None  # the linear sites, with attach(..., linear=...)

    # --- attaching -----------------------------------------------------------------------------------
    def _install(self) -> None:
        for name, model in self.denoisers:
            for found in find_attention_modules(model, prefix=name):
                proc = found.module.processor
                ip = plan_interception(proc)
                if not ip.conventions:
                    self._skipped.append(SkippedModule(found.path, ip.reason))
                    logger.warning("ditgate: %s stays on the host path: %s", found.path, ip.reason)
                    continue
                router = ModuleRouter(self.context, found, proc, ip.conventions)
                routed = routed_processor(proc, router.entries(), router.begin_invocation)
                setattr(found.module, "processor", routed)
                self._attached.append(_Attached(found.module, proc, routed, router))
        if self._attached:  # regional compilation (compile_repeated_blocks) compiles each routed block apart
            make_room([model for _, model in self.denoisers])
        self._hooks += [guard_copies(model) for _, model in self.denoisers]
        # masks that hide only padding (HunyuanVideo's): installed before the sparse stage, whose hook reuses them
        padding = self.context.padding = PaddingKeys()
        for name, model in self.denoisers:
            self._hooks += padding.install(name, model, self._paths_of(name))

    def _install_sparse(self, setting: SparseSetting) -> None:
        """The plan's sparse stage: layout and step hooks on each denoiser, shared by every site."""
        stage = SparseStage(setting, self.context.padding)
        self.context.sparse = stage
        for name, model in self.denoisers:
            self._hooks += stage.install(name, model, self._paths_of(name))

    def _install_linear(self, setting: LinearSetting, chooser) -> None:
        measuring = not isinstance(chooser, StaticLinearChooser)
        self.linear = LinearPart(setting, chooser.forms if measuring else create_linear_forms(setting.forms),
                                 chooser, self.context, measuring)
        self.linear.install(self.denoisers, None if isinstance(self.target, torch.nn.Module) else self.target)
        make_room([model for _, model in self.denoisers])  # linear routers are per block too (hosts.regional)
        if not measuring:
            self.linear.settle_static()

    def _paths_of(self, name: str) -> list[str]:
        """The routed attention modules' paths of the denoiser ``name``."""
        return [a.router.found.path for a in self._attached
                if a.router.found.path == name or a.router.found.path.startswith(self._prefix(name))]

    @property
    def sparse(self):
        """The plan's ``SparseStage`` (None without ``attach(..., sparse=...)``)."""
        return self.context.sparse

    def _prefix(self, name: str) -> str:
        return f"{name}." if name else ""

    def _install_live_calibration(self) -> None:
        """Calibrate on each denoiser's first real forward, then run its whole-model check (in a forward hook, after
        the forward's own). That forward runs eagerly even under a torch.compile wrapper (``EagerForward``:
        measuring never happens in a graph); where the hook ran inside a graph, the check runs at the start of the
        next forward instead."""
        for name, model in self.denoisers:
            handles: list = []

            def finish(name=name, model=model, handles=handles) -> None:
                self._measured.discard(name)
                self._finish_calibration(name, model)
                for h in handles:
                    h.remove()

            def around(args, kwargs, run, name=name, model=model, finish=finish):
                if name in self._measured:  # measured on a forward whose hooks ran in a graph
                    finish()
                if self._checking or name in self._calibrated:
                    return run()
                self._read_layouts(name, model, args, kwargs)
                self._captured[name] = (args, kwargs)
                self._start_progress(name, self._site_count(name))
                self.chooser.mode = CALIBRATING
                try:
                    output = run()
                    self._keep_host_output(name, output)
                    return output
                finally:
                    self.chooser.mode = LIVE
                    self._end_progress()
                    self._measured.add(name)

            def post(module, args, kwargs, output, name=name, finish=finish):
                if name in self._measured and not torch.compiler.is_compiling():
                    finish()

            handles += [EagerForward(model, around, compiled_wrappers(self.target, model)),
                        model.register_forward_hook(post, with_kwargs=True)]
            self._hooks += handles

    def _keep_host_output(self, name: str, output: object) -> None:
        """The calibrating forward's output (the host served every call of it): what a remembered whole-model check
        compares its one routed pass with (``gate.whole_memo``). A copy: a pipeline may change its output in place."""
        if name not in self._host_outputs:
            out = model_output(output)
            if isinstance(out, torch.Tensor):
                self._host_outputs[name] = out.detach().clone()

    def _remembered_check_key(self, name: str, model: torch.nn.Module, args: tuple, kwargs: dict) -> str | None:
        """The timing cache's key of this denoiser's whole-model check, or None where none is remembered: no cache,
        or a context-parallel model (its ranks must run the same forwards)."""
        if self.chooser.book.cache is None or self.chooser.agreement.is_parallel(name):
            return None
        routes = [v for v in self.chooser.routed() if not name or v.site.startswith(self._prefix(name))]
        setting = repr(self.context.sparse.setting) if self.context.sparse is not None else ""
        if self.linear is not None:
            setting += f"|{self.linear.setting!r}"
        return check_key(model, args, kwargs, self.chooser.profile, setting, routes)

    def _read_layouts(self, name: str, model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        """The padding reader's layouts of a forward about to be measured: its pre-hook reads nothing inside a
        compiled graph, and a compiled wrapper may have started this forward (``EagerForward`` runs it eagerly)."""
        if self.context.padding is not None:
            self.context.padding.read(name, model, args, kwargs)

    def _site_count(self, name: str | None) -> int:
        """The sites known so far (of denoiser ``name``, or of all): a module's later calls add sites as they come."""
        paths = [a.router.found.path for a in self._attached for _ in a.router.sites]
        paths += [r.name for r in self.linear.routers] if self.linear is not None else []
        return sum(1 for p in paths if name is None or p == name or p.startswith(self._prefix(name)))

    def _start_progress(self, label: str, total: int) -> None:
        self._progress = CalibrationProgress(label, total, self.chooser.book, bar=self._progress_bar)
        self.chooser.progress = self._progress.site_done

    def _end_progress(self) -> None:
        if self._progress is not None:
            self._progress.close()
        self._progress = None
        self.chooser.progress = None

    def _finish_calibration(self, name: str, model: torch.nn.Module) -> None:
        self._calibrated.add(name)
        captured = self._captured.pop(name, None)
        if captured is None:
            return
        args, kwargs = captured
        key = self._remembered_check_key(name, model, args, kwargs)
        self._checking = True
        self.context.tally = False
        if self.context.sparse is not None:
            self.context.sparse.checking = True  # judge sparse routes as they run on sparse steps
        try:
            with stateful_hooks_skipped(model):  # diffusers' cache hooks neither see nor serve the check
                check = whole_model_check(name, self._prefix(name), lambda: model_output(model(*args, **kwargs)),
                                          self.chooser, _device_of(model), self._host_outputs.pop(name, None),
                                          self.chooser.book.remembered_check(key) if key else None)
            if key and check.passed and check.forwards and not check.from_cache:
                self.chooser.book.remember_check(key, RememberedCheck.of(check, now()))
        finally:
            self._checking = False
            self.context.tally = True
            if self.context.sparse is not None:
                self.context.sparse.checking = False
        self._whole.append(check)
        self.chooser.book.flush()
        triton_key_memo.remember()  # after a miss: the key Triton computed for calibration's first launch, saved
        self._release_losers()
        if self.linear is not None:
            self.linear.settle(self.chooser.verdicts)
            if self.chooser.on_new_shape == "measure":
                handle = self.linear.wake_on_new_shapes(model, self._prefix(name), args, kwargs)
                self._hooks += [handle] if handle is not None else []

    def _release_losers(self) -> None:
        chosen = {v.form for v in self.chooser.verdicts.values() if v.form}
        for name, form in self.forms.items():
            if name not in chosen:
                form.release()

    # --- public API ----------------------------------------------------------------------------------
    def calibrate(self, fn: Callable[[], object]) -> Plan:
        """Run ``fn`` (e.g. ``lambda: pipe(prompt, num_inference_steps=2)``) with every site calibrating.

        The host serves every call while ``fn`` runs, so its results are the host's. Afterwards each
        denoiser that ran gets its whole-model check on the inputs of its first forward.
        """
        if not isinstance(self.chooser, GateChooser):
            raise RuntimeError("this plan does not measure (attach(..., measure=False)); nothing to calibrate")
        self._require_attached()
        capture_handles = []
        for name, model in self.denoisers:
            def pre(module, args, kwargs, name=name):
                if not self._checking and name not in self._captured:
                    self._captured[name] = (args, kwargs)

            def post(module, args, kwargs, output, name=name):
                if not self._checking:
                    self._keep_host_output(name, output)

            capture_handles.append(model.register_forward_pre_hook(pre, with_kwargs=True))
            capture_handles.append(model.register_forward_hook(post, with_kwargs=True))
        # a compiled denoiser runs its original code while it is measured, its whole-model check included
        def around(args, kwargs, run, name, model):
            self._read_layouts(name, model, args, kwargs)
            return run()

        eager = [EagerForward(model, functools.partial(around, name=name, model=model),
                              compiled_wrappers(self.target, model))
                 for name, model in self.denoisers]
        self._start_progress(", ".join(n or "model" for n, _ in self.denoisers), self._site_count(None))
        self.chooser.mode = CALIBRATING
        checked_before = set(self._calibrated)
        try:
            try:
                fn()
            finally:
                self.chooser.mode = LIVE
                self._end_progress()
                for h in capture_handles:
                    h.remove()
            for name, model in self.denoisers:
                if self._detached or name in self._calibrated - checked_before:
                    self._captured.pop(name, None)  # detached inside fn, or checked inside it (live calibration)
                elif name in self._captured:
                    self._finish_calibration(name, model)
                else:
                    logger.warning("ditgate: the calibration callable never ran %s", name or "the model")
        finally:
            for e in eager:
                e.remove()
        return self

    def report(self) -> PlanReport:
        sites = []
        verdicts_by_site: dict[str, list[Verdict]] = {}
        if isinstance(self.chooser, GateChooser):
            for v in self.chooser.verdicts.values():
                verdicts_by_site.setdefault(v.site, []).append(v)
        for att in self._attached:
            for index in sorted(att.router.sites):
                s = att.router.sites[index]
                counts = s.ledger.route_counts()
                serving = serving_route(counts, s.ledger.current_trace_counts())
                sites.append(SiteRecord(
                    name=s.name, module=s.module_path, role=s.role or s.role_hint, call_index=s.call_index,
                    convention=s.convention.value, shapes=tuple(c.shapes_text() + f" {c.dtype}" for c in s.shapes.values()),
                    calls=s.ledger.calls, serving=serving, routes=counts, failures=s.ledger.failure_counts(),
                    verdicts=tuple(verdicts_by_site.get(s.name, ())), compiled=s.ledger.trace_counts(),
                ))
        return PlanReport(
            ditgate_version=__version__,
            mode=self.mode,
            profile=self.profile.to_dict() if self.profile else None,
            order=self.order,
            forms=tuple(form_info(f) for f in self.forms.values()),
            sites=tuple(sites),
            skipped=tuple(self._skipped),
            whole_model=tuple(self._whole),
            environment=environment(self.device),
            detached=self._detached,
            sparse=SparseRecord(*self.context.sparse.describe()) if self.context.sparse is not None else None,
            linear=self.linear.record(self.chooser.verdicts if isinstance(self.chooser, GateChooser) else {})
            if self.linear is not None else None,
            repaired_heads=tuple((name, n) for name, f in self.forms.items() if (n := f.repaired_heads())),
        )

    def explain(self) -> str:
        return render_explain(self.report())

    def receipt(self) -> Receipt:
        if not isinstance(self.chooser, GateChooser):
            raise RuntimeError("a plan made with measure=False has no verdicts; use plan.report().save(path)")
        return Receipt(environment=environment(self.device), models=_models_info(self.denoisers),
                       profile=self.profile, verdicts=tuple(self.chooser.verdicts.values()),
                       whole_model=tuple(self._whole), created=now(), parallel=parallel_records(self.denoisers),
                       linear_histories=self.linear.histories() if self.linear is not None else {},
                       linear_device_time_off=self.linear.device_time_off if self.linear is not None else "")

    def save(self, path: str | Path) -> Path:
        """Write the receipt (environment, profile, every verdict, content hash) to ``path``."""
        return self.receipt().save(path)

    def detach(self) -> None:
        """Put every original processor back and drop all ditgate state. A second call does nothing."""
        if self._detached:
            return
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        for att in self._attached:
            if att.module.processor is att.routed:
                setattr(att.module, "processor", att.original)
            elif att.module.processor is not att.original:  # (the original: restored by an earlier, failed detach)
                logger.warning("ditgate: %s's processor was replaced after attach; leaving the new one in place",
                               att.router.found.path)
            disarm(att.routed)  # a copy kept by the caller calls the host's own code from now on
        for form in self.forms.values():
            form.release()
        if isinstance(self.chooser, GateChooser):
            self.chooser.book.flush()  # what shapes first seen after calibration measured
        self._end_progress()
        failed = None
        if self.linear is not None:
            try:
                self.linear.detach()  # every site it can, the guards off, then the first site's error
            except Exception as exc:
                failed = exc
        self._captured.clear()
        self._host_outputs.clear()
        triton_key_memo.remember()  # static and receipt plans launch Triton only in the caller's forwards
        if failed is not None:
            raise failed  # still attached: a second detach restores what this one could not
        self._detached = True

    @property
    def attached(self) -> bool:
        return not self._detached

    def _require_attached(self) -> None:
        if self._detached:
            raise RuntimeError("this plan was detached")

    def __enter__(self) -> Plan:
        return self

    def __exit__(self, *exc) -> None:
        self.detach()

    def __repr__(self) -> str:
        state = "detached" if self._detached else "attached"
        return f"<ditgate.Plan {state}, {self.mode}, {sum(len(a.router.sites) for a in self._attached)} sites>"


def attach(
    target: object,
    *,
    profile: str | Profile = "quality",
    forms: Sequence[str] | None = None,
    measure: bool = True,
    calibrate: Callable[[], object] | None = None,
    receipt: str | Path | Receipt | None = None,
    on_mismatch: str = "refuse",
    min_speedup: float | None = None,
    on_new_shape: str = "measure",
    on_route: Callable[[RouteEvent], None] | None = None,
    extra_forms: Sequence[Form] = (),
    sparse: SparseSetting | None = None,
    linear: bool | Sequence[str] | LinearSetting | None = None,
    timing_cache: bool | str | Path = True,
    calibration_budget_s: float | None = None,
    progress: bool | None = None,
) -> Plan:
    """Route the attention of ``target`` (a diffusers pipeline or a model) through ditgate.

    profile: "quality" (exact forms only, the default), "balanced", "speed", or a ``Profile``.
    forms: candidate form names; outranks the profile's list (unknown names raise, listing the known).
    measure: False for the static choice (first usable form of ``forms`` or of the exact priority).
    calibrate: a callable run once, every site calibrating, before ``attach`` returns.
    receipt: a saved receipt to re-apply without measuring; ``on_mismatch="measure"`` measures again
        instead of refusing when the environment differs.
    on_new_shape: "measure" (a shape first seen after calibration is measured on that call) or
        "host" (served by the host with the reason "not calibrated").
    sparse: a ``SparseSetting``: the block-sparse forms it names become candidates (bounded error, so
        the profile must allow bounded forms), selections follow its pattern and budget schedule, and
        the gate measures them against the host at each self-attention site and shape.
    linear: route the denoisers' ``nn.Linear`` sites too: True (the default linear forms), linear form names
        (``"fp8_linear"``, ``"int8_linear"``, the opt-in ``"fp8_tensor_linear"``) or a ``LinearSetting`` (forms,
        roles, where the host weights wait, floors). Bounded-error: the profile must allow bounded forms (the quality
        profile never quantizes a linear).
        Measured, each site keeps the form that wins on its live input (speed timed once per shape key); static
        (``measure=False``), each per-token site takes the first form whose envelope serves it.
    timing_cache: True (the default file, ``gate.cache.default_cache_path()``), a path, or False: timings
        measured in an earlier process with the same environment are reused, so only accuracy is measured.
    calibration_budget_s: a cap on the seconds spent measuring; a site reached after it takes the verdict
        another site reached for its shape key (saying so), or the host.
    progress: calibration progress as a bar (True), as log lines (False), or a bar on a terminal only (None).
    """
    if sparse is not None and not isinstance(sparse, SparseSetting):
        raise TypeError(f"sparse must be a SparseSetting, not {type(sparse).__name__}")
    linear_set = linear_setting(linear)
    if on_mismatch not in ("refuse", "measure"):
        raise ValueError(f"on_mismatch must be 'refuse' or 'measure', not {on_mismatch!r}")
    denoisers = denoisers_of(target)
    for name, model in denoisers:
        for found in find_attention_modules(model, prefix=name):
            if is_routed(found.module.processor):
                raise AlreadyAttachedError(
                    f"{found.path} is already routed by a ditgate plan; detach that plan before attaching again")
    extra_names = tuple(f.name for f in extra_forms)
    # before any form is probed or launched: every route (measured, static, receipt) starts here
    triton_key_memo.install(require_cuda=True)
    all_forms = create_forms()
    for f in extra_forms:
        all_forms[f.name] = f
    loaded: Receipt | None = None
    if receipt is not None:
        loaded = receipt if isinstance(receipt, Receipt) else load_receipt(receipt)
        diffs = loaded.check_environment(environment(_device_of(denoisers[0][1])), _models_info(denoisers),
                                         parallel_records(denoisers))
        unknown = sorted({v.form for v in loaded.verdicts if v.form is not None and v.form not in all_forms
                          and v.form not in linear_classes()})
        if unknown:  # a form passed as extra_forms when the receipt was measured, not now
            diffs.append(f"its verdicts name forms this plan does not have: {', '.join(unknown)} (extra_forms?)")
        if diffs and on_mismatch == "refuse":
            raise ReceiptMismatchError(diffs)
        if diffs:
            logger.warning("ditgate: receipt environment differs (%d differences); measuring again", len(diffs))
            loaded = None
    if not measure:
        order = tuple(forms) if forms is not None else EXACT_PRIORITY
        check_form_names(order, extra_names)
        if forms is None:
            order = tuple(n for n in order if all_forms[n].precision is Precision.EXACT)
        chosen_forms = {n: all_forms[n] for n in order}
        plan = Plan(target, denoisers, chosen_forms, StaticChooser(order), "static", None, order, on_route)

        def install_static() -> None:
            plan._install()
            if sparse is not None:
                plan._install_sparse(sparse)
            if linear_set is not None:
                plan._install_linear(linear_set, StaticLinearChooser({}))

        return _installed(plan, install_static)
    prof = loaded.profile if loaded is not None else resolve_profile(profile, forms, min_speedup, extra_names)
    if sparse is not None and Precision.BOUNDED not in prof.precisions:
        raise ValueError(f"sparse attention is bounded-error; profile {prof.name!r} allows exact forms only "
                         "(use profile='balanced' or 'speed', or a Profile that allows bounded forms)")
    device = _device_of(denoisers[0][1])
    cache = None
    if timing_cache is not False and timing_cache is not None:
        cache = TimingCache(None if timing_cache is True else timing_cache)
    floors = linear_floors(prof, linear_set) if linear_set is not None else None
    chooser = GateChooser(prof, all_forms, on_new_shape=on_new_shape,
                          sparse_forms=sparse.forms if sparse is not None else (),
                          book=TimingBook(cache, environment(device)), budget_s=calibration_budget_s)
    chooser.agreement = RankAgreement(denoisers)
    plan = Plan(target, denoisers, all_forms, chooser, "receipt" if loaded else "measured", prof,
                tuple(chooser.candidates()), on_route, progress)

    def install_measured() -> None:
        plan._install()
        if sparse is not None:
            plan._install_sparse(sparse)
        if linear_set is not None:
            named = tuple(linear_set.forms or ()) + tuple(v.form for v in (loaded.verdicts if loaded else ())
                                                          if v.form in LINEAR_OPT_IN)  # a receipt's choices too
            candidates = tuple(dict.fromkeys(LINEAR_PRIORITY + named))  # opt-in forms where named
            linear_chooser = LinearGateChooser(chooser, create_linear_forms(candidates), linear_set, floors)
            plan._install_linear(linear_set, linear_chooser)
        if loaded is not None:
            for v in loaded.verdicts:
                chooser.verdicts[(v.site, v.shape_key)] = dataclasses.replace(v, source="receipt")
            plan._whole = list(loaded.whole_model)
            plan._calibrated = {name for name, _ in denoisers}
            if plan.linear is not None:
                plan.linear.settle(chooser.verdicts, loaded.linear_histories)
        elif calibrate is not None:
            plan.calibrate(calibrate)
        else:
            plan._install_live_calibration()

    return _installed(plan, install_measured)


def _installed(plan: Plan, install: Callable[[], None]) -> Plan:
    """``plan`` after ``install`` (its processors, hooks, linear routers and guards, and a calibration); where that
    raises (a calibration interrupted, a site that cannot be read), what it installed is taken off again before the
    error goes on, so that the model is as it came and can be attached again."""
    try:
        install()
    except BaseException:
        try:
            plan.detach()
        except Exception as exc:  # the first error is the one to see
            logger.error("ditgate: detaching after a failed attach: %s: %s", type(exc).__name__, exc)
        raise
    return plan
