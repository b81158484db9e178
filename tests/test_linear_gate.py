"""The gate on linear sites: speed timed once per (form, shape key) and shared, accuracy per site, verdicts beside
attention's (whole-model check, receipts), weights settled after calibration, shapes first seen later."""

import dataclasses
from collections import defaultdict

import pytest
import torch

import ditgate
from ditgate.gate.linear import LinearSetting
from ditgate.hosts.linear_weights import HeldWeight

from .helpers import LENIENT_SPEED, Tiny, twice

# every form fast enough and the whole never too slow: what is left to decide is accuracy, per site (CPU timings of
# 32-wide products say nothing about a GPU)
LENIENT = LENIENT_SPEED


def _attach(tiny: Tiny, profile=LENIENT, **kwargs):
    return ditgate.attach(tiny.model, profile=profile, forms=["sdpa_math"], timing_cache=False, progress=False,
                          **kwargs)


def _linear_verdicts(plan):
    names = {r.name for r in plan.linear.routers}
    return [v for v in plan.chooser.verdicts.values() if v.site in names]


def test_speed_is_timed_once_per_form_and_shape_key_and_accuracy_at_every_site():
    tiny = Tiny("tiny-wan")
    plan = _attach(tiny, linear=True)
    tiny.forward()
    verdicts = _linear_verdicts(plan)
    called = [s for s in plan.report().linear.sites if s.calls]
    assert len(verdicts) == sum(len(s.shapes) for s in called) > 0
    timed_at = defaultdict(set)
    sites_per_key = defaultdict(set)
    for v in verdicts:
        for m in v.measured:
            timed_at[(m.form, v.shape_key)].add((m.timed_at, m.ratio, m.host_ms, m.form_ms))
            sites_per_key[(m.form, v.shape_key)].add(v.site)
            if m.cosine != m.cosine:  # not run here: behind a faster form of its precision that passed here
                assert any(r.form == m.form and "not run here" in r.detail for r in v.refusals), v.refusals
            else:
                assert m.rel_l2 > 0  # this site's own accuracy, measured here
    assert all(len(t) == 1 for t in timed_at.values())  # one timing per (form, key), whatever site reads it
    assert max(len(s) for s in sites_per_key.values()) >= 8  # and many sites read it
    linear_keys = [k for k in plan.chooser.book._entries if k.shape_key.startswith("M")]
    assert len(linear_keys) == len(timed_at)
    plan.detach()


def test_verdicts_settle_the_weights_and_detach_is_exact():
    tiny = Tiny("tiny-flux")
    stock = tiny.forward()
    state = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    plan = _attach(tiny, linear=True)
    assert torch.equal(tiny.forward(), stock)  # calibration: the host serves every call
    routed = tiny.forward()
    forms_of = defaultdict(set)
    for v in _linear_verdicts(plan):
        forms_of[v.site].add(v.form)
    record = plan.report().linear
    for router, site in zip(plan.linear.routers, record.sites):
        if forms_of.get(router.name) in ({"fp8_linear"}, {"int8_linear"}):
            assert site.weights == next(iter(forms_of[router.name]))
            assert isinstance(router.module.weight, HeldWeight)
        elif forms_of.get(router.name) == {None}:
            assert site.weights == "host" and not isinstance(router.module.weight, HeldWeight)
    assert any(s.weights != "host" for s in record.sites) and not torch.equal(routed, stock)
    plan.detach()
    assert torch.equal(tiny.forward(), stock)
    after = tiny.model.state_dict()
    assert all(torch.equal(after[k], state[k]) for k in state)


def test_the_whole_model_check_takes_back_linear_routes_too():
    tiny = Tiny("tiny-ltx")
    stock = tiny.forward()
    exact_output = dataclasses.replace(LENIENT, min_output_cosine=1.0)  # any quantized route breaks it
    plan = _attach(tiny, profile=exact_output, linear=True)
    tiny.forward()
    (check,) = plan.report().whole_model
    linear_sites = {r.name for r in plan.linear.routers}
    assert any(entry.split(" @ ")[0] in linear_sites for entry in check.reverted)
    assert all(v.form is None for v in _linear_verdicts(plan))
    assert all(s.weights == "host" for s in plan.report().linear.sites)
    assert torch.equal(tiny.forward(), stock)
    plan.detach()


def test_a_compiled_plans_check_times_without_its_linear_routes_and_takes_back_only_timed_routes_when_slow():
    """A plan for a compiled model times its linear forms by their product (their quantization fuses once compiled):
    a whole too slow eagerly takes back the attention routes it timed, not the linear ones; the output floors still
    judge every route."""
    tiny = Tiny("tiny-flux")
    never_fast = dataclasses.replace(LENIENT, min_whole_ratio=1e6)  # every timed whole is too slow
    plan = _attach(tiny, profile=never_fast, linear=LinearSetting(forms=("int8_linear",), compiled=True))
    tiny.forward()
    (check,) = plan.report().whole_model
    linear = {r.name for r in plan.linear.routers}
    attention = [v for v in plan.chooser.verdicts.values() if v.site not in linear]
    assert attention and all(v.form is None and v.source == "reverted" for v in attention)
    assert any(v.form == "int8_linear" for v in _linear_verdicts(plan))  # kept: judged at their sites
    assert check.passed and "timed without the routes judged at their sites" in check.note
    assert not any(entry.split(" @ ")[0] in linear for entry in check.reverted)
    plan.detach()

    exact_output = dataclasses.replace(LENIENT, min_output_cosine=1.0)  # the floors judge the linear routes too
    plan = _attach(tiny, profile=exact_output, linear=LinearSetting(forms=("int8_linear",), compiled=True))
    tiny.forward()
    assert all(v.form is None for v in _linear_verdicts(plan))
    plan.detach()


def test_a_compiled_plan_with_linear_routes_alone_checks_their_output_and_times_nothing():
    tiny = Tiny("tiny-flux")
    plan = ditgate.attach(tiny.model, profile=dataclasses.replace(LENIENT, min_whole_ratio=1e6), forms=["sdpa_cudnn"],
                          timing_cache=False, progress=False,  # cuDNN is no CPU form: attention stays on the host
                          linear=LinearSetting(forms=("int8_linear",), compiled=True))
    tiny.forward()
    (check,) = plan.report().whole_model
    assert check.passed and check.forwards == 2 and not check.reverted  # one host pass, one routed pass
    assert check.ratio != check.ratio and "not timed" in check.note  # nan: no speed was measured
    assert "speed not timed" in plan.explain()
    assert any(v.form == "int8_linear" for v in _linear_verdicts(plan))
    plan.detach()


def test_sites_the_host_won_everywhere_run_their_own_forward_until_a_new_shape_comes():
    tiny = Tiny("tiny-wan")
    stock = tiny.forward()
    exact_output = dataclasses.replace(LENIENT, min_output_cosine=1.0)  # every linear route is taken back
    plan = _attach(tiny, profile=exact_output, linear=True)
    tiny.forward()
    routers = plan.linear.routers
    assert routers and all(r.aside and "forward" not in r.module.__dict__ for r in routers)
    calls = [r.ledger.calls for r in routers]
    assert torch.equal(tiny.forward(), stock)
    assert [r.ledger.calls for r in routers] == calls  # not routed, not counted
    assert all(s.aside for s in plan.report().linear.sites)
    keys_before = {v.shape_key for v in _linear_verdicts(plan)}

    tiny.forward(**twice(tiny.inputs))  # other shapes: the sites are routed again and their new keys measured
    assert not any(r.aside for r in routers) and all(r.module.__dict__.get("forward") == r.forward for r in routers)
    assert {v.shape_key for v in _linear_verdicts(plan)} > keys_before
    plan.detach()
    assert all("forward" not in r.module.__dict__ for r in routers)
    assert torch.equal(tiny.forward(), stock)


def test_a_static_plan_leaves_sites_no_form_serves_on_their_own_forward():
    tiny = Tiny("tiny-wan")
    plan = ditgate.attach(tiny.model, measure=False, linear=LinearSetting(forms=("int8_linear",)), progress=False)
    served = [r for r in plan.linear.routers if r.custody.payload_form is not None]
    aside = [r for r in plan.linear.routers if r.aside]
    assert served and not any(r.aside for r in served)
    for r in aside:
        assert "forward" not in r.module.__dict__ and plan.linear.context.chooser.chosen[r.name][0] is None
    plan.detach()


def test_a_plan_for_a_compiled_model_times_a_linear_form_by_its_product_alone(monkeypatch):
    from ditgate.forms.linear import Int8DynamicLinear

    quantized = []
    original = Int8DynamicLinear.quantize_input
    monkeypatch.setattr(Int8DynamicLinear, "quantize_input",
                        lambda self, x, weights=None: quantized.append(1) or original(self, x, weights))

    def calibrate(compiled: bool):
        tiny = Tiny("tiny-wan")
        quantized.clear()
        # every site's quantization fused into its producer (the down projections' apart is tested on its own)
        plan = _attach(tiny, linear=LinearSetting(forms=("int8_linear",), compiled=compiled,
                                                  activation_quantization="fused"))
        tiny.forward()
        keys = [k for k in plan.chooser.book._entries if k.shape_key.startswith("M")]
        plan.detach()
        return keys, len(quantized)

    eager_keys, eager_quantized = calibrate(False)
    compiled_keys, compiled_quantized = calibrate(True)
    timed = len(eager_keys)
    assert timed and all(k.variant == "" for k in eager_keys)
    assert all(k.variant == "compiled: product alone" for k in compiled_keys)
    assert {(k.form, k.shape_key) for k in compiled_keys} == {(k.form, k.shape_key) for k in eager_keys}
    # eager: every timed call quantizes its input; compiled: once per timed key, and once per accuracy check
    assert compiled_quantized < eager_quantized - LENIENT.rounds * timed


def test_tensor_wise_and_delayed_forms_are_timed_whole_even_for_a_compiled_model():
    """One scale per tensor cannot fold into the kernel that makes the input (the whole tensor's absmax comes first);
    the delayed form's cast folds, but its history's update adds kernels to the graph at every call. So their timing
    keeps the quantization: the eager key, not the product-alone one."""
    tiny = Tiny("tiny-wan")
    forms = ("fp8_tensor_linear", "fp8_delayed_linear", "int8_linear")
    plan = _attach(tiny, linear=LinearSetting(forms=forms, compiled=True))
    tiny.forward()
    variants = {(k.form, k.variant) for k in plan.chooser.book._entries if k.shape_key.startswith("M")}
    routed = {(v.site, v.shape_key) for v in plan.chooser.routed() if v.shape_key.startswith("M")}
    judged_apart = set(plan.chooser.per_site_speed)
    plan.detach()
    assert routed and routed <= judged_apart  # the check's eager forwards run no form as the graph will
    assert ("int8_linear", "compiled: product alone") in variants
    for name in forms[:2]:
        assert (name, "") in variants and (name, "compiled: product alone") not in variants


def test_a_receipt_carries_the_linear_verdicts_and_reapplies_them_without_measuring(tmp_path):
    tiny = Tiny("tiny-wan")
    plan = _attach(tiny, linear=True)
    tiny.forward()
    routed = tiny.forward()
    path = plan.save(tmp_path / "receipt.json")
    settled = {s.name: s.weights for s in plan.report().linear.sites}
    plan.detach()
    again = ditgate.attach(tiny.model, receipt=path, linear=True, timing_cache=False, progress=False)
    assert {s.name: s.weights for s in again.report().linear.sites} == settled  # settled at attach
    assert torch.equal(tiny.forward(), routed)
    assert again.chooser.book.timed == 0
    again.detach()


def test_a_receipt_that_chose_an_opt_in_form_reapplies_without_naming_it(tmp_path):
    tiny = Tiny("tiny-wan")
    plan = _attach(tiny, linear=["fp8_tensor_linear"])
    tiny.forward()
    routed = tiny.forward()
    settled = {s.name: s.weights for s in plan.report().linear.sites}
    assert "fp8_tensor_linear" in settled.values()  # else this test shows nothing
    path = plan.save(tmp_path / "receipt.json")
    plan.detach()
    again = ditgate.attach(tiny.model, receipt=path, linear=True, timing_cache=False, progress=False)
    assert {s.name: s.weights for s in again.report().linear.sites} == settled
    assert torch.equal(tiny.forward(), routed)
    again.detach()


def test_a_batch_of_another_size_is_served_by_the_host_with_the_reason():
    tiny = Tiny("tiny-wan")
    plan = _attach(tiny, linear=LinearSetting(forms=("int8_linear",)), on_new_shape="host")
    tiny.forward()
    site = tiny.model.blocks[0].attn1.to_q
    x = torch.randn(3, 32, 32)
    with torch.no_grad():
        out = site(x)
    router = next(r for r in plan.linear.routers if r.module is site)
    assert torch.equal(out, torch.nn.functional.linear(x, router.custody.original, site.bias))
    record = next(s for s in plan.report().linear.sites if s.name == "blocks.0.attn1.to_q")
    assert {(c.route, c.reason) for c in record.routes} >= {("host", "shape M96:K32:N32:float32 not calibrated")}
    plan.detach()


def test_an_opt_in_form_is_measured_only_where_it_is_named():
    tiny = Tiny("tiny-wan")
    named = _attach(tiny, linear=["fp8_tensor_linear"])
    tiny.forward()
    verdicts = [v for v in _linear_verdicts(named) if v.measured]
    assert verdicts and all({m.form for m in v.measured} == {"fp8_tensor_linear"} for v in verdicts)
    assert all(any(r.form == "fp8_linear" and "not among the named" in r.detail for r in v.refusals)
               for v in verdicts)
    named.detach()
    default = _attach(tiny, linear=True)
    tiny.forward()
    measured = {m.form for v in _linear_verdicts(default) for m in v.measured}
    assert "fp8_tensor_linear" not in measured and "fp8_linear" in measured
    default.detach()


def test_the_quality_profile_never_quantizes_a_linear():
    tiny = Tiny("tiny-wan")
    with pytest.raises(ValueError, match="'quality' never quantizes a linear"):
        ditgate.attach(tiny.model, linear=True)
    with pytest.raises(ValueError, match="never quantizes a linear"):
        ditgate.attach(tiny.model, forms=["sdpa_math", "fp8"], linear=True)  # named attention forms widen precision
    plan = ditgate.attach(tiny.model, measure=False)  # nothing was left attached by the refusals
    plan.detach()


def test_while_calibrating_a_site_keeps_only_the_weights_of_the_form_it_chose():
    tiny = Tiny("tiny-wan")
    kept, holder = {}, {}

    def capture(module, args, output):  # registered first: runs before the plan settles the sites
        kept.update({r.name: set(r.candidates) for r in holder["plan"].linear.routers})

    hook = tiny.model.register_forward_hook(capture)
    plan = holder["plan"] = _attach(tiny, linear=True)
    tiny.forward()
    hook.remove()
    chosen = defaultdict(set)
    for v in _linear_verdicts(plan):  # what each verdict chose before the whole-model check (which may revert it)
        chosen[v.site].add(v.chosen.form if v.chosen else None)
    assert kept and all(kept[name] == chosen[name] - {None} for name in kept)
    assert any(kept.values())
    assert all(not r.candidates for r in plan.linear.routers)  # settled: in the module, or dropped
    plan.detach()
