"""A contest's first calls made side by side (``gate.warm``): each new entrant's first call at a shape key runs in
a thread beside the others', then the contest measures on warm forms one at a time, as before.

The forms here "compile" on their first call by waiting at a barrier that every one of them must reach: run one
after another, the first would wait alone and fail; side by side, all pass. So what is checked is that the first
calls really overlap, with no timing in the assertions."""

import dataclasses
import threading

import pytest
import torch

import ditgate
from ditgate.gate import warm as first_calls
from ditgate.models.presets import get_preset

from .helpers import FakeForm, Tiny

LENIENT = dataclasses.replace(ditgate.PROFILES["quality"], name="lenient", min_speedup=1e-3, min_whole_ratio=1e-3,
                              rounds=2)
NAMES = ("first", "second", "third")


class CompilesOnce(FakeForm):
    """Exact SDPA whose first call waits at a barrier shared with the other forms (its "compile")."""

    def __init__(self, name: str, barrier: threading.Barrier, in_thread: bool = True) -> None:
        super().__init__(name)
        self.barrier, self.compiled, self.threads = barrier, False, set()
        self.warms_in_thread = in_thread

    def run(self, inputs):
        self.threads.add(threading.current_thread().name)
        if not self.compiled:
            self.barrier.wait(timeout=2)  # BrokenBarrierError unless every form's first call is running now
            self.compiled = True
        return super().run(inputs)


def _attach(forms, profile=LENIENT):
    preset = get_preset("tiny-wan")
    tiny = Tiny(dataclasses.replace(preset, config={**preset.config, "num_layers": 2}))
    plan = ditgate.attach(tiny.model, profile=profile, forms=[f.name for f in forms], extra_forms=list(forms),
                          timing_cache=False)
    tiny.forward()
    return plan


@pytest.fixture
def on_cpu(monkeypatch):
    """Threads on the CPU for these torch-only forms (conftest's TRITON_INTERPRET=1 would forbid them)."""
    monkeypatch.setattr(first_calls, "WARM_DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(first_calls, "allowed_on", lambda device: device.type in first_calls.WARM_DEVICE_TYPES)


def test_first_calls_run_side_by_side_and_the_contest_then_decides_as_before(on_cpu):
    barrier = threading.Barrier(len(NAMES))
    forms = [CompilesOnce(n, barrier) for n in NAMES]
    plan = _attach(forms)
    verdicts = list(plan.chooser.verdicts.values())
    assert verdicts and all(v.form in NAMES for v in verdicts), [v.summary for v in verdicts]
    for f in forms:
        assert f.compiled and any(t.startswith("ditgate-warm") for t in f.threads), f.threads
    first = [m for v in verdicts for m in v.measured if m.timed_at == v.site and not m.from_cache]
    assert {m.form for m in first} == set(NAMES) and all(m.first_ms > 0 for m in first)
    assert not barrier.broken


def test_one_after_another_the_same_first_calls_cannot_meet(on_cpu):
    """The check of the check: without warming ahead, the barrier breaks and every form is refused as raising."""
    barrier = threading.Barrier(len(NAMES))
    forms = [CompilesOnce(n, barrier) for n in NAMES]
    plan = _attach(forms, dataclasses.replace(LENIENT, warm_ahead=False))
    first_site = next(iter(plan.chooser.verdicts.values()))
    assert first_site.form is None
    assert {r.form for r in first_site.refusals if r.kind == "raised"} == set(NAMES)


def test_a_form_that_opts_out_is_not_run_in_a_thread(on_cpu):
    barrier = threading.Barrier(2)
    forms = [CompilesOnce("first", barrier), CompilesOnce("second", barrier),
             CompilesOnce("third", threading.Barrier(1), in_thread=False)]
    _attach(forms)
    assert forms[0].compiled and forms[1].compiled and forms[2].compiled
    assert not any(t.startswith("ditgate-warm") for t in forms[2].threads), forms[2].threads


def test_a_first_call_that_raises_in_its_thread_is_refused_by_the_contest_with_its_reason(on_cpu):
    barrier = threading.Barrier(2)
    broken = FakeForm("broken", raises=True)
    broken.warms_in_thread = True  # it raises in its thread first, then in the contest's own call
    forms = [CompilesOnce("first", barrier), CompilesOnce("second", barrier), broken]
    plan = _attach(forms)
    for v in plan.chooser.verdicts.values():
        assert v.form in ("first", "second")
        assert any(r.form == "broken" and r.kind == "raised" and "on purpose" in r.detail for r in v.refusals)
    assert broken.calls >= 2


def test_not_on_cpu_by_default():
    """Triton's interpreter swaps module-wide functions while a kernel runs: no threads where it runs. Without the
    fixture, the same first calls that met at the barrier run one after another and cannot meet."""
    assert "cpu" not in first_calls.WARM_DEVICE_TYPES
    barrier = threading.Barrier(len(NAMES))
    plan = _attach([CompilesOnce(n, barrier) for n in NAMES])
    first_site = next(iter(plan.chooser.verdicts.values()))
    assert first_site.form is None
    assert {r.form for r in first_site.refusals if r.kind == "raised"} == set(NAMES)


def test_not_under_the_interpreter_on_a_cuda_machine(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert first_calls.allowed_on(cuda)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not first_calls.allowed_on(cuda)
    assert not first_calls.allowed_on(torch.device("cpu"))


def test_warming_ahead_changes_no_saved_whole_model_check_and_profiles_load_keys_they_do_not_know():
    from ditgate.gate.profiles import Profile

    d = LENIENT.to_dict()
    assert d["warm_ahead"] is True and Profile.from_dict(d) == LENIENT
    assert Profile.from_dict({**d, "a_later_field": 3}) == LENIENT
    old = {k: v for k, v in d.items() if k != "warm_ahead"}  # a receipt from before the field
    assert Profile.from_dict(old) == LENIENT


def test_only_forms_whose_first_call_compiles_and_that_touch_no_global_state_warm_in_threads():
    """torch's SDPA forms pin their backend through process-wide flags (``sdpa_kernel``): in threads, two restoring
    them out of order left the host on another backend (seen on an H100). fa3-fwd's kernels failed in a thread."""
    from ditgate.forms.registry import create_forms

    threaded = {name for name, form in create_forms().items() if form.warms_in_thread}
    assert threaded == {"fp8", "int8", "fp8_sparse", "int8_sparse", "block_sparse", "sage"}
