"""Kernels compiled all at once from a dry first call (``gate.compile_ahead``, ``kernels.launches``).

The compiling half needs no GPU: a child process without ``TRITON_INTERPRET`` (which conftest sets, and under which
Triton's kernels are not JIT functions at all) stands a Triton driver for a Hopper GPU that is not there, records the
launches of ditgate's FP8 attention (its three quantization passes, then the Gluon kernel) on CPU tensors, and
compiles them for sm_90 in two threads. The contest's half runs in this process on torch-only forms."""

import dataclasses
import textwrap

import pytest

import ditgate
from ditgate.gate import warm as first_calls
from ditgate.kernels import launches as launch_records
from ditgate.models.presets import get_preset

from .helpers import HOPPER, FakeForm, Tiny, compiled_child

COMPILE_ALL = HOPPER + textwrap.dedent("""
    from ditgate.gate.compile_ahead import compile_launches
    from ditgate.kernels import hopper_attention as ha, hopper_compile as hc
    from ditgate.kernels.launches import recorded_launches

    def fp8_attention():
        q, k, v = (torch.empty(1, 1000, 2, 128, dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
        ha.quantize_for_schedule(q, k, v, "fp8", 128 ** -0.5)
        hc.host_launch("fp8", 128, False, 2).run()

    with recorded_launches() as launches:
        fp8_attention()
        fp8_attention()  # the same launches again: each kernel compiles once
    first = compile_launches(launches, workers=2)
    again = compile_launches(launches, workers=2)  # all in Triton's memory cache now

    from triton.runtime.jit import JITFunction

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled again")

    JITFunction._do_compile = no_compile  # the launch's own path (the key its run computes) finds each one built
    for launch in launches:
        launch.kernel.run(*launch.args, grid=(1,), warmup=True, **launch.kwargs)
    print(json.dumps({"recorded": [l.kernel.fn.__name__ for l in launches], "first": first, "again": again,
                      "compiles": compiles}))
""")

THREAD_SCOPED = HOPPER + textwrap.dedent("""
    from triton.runtime.jit import JITFunction
    from ditgate.kernels.launches import recorded_launches
    from ditgate.kernels.rowwise_quant import quantize_rows

    ran = []
    JITFunction.run = lambda self, *a, grid, warmup, **kw: ran.append(threading.current_thread().name)
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    recording, other_done = threading.Event(), threading.Event()

    def other():
        recording.wait(5)
        quantize_rows(x, True)  # while the main thread records: this one runs
        other_done.set()

    thread = threading.Thread(target=other, name="other")
    thread.start()
    with recorded_launches() as launches:
        recording.set()
        other_done.wait(5)
        quantize_rows(x, False)
    thread.join()
    quantize_rows(x, True)  # after the block: runs again
    print(json.dumps({"recorded": len(launches), "ran": ran, "restored": JITFunction.run.__name__ == "<lambda>"}))
""")


def test_recorded_launches_of_a_form_compile_for_hopper_in_threads_once_each(tmp_path):
    got = compiled_child(tmp_path, COMPILE_ALL)
    kernels = ["_first_pass_kernel", "_kv_scales_kernel", "_quant_kv_kernel", "_hopper_attn_kernel"]
    assert got["recorded"] == kernels * 2
    assert got["first"] == len(kernels) and got["again"] == 0
    built = [c for c in got["compiles"] if not c["hit"]]
    assert sorted(c["kernel"] for c in built) == sorted(kernels)
    assert all(c["thread"].startswith("ditgate-compile") for c in got["compiles"]), got["compiles"]


def test_recording_is_scoped_to_its_thread_and_restores_triton(tmp_path):
    got = compiled_child(tmp_path, THREAD_SCOPED)
    assert got["recorded"] == 1
    assert got["ran"] == ["other", "MainThread"]
    assert got["restored"]


# --- the contest's side, on torch-only forms ---------------------------------------------------------------------

LENIENT = dataclasses.replace(ditgate.PROFILES["quality"], name="lenient", min_speedup=1e-3, min_whole_ratio=1e-3,
                              rounds=2)


class Dry(FakeForm):
    """Exact SDPA that notes whether each call was made while its thread recorded launches (a dry call)."""

    def __init__(self, name: str, ahead: bool = True, raises_dry: bool = False) -> None:
        super().__init__(name)
        self.compiles_ahead = ahead
        self.raises_dry = raises_dry
        self.dry_calls = self.real_calls = 0

    def run(self, inputs):
        if getattr(launch_records._local, "launches", None) is not None:
            self.dry_calls += 1
            if self.raises_dry:
                raise RuntimeError("fails dry on purpose")
        else:
            self.real_calls += 1
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
    monkeypatch.setattr(first_calls, "WARM_DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(first_calls, "allowed_on", lambda device: device.type in first_calls.WARM_DEVICE_TYPES)


def test_forms_that_opt_in_make_one_dry_call_per_key_and_the_contest_decides_as_before(on_cpu):
    forms = [Dry("first"), Dry("second"), Dry("kept_out", ahead=False)]
    plan = _attach(forms)
    keys = {v.shape_key for v in plan.chooser.verdicts.values()}
    assert forms[0].dry_calls == forms[1].dry_calls == len(keys)
    assert forms[2].dry_calls == 0
    assert all(f.real_calls > 0 for f in forms)
    verdicts = list(plan.chooser.verdicts.values())
    assert verdicts and all(v.form in ("first", "second", "kept_out") for v in verdicts)
    first = [m for v in verdicts for m in v.measured if m.timed_at == v.site and not m.from_cache]
    assert {m.form for m in first} == {"first", "second", "kept_out"} and all(m.first_ms > 0 for m in first)
    assert launch_records._recorders == 0  # Triton's run is its own again


def test_a_dry_call_that_raises_leaves_the_form_to_its_ordinary_first_call(on_cpu):
    form = Dry("flaky", raises_dry=True)
    plan = _attach([form, Dry("steady")])
    assert form.dry_calls >= 1 and form.real_calls > 0
    assert all(v.form in ("flaky", "steady") for v in plan.chooser.verdicts.values())
    assert not any(r.form == "flaky" and r.kind == "raised" for v in plan.chooser.verdicts.values()
                   for r in v.refusals)


def test_off_by_profile_and_off_where_first_calls_are_not_made_ahead(on_cpu, monkeypatch):
    forms = [Dry("first"), Dry("second")]
    _attach(forms, dataclasses.replace(LENIENT, compile_ahead=False))
    assert forms[0].dry_calls == forms[1].dry_calls == 0
    monkeypatch.setattr(first_calls, "WARM_DEVICE_TYPES", ("cuda",))  # the default: not on a CPU
    forms = [Dry("first"), Dry("second")]
    _attach(forms)
    assert forms[0].dry_calls == forms[1].dry_calls == 0


def test_the_forms_that_compile_ahead_read_nothing_their_kernels_write():
    from ditgate.forms.linear import create_linear_forms
    from ditgate.forms.registry import create_forms

    ahead = {name for name, form in create_forms().items() if form.compiles_ahead}
    assert ahead == {"fp8", "int8", "fp8_sparse", "int8_sparse", "block_sparse", "sage", "fa3_fp8"}
    linear = {name for name, form in create_linear_forms().items() if form.compiles_ahead}
    assert linear == {"fp8_linear", "int8_linear"}  # fp8_tensor_linear quantizes with torch ops: nothing to compile


def test_a_callers_async_compile_mode_turns_compiling_ahead_off_and_the_contest_goes_on(on_cpu):
    from concurrent.futures import ThreadPoolExecutor

    from triton.runtime._async_compile import AsyncCompileMode

    from ditgate.gate import compile_ahead as ahead

    forms = [Dry("first"), Dry("second")]
    with ThreadPoolExecutor(1) as pool, AsyncCompileMode(pool):
        assert "another AsyncCompileMode" in ahead.unavailable_reason()
        plan = _attach(forms)
    assert forms[0].dry_calls == forms[1].dry_calls == 0 and all(f.real_calls > 0 for f in forms)
    assert all(v.form in ("first", "second") for v in plan.chooser.verdicts.values())


def test_a_failing_compile_step_leaves_every_form_to_its_first_call(monkeypatch):
    import torch

    from ditgate.gate import compile_ahead as ahead

    def records_one():
        launch_records._local.launches.append(launch_records.Launch(object(), (), {}))

    def broken(launches, workers):
        raise OSError("no threads left")

    monkeypatch.setattr(first_calls, "allowed_on", lambda device: True)
    monkeypatch.setattr(ahead, "compile_launches", broken)
    done = ahead.compile_ahead([first_calls.WarmCall("a", records_one), first_calls.WarmCall("b", records_one)],
                               torch.device("cpu"))
    assert done.names == () and done.launches == 0
    assert set(done.raised) == {"a", "b"} and "OSError: no threads left" in done.raised["a"]


def test_recording_leaves_a_patch_made_meanwhile_and_never_takes_itself_for_the_original(monkeypatch):
    from triton.runtime.jit import JITFunction

    def theirs(self, *args, grid, warmup, **kwargs):
        return "theirs"

    def later(self, *args, grid, warmup, **kwargs):
        return "later"

    monkeypatch.setattr(JITFunction, "run", theirs)
    with launch_records.recorded_launches():
        assert JITFunction.run is launch_records._dispatch
        JITFunction.run = later  # another tool patches Triton while we record
    assert JITFunction.run is later  # theirs to undo, not ours
    monkeypatch.setattr(JITFunction, "run", launch_records._dispatch)  # a recording left installed (a crash)
    monkeypatch.setattr(launch_records, "_original", theirs)
    with launch_records.recorded_launches():
        assert launch_records._original is theirs
    assert JITFunction.run is theirs


def test_the_accuracy_checks_kernel_compiles_in_the_same_step_only_beside_forms_that_do(on_cpu, monkeypatch):
    import importlib

    contest = importlib.import_module("ditgate.gate.contest")  # the package exports a function of that name
    steps = []
    real = contest.compile_ahead

    def spy(calls, device, workers=None):
        steps.append([c.name for c in calls])
        return real(calls, device, workers)

    monkeypatch.setattr(contest, "compile_ahead", spy)
    _attach([Dry("first"), Dry("second")])
    compiling = [names for names in steps if names]
    assert compiling and all(names[-1] == contest.ACCURACY_CHECK and set(names[:-1]) == {"first", "second"}
                             for names in compiling)
    steps.clear()
    _attach([Dry("first", ahead=False), Dry("second", ahead=False)])
    assert steps and not any(steps)  # nothing of its own to hide it in: no step of its own either
