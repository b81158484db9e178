"""Calibration that costs a few forwards: timing shared per shape key, accuracy per site, the cache, the budget,
progress, and a whole-model check of two forwards."""

import dataclasses
import json
import logging
import math
import os

import pytest

import ditgate
from ditgate.gate import TimingCache
from ditgate.models.presets import get_preset

from .helpers import FakeForm, Tiny

# speed decides nothing in these tests except where a form is slowed on purpose (see test_gate.LENIENT)
LENIENT = dataclasses.replace(ditgate.PROFILES["quality"], name="lenient", min_speedup=1e-3, min_whole_ratio=1e-3,
                              rounds=3)
# the per-site gate of before: every candidate timed in paired rounds at every site
PER_SITE = dataclasses.replace(LENIENT, name="per-site", screen_margin=None, share_timing=False)


def _wan(layers: int) -> Tiny:
    preset = get_preset("tiny-wan")
    return Tiny(dataclasses.replace(preset, config={**preset.config, "num_layers": layers}))


def _by_key(plan) -> dict[str, list]:
    out: dict[str, list] = {}
    for v in plan.chooser.verdicts.values():
        out.setdefault(v.shape_key, []).append(v)
    return out


class PerSite(FakeForm):
    """Exact SDPA that counts its calls per attention module (the one whose forward is running)."""

    def __init__(self, name: str, model) -> None:
        super().__init__(name)
        self.per_site: dict[str, int] = {}
        self.current = ""
        for path, module in model.named_modules():
            if callable(getattr(module, "processor", None)):
                module.register_forward_pre_hook(lambda m, a, path=path: setattr(self, "current", path))

    def run(self, inputs):
        self.per_site[self.current] = self.per_site.get(self.current, 0) + 1
        return super().run(inputs)


def test_six_same_shape_blocks_time_each_form_once_per_shape_key():
    tiny = _wan(6)
    good = PerSite("good", tiny.model)
    plan = ditgate.attach(tiny.model, profile=LENIENT, forms=["good"], extra_forms=[good], timing_cache=False)
    tiny.forward()
    by_key = _by_key(plan)
    assert len(by_key) == 2 and all(len(vs) == 6 for vs in by_key.values())  # self and cross, six blocks each
    assert plan.chooser.book.timed == 2 * len(by_key)  # one screening timing and one paired timing per key
    for vs in by_key.values():
        timed_at = {v.chosen.timed_at for v in vs}
        assert len(timed_at) == 1, timed_at  # every site of a key reads the timing its first site made
        first = timed_at.pop()
        for v in vs:
            assert v.form == "good" and v.chosen.rounds == 3 and not v.chosen.screened
            assert math.isfinite(v.chosen.cosine)  # accuracy checked at every site on its own input
            assert ("timed here" in v.summary) == (v.site == first), v.summary
            assert (f"shared from {first}" in v.summary) == (v.site != first)
            # elsewhere the form ran twice: its accuracy call, and the whole-model check's routed pass
            assert (good.per_site[v.site] == 2) == (v.site != first), (v.site, good.per_site)


def test_accuracy_is_checked_per_site_even_when_its_key_passed_elsewhere():
    tiny = _wan(4)
    flaky = FakeForm("flaky")
    wrong_blocks = {2}

    def set_noise(index):
        def pre(module, args, kwargs):
            flaky.noise = 0.5 if index in wrong_blocks else 0.0
        return pre

    for i, block in enumerate(tiny.model.blocks):
        block.register_forward_pre_hook(set_noise(i), with_kwargs=True)
    plan = ditgate.attach(tiny.model, profile=LENIENT, forms=["flaky"], extra_forms=[flaky], timing_cache=False)
    tiny.forward()
    for (site, _), v in plan.chooser.verdicts.items():
        if site.startswith("blocks.2."):
            assert v.form is None
            (refusal,) = [r for r in v.refusals if r.form == "flaky"]
            assert refusal.kind == "less accurate", v.refusals
        else:
            assert v.form == "flaky", v.summary


def test_a_form_that_cannot_win_is_screened_out_by_one_call_and_never_paired():
    tiny = _wan(3)
    fast, slow = FakeForm("fast"), FakeForm("slow", delay_s=0.02)
    plan = ditgate.attach(tiny.model, profile=LENIENT, forms=["fast", "slow"], extra_forms=[fast, slow],
                          timing_cache=False)
    tiny.forward()
    for v in plan.chooser.verdicts.values():
        assert v.form == "fast", v.summary
        (refusal,) = [r for r in v.refusals if r.form == "slow"]
        assert refusal.kind in ("outranked", "slower") and "screening timing" in refusal.detail
        (m,) = [m for m in v.measured if m.form == "slow"]
        assert m.screened and m.rounds == 1
    first_sites = {v.chosen.timed_at for v in plan.chooser.verdicts.values()}
    # slow ran at the first site of each key only (a warm-up, two screening samples after one to count
    # repetitions); never at the other blocks
    assert slow.calls == len(first_sites) * (1 + 1 + 2)


def test_the_per_site_gate_and_the_shared_gate_choose_the_same_forms():
    tiny = _wan(3)
    choices = {}
    for profile in (PER_SITE, LENIENT):
        forms = [FakeForm("fast"), FakeForm("slow", delay_s=0.05)]  # far beyond a loaded machine's stalls
        plan = ditgate.attach(tiny.model, profile=profile, forms=["fast", "slow"], extra_forms=forms,
                              timing_cache=False)
        tiny.forward()
        choices[profile.name] = {k: v.form for k, v in plan.chooser.verdicts.items()}
        if profile is PER_SITE:  # every form paired at every site: nothing shared, nothing screened
            assert all(not m.screened and m.timed_at == v.site for v in plan.chooser.verdicts.values()
                       for m in v.measured)
        plan.detach()
    assert choices["per-site"] == choices["lenient"]


def test_a_second_plan_reads_the_timing_cache_and_measures_only_accuracy(tmp_path):
    cache = tmp_path / "timings.json"
    tiny = _wan(2)
    first = ditgate.attach(tiny.model, profile=LENIENT, forms=["good"], extra_forms=[FakeForm("good")],
                           timing_cache=cache)
    tiny.forward()
    routes = {k: v.form for k, v in first.chooser.verdicts.items()}
    assert first.chooser.book.timed > 0 and cache.exists()
    first.detach()
    good = FakeForm("good")
    second = ditgate.attach(tiny.model, profile=LENIENT, forms=["good"], extra_forms=[good], timing_cache=cache)
    tiny.forward()
    assert second.chooser.book.timed == 0 and second.chooser.book.cache_hits > 0
    assert {k: v.form for k, v in second.chooser.verdicts.items()} == routes
    assert all(v.chosen.from_cache and "from the timing cache" in v.summary for v in second.chooser.verdicts.values())
    sites = len(second.chooser.verdicts)
    assert good.calls == 2 * sites  # one accuracy call per site, and one in the whole-model check's routed pass
    second.detach()


def test_the_timing_cache_misses_when_the_environment_changes(tmp_path, monkeypatch):
    cache = tmp_path / "timings.json"
    tiny = _wan(2)
    plan = ditgate.attach(tiny.model, profile=LENIENT, forms=["good"], extra_forms=[FakeForm("good")],
                          timing_cache=cache)
    tiny.forward()
    plan.detach()
    import ditgate.api.plan as plan_module

    real = plan_module.environment

    def upgraded(device=None):
        env = real(device)
        env["packages"] = dict(env["packages"], torch="99.0")
        return env

    monkeypatch.setattr(plan_module, "environment", upgraded)
    other = ditgate.attach(tiny.model, profile=LENIENT, forms=["good"], extra_forms=[FakeForm("good")],
                           timing_cache=cache)
    tiny.forward()
    assert other.chooser.book.cache_hits == 0 and other.chooser.book.timed > 0
    payload = json.loads(cache.read_text())
    assert len(payload["environments"]) == 2  # both environments kept, each under its own key
    other.detach()


@pytest.mark.parametrize("content", ["{not json", json.dumps({"version": 99, "environments": {}})])
def test_a_bad_cache_file_is_ignored_with_a_warning_and_replaced(tmp_path, caplog, content):
    cache = tmp_path / "timings.json"
    cache.write_text(content)
    tiny = _wan(2)
    with caplog.at_level(logging.WARNING, logger="ditgate.gate"):
        plan = ditgate.attach(tiny.model, profile=LENIENT, forms=["good"], extra_forms=[FakeForm("good")],
                              timing_cache=cache)
        tiny.forward()
    assert plan.chooser.book.timed > 0 and all(v.form == "good" for v in plan.chooser.verdicts.values())
    warned = [r.getMessage() for r in caplog.records if "timing cache" in r.getMessage()]
    assert len(warned) == 1 and "ignored" in warned[0], warned
    assert json.loads(cache.read_text())["version"] == 1  # replaced by a good file
    assert TimingCache(cache).load(plan.chooser.book.environment)
    plan.detach()


def test_the_timing_cache_can_be_turned_off(tmp_path):
    tiny = _wan(2)
    plan = ditgate.attach(tiny.model, profile=LENIENT, forms=["good"], extra_forms=[FakeForm("good")],
                          timing_cache=False)
    tiny.forward()
    assert plan.chooser.book.cache is None
    assert not list((tmp_path / "ditgate-cache").glob("*"))  # the default folder (conftest) stays empty
    plan.detach()


def test_after_the_budget_sites_take_their_keys_verdict_or_the_host():
    tiny = _wan(4)
    plan = ditgate.attach(tiny.model, profile=LENIENT, forms=["good"], extra_forms=[FakeForm("good")],
                          timing_cache=False, calibration_budget_s=1e-9)
    tiny.forward()
    verdicts = list(plan.chooser.verdicts.values())
    measured = [v for v in verdicts if v.source == "measured"]
    assert len(measured) == 1  # the first site spent the budget
    for v in verdicts:
        if v.source == "measured":
            continue
        if v.shape_key == measured[0].shape_key:
            assert v.source == "shared" and v.form == measured[0].form
            assert "budget" in v.note and measured[0].site in v.note and "accuracy not checked" in v.note
        else:
            assert v.source == "budget" and v.form is None and "budget" in v.summary
    with pytest.raises(ValueError, match="calibration_budget_s"):
        ditgate.attach(_wan(1).model, calibration_budget_s=-1)


def test_progress_as_log_lines_and_as_a_bar(caplog, capsys):
    tiny = _wan(2)
    with caplog.at_level(logging.INFO, logger="ditgate.gate"):
        plan = ditgate.attach(tiny.model, profile=LENIENT, forms=["good"], extra_forms=[FakeForm("good")],
                              timing_cache=False, progress=False)
        tiny.forward()
    lines = [r.getMessage() for r in caplog.records if "calibrating" in r.getMessage()]
    assert lines and lines[-1].startswith("ditgate: calibrating model: 4/4 sites") and "(done)" in lines[-1]
    plan.detach()
    capsys.readouterr()
    plan = ditgate.attach(tiny.model, profile=LENIENT, forms=["good"], extra_forms=[FakeForm("good")],
                          timing_cache=False, progress=True)
    tiny.forward()
    err = capsys.readouterr().err
    assert "ditgate: calibrating model" in err and "4/4" in err
    plan.detach()


def test_the_whole_model_check_costs_two_forwards_when_it_passes():
    tiny = _wan(2)
    forwards = []
    tiny.model.register_forward_pre_hook(lambda m, a: forwards.append(1))
    plan = ditgate.attach(tiny.model, profile=LENIENT, forms=["good"], extra_forms=[FakeForm("good")],
                          timing_cache=False)
    tiny.forward()
    (check,) = plan.report().whole_model
    assert check.passed and check.forwards == 2
    assert len(forwards) == 3  # the user's calibrating forward, one host pass, one routed pass


def _counted(tiny) -> list:
    forwards: list = []
    tiny.model.register_forward_pre_hook(lambda m, a: forwards.append(1))
    return forwards


def _calibrate(tiny, profile, cache, form: FakeForm):
    plan = ditgate.attach(tiny.model, profile=profile, forms=[form.name], extra_forms=[form], timing_cache=cache)
    tiny.forward()
    return plan


def test_a_second_process_replays_the_whole_model_check_with_one_routed_forward(tmp_path):
    cache = tmp_path / "timings.json"
    tiny = _wan(2)
    first = _calibrate(tiny, LENIENT, cache, FakeForm("good"))
    (measured,) = first.report().whole_model
    assert measured.forwards == 2 and not measured.from_cache and measured.seconds > 0
    first.detach()
    forwards = _counted(tiny)
    second = _calibrate(tiny, LENIENT, cache, FakeForm("good"))
    (replayed,) = second.report().whole_model
    assert replayed.passed and replayed.from_cache and replayed.forwards == 1
    assert len(forwards) == 2  # the calibrating forward and one routed pass: no host pass
    assert (replayed.ratio, replayed.host_ms) == (measured.ratio, measured.host_ms)
    assert "remembered in the timing cache" in replayed.note and replayed.cosine > 0.999999  # checked here
    second.detach()
    # other inputs (another shape) are another check: measured in full
    third = ditgate.attach(tiny.model, profile=LENIENT, forms=["good"], extra_forms=[FakeForm("good")],
                           timing_cache=cache)
    tiny.forward(hidden_states=tiny.inputs["hidden_states"][:, :, :1].contiguous())  # one frame of two
    (other,) = third.report().whole_model
    assert not other.from_cache and other.forwards == 2
    third.detach()


def test_a_check_remembered_under_other_rules_is_not_replayed(tmp_path, monkeypatch):
    """A check judged by earlier rules (before a compiled plan's linear routes were judged at their sites) may have
    taken back routes the present rules keep: it is measured again, not replayed."""
    from ditgate.gate import whole_memo

    cache = tmp_path / "timings.json"
    tiny = _wan(2)
    monkeypatch.setattr(whole_memo, "CHECK_RULES", whole_memo.CHECK_RULES - 1)
    _calibrate(tiny, LENIENT, cache, FakeForm("good")).detach()
    monkeypatch.undo()
    again = _calibrate(tiny, LENIENT, cache, FakeForm("good"))
    (check,) = again.report().whole_model
    assert not check.from_cache and check.forwards == 2
    again.detach()


def test_a_replay_whose_output_misses_the_floor_falls_back_to_the_full_check(tmp_path, monkeypatch):
    cache = tmp_path / "timings.json"
    tiny = _wan(2)
    _calibrate(tiny, LENIENT, cache, FakeForm("good")).detach()
    import ditgate.api.plan as plan_module

    real = plan_module.Plan._keep_host_output

    def wrong(self, name, output):  # a host output that the routed pass cannot match
        real(self, name, output)
        self._host_outputs[name] = -self._host_outputs[name]

    monkeypatch.setattr(plan_module.Plan, "_keep_host_output", wrong)
    forwards = _counted(tiny)
    plan = _calibrate(tiny, LENIENT, cache, FakeForm("good"))
    (check,) = plan.report().whole_model
    assert check.passed and not check.from_cache and check.forwards == 3  # the replay's pass, then host and routed
    assert len(forwards) == 4 and all(v.form == "good" for v in plan.chooser.verdicts.values())
    plan.detach()


def test_a_replay_takes_back_what_the_remembered_check_took_back(tmp_path):
    cache = tmp_path / "timings.json"
    never = dataclasses.replace(LENIENT, name="never-faster", min_whole_ratio=1e9, whole_rounds=1)
    tiny = _wan(2)
    first = _calibrate(tiny, never, cache, FakeForm("good"))
    (check,) = first.report().whole_model
    assert len(check.reverted) == 4 and not first.chooser.routed()
    first.detach()
    second = _calibrate(tiny, never, cache, FakeForm("good"))
    (replayed,) = second.report().whole_model
    assert replayed.from_cache and replayed.reverted == check.reverted and not second.chooser.routed()
    assert all("remembered in the timing cache" in v.note for v in second.chooser.verdicts.values())
    second.detach()


def test_a_model_with_no_routes_needs_no_whole_model_check():
    tiny = _wan(2)
    forwards = _counted(tiny)
    plan = _calibrate(tiny, LENIENT, False, FakeForm("broken", raises=True))
    (check,) = plan.report().whole_model
    assert check.passed and check.forwards == 0 and "no routes" in check.note
    assert len(forwards) == 1
    plan.detach()


def test_flash_attn_4_keeps_its_compiled_kernels_in_ditgates_cache_folder_unless_told(tmp_path, monkeypatch):
    import sys

    from ditgate.forms.fa4 import FA4_CACHE_DIR, FA4_CACHE_SWITCH, use_fa4_disk_cache

    monkeypatch.delitem(sys.modules, "flash_attn.cute", raising=False)
    for var in (FA4_CACHE_SWITCH, FA4_CACHE_DIR, "DITGATE_FA4_DISK_CACHE"):
        monkeypatch.setenv(var, "")  # recorded, so that what the function sets is undone after the test
        monkeypatch.delenv(var)
    monkeypatch.setenv("DITGATE_CACHE_DIR", str(tmp_path))
    assert use_fa4_disk_cache().startswith("on") and os.environ[FA4_CACHE_SWITCH] == "1"
    assert os.environ[FA4_CACHE_DIR] == str(tmp_path / "fa4-kernels")
    monkeypatch.setenv(FA4_CACHE_SWITCH, "0")  # the user's choice stands
    assert use_fa4_disk_cache().startswith("off") and os.environ[FA4_CACHE_SWITCH] == "0"
    monkeypatch.delenv(FA4_CACHE_SWITCH)
    monkeypatch.setenv("DITGATE_FA4_DISK_CACHE", "0")
    assert use_fa4_disk_cache().startswith("off") and FA4_CACHE_SWITCH not in os.environ
    monkeypatch.delenv("DITGATE_FA4_DISK_CACHE")
    monkeypatch.setitem(sys.modules, "flash_attn.cute", object())  # imported before ditgate: too late to change
    assert "imported flash_attn.cute before" in use_fa4_disk_cache() and FA4_CACHE_SWITCH not in os.environ


def test_the_remembered_checks_key_is_the_same_in_another_process():
    import subprocess
    import sys

    code = ("import dataclasses, ditgate; from tests.helpers import Tiny; from ditgate.models.presets import get_preset;"
            "from ditgate.gate.whole_memo import check_key; t = Tiny(get_preset('tiny-wan'));"
            "print(check_key(t.model, (), t.inputs, ditgate.PROFILES['speed'], '', []))")
    keys = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout.strip() for seed in ("1", "2", "3")}
    assert len(keys) == 1 and keys.pop().startswith("whole|")  # diffusers' config holds a set turned into a list


class Probed(FakeForm):
    def __init__(self, name: str, **kw) -> None:
        super().__init__(name, **kw)
        self.probes = 0

    def _probe(self):
        self.probes += 1
        return super()._probe()


def test_a_form_its_cached_timing_refuses_is_never_probed_in_the_next_process(tmp_path):
    # "good" runs the host's own SDPA (a ratio near 1) and "slow" sleeps 50 ms a call (a ratio under 0.02 on this
    # tiny model): a bar of 0.1 splits them with room on a loaded 2-core machine, where 0.5 against a 20 ms sleep
    # once refused "good" in CI
    cache = tmp_path / "timings.json"
    tenth = dataclasses.replace(LENIENT, name="tenth", min_speedup=0.1)
    tiny = _wan(2)
    forms = [Probed("good"), Probed("slow", delay_s=0.05)]
    first = ditgate.attach(tiny.model, profile=tenth, forms=["good", "slow"], extra_forms=forms, timing_cache=cache)
    tiny.forward()
    assert forms[1].probes == 1 and all(v.form == "good" for v in first.chooser.verdicts.values())
    first.detach()
    again = [Probed("good"), Probed("slow", delay_s=0.05)]
    second = ditgate.attach(tiny.model, profile=tenth, forms=["good", "slow"], extra_forms=again, timing_cache=cache)
    tiny.forward()
    assert again[0].probes == 1 and again[1].probes == 0 and again[1].calls == 0  # refused from its cached timing
    for v in second.chooser.verdicts.values():  # below the bar, or more than the margin below "good" timed first
        assert v.form == "good" and any(r.form == "slow" and r.kind in ("slower", "outranked") for r in v.refusals), \
            [r for r in v.refusals if r.form == "slow"]
    second.detach()


def test_later_sites_run_only_the_fastest_paired_form_of_each_precision():
    tiny = _wan(4)
    wide = dataclasses.replace(LENIENT, name="wide", screen_margin=1e6)  # every form stays within reach
    fast, slow = PerSite("fast", tiny.model), PerSite("slow", tiny.model)
    slow.delay_s = 0.004
    plan = ditgate.attach(tiny.model, profile=wide, forms=["fast", "slow"], extra_forms=[fast, slow],
                          timing_cache=False)
    tiny.forward()
    for key, vs in _by_key(plan).items():
        first = vs[0].chosen.timed_at
        for v in vs:
            assert v.form == "fast", v.summary
            if v.site != first:  # its key's timings are paired: the slower form waits behind the faster one
                assert slow.per_site.get(v.site, 0) == 0, (v.site, slow.per_site)
                (r,) = [r for r in v.refusals if r.form == "slow"]
                assert r.kind == "outranked" and "behind fast" in r.detail and "not run here" in r.detail
    plan.detach()


def test_a_form_behind_one_that_fails_here_is_run_and_chosen():
    tiny = _wan(3)
    # speed must not decide which form a site keeps (a loaded machine stretches steady's 4 ms sleep)
    wide = dataclasses.replace(LENIENT, name="wide", screen_margin=1e6, min_speedup=1e-6)
    flaky, steady = FakeForm("flaky"), FakeForm("steady", delay_s=0.004)
    blocks = [m for m in tiny.model.modules() if callable(getattr(m, "processor", None))]
    for i, block in enumerate(blocks):  # at the last site alone, flaky is wrong
        block.register_forward_pre_hook(lambda m, a, last=i == len(blocks) - 1: setattr(flaky, "noise", 0.5 * last))
    plan = ditgate.attach(tiny.model, profile=wide, forms=["flaky", "steady"], extra_forms=[flaky, steady],
                          timing_cache=False)
    tiny.forward()
    verdicts = list(plan.chooser.verdicts.values())
    wrong = [v for v in verdicts if any(r.form == "flaky" and r.kind == "less accurate" for r in v.refusals)]
    assert wrong and all(v.form == "steady" for v in wrong)
    plan.detach()


def test_the_hosts_own_calls_are_counted_apart_from_the_contests():
    """On a GPU the host's call at a site is queued work: it is finished (and counted as the host's) before the
    contest, whose first synchronisation would otherwise charge it to the first form run there."""
    tiny = _wan(2)
    plan = ditgate.attach(tiny.model, profile=LENIENT, forms=["sdpa_math"], timing_cache=False)
    assert plan.chooser.host_s == 0.0
    tiny.forward()
    chooser = plan.chooser
    assert 0.0 < chooser.host_s < chooser.spent_s
    assert chooser.host_s + sum(chooser.book.spent_s.values()) <= chooser.spent_s
