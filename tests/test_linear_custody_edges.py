"""What a user does to a model whose linear weights a plan holds: offloading hooks before and after attach, casts,
loading and saving state dicts, a hook that outlives detach. Each either works or stops before it changes anything,
with a sentence naming the reason; none gives a wrong result."""

import functools

import pytest
import torch

import ditgate
from ditgate.hosts.linear_weights import HeldWeight, HeldWeightError

from .helpers import Tiny


def _attach(tiny: Tiny):
    return ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False, linear=["int8_linear"], progress=False)


def _state(model: torch.nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def test_modules_an_offloading_hook_wraps_before_attach_stay_with_the_host_and_keep_the_hook():
    """Accelerate's cpu_offload (what enable_sequential_cpu_offload runs) replaces every module's forward with a hook
    that brings its weights from meta around each call: a routed forward in its place quantized a meta weight and
    then read meta tensors; now those modules are left to the host, with the reason, and the hook stays."""
    accelerate = pytest.importorskip("accelerate")
    tiny = Tiny("tiny-wan")
    stock = tiny.forward()
    accelerate.cpu_offload(tiny.model, execution_device="cpu")
    hooked = tiny.model.blocks[0].attn1.to_q.forward
    plan = _attach(tiny)
    routed = tiny.forward()
    record = plan.report().linear
    explained = " ".join(plan.explain().split())
    plan.detach()
    assert not record.sites and record.left_alone  # every linear is hooked here
    assert all("accelerate's hook replaced its forward" in why for _, why in record.left_alone)
    assert "left to the host, first" in explained
    assert torch.allclose(routed, stock, rtol=1e-4, atol=1e-5)  # the attention route aside, the host's products
    assert tiny.model.blocks[0].attn1.to_q.forward == hooked  # the hook, untouched by attach and detach
    assert torch.equal(tiny.forward(), stock)


def test_offloading_every_weight_after_attach_stops_with_the_reason():
    accelerate = pytest.importorskip("accelerate")
    tiny = Tiny("tiny-wan")
    plan = _attach(tiny)
    tiny.forward()
    with pytest.raises(HeldWeightError, match="cannot be rebuilt from other values"):
        accelerate.cpu_offload(tiny.model, execution_device="cpu")
    plan.detach()


def test_a_cast_a_held_weight_refuses_changes_nothing():
    """``model.half()`` casts module after module: it used to stop at the first held weight with the modules before
    it cast, and the model then failed on mixed dtypes (and after detach kept them)."""
    tiny = Tiny("tiny-flux")
    before = _state(tiny.model)
    plan = _attach(tiny)
    routed = tiny.forward()
    with pytest.raises(HeldWeightError, match="cannot be cast to torch.float16"):
        tiny.model.half()
    assert {p.dtype for p in tiny.model.parameters()} == {torch.float32}
    assert torch.equal(tiny.forward(), routed)
    tiny.model.to("cpu")  # a move is not refused
    assert torch.equal(tiny.forward(), routed)
    plan.detach()
    assert _same_state(_state(tiny.model), before)
    assert "_apply" not in tiny.model.__dict__  # the guard went with the plan
    tiny.model.half()  # and the model casts again
    assert {p.dtype for p in tiny.model.parameters()} == {torch.float16}


def test_loading_weights_a_plan_holds_is_refused_before_anything_is_copied():
    tiny, other = Tiny("tiny-wan"), Tiny("tiny-wan", seed=1)
    before = _state(tiny.model)
    plan = _attach(tiny)
    tiny.forward()
    with pytest.raises(HeldWeightError, match="load_state_dict refused before it changed anything"):
        tiny.model.load_state_dict(_state(other.model))
    plan.detach()
    assert _same_state(_state(tiny.model), before)
    # what the plan does not hold still loads while it is attached
    plan = _attach(tiny)
    tiny.forward()
    norm = {"scale_shift_table": other.model.scale_shift_table.detach().clone()}
    tiny.model.load_state_dict(norm, strict=False)
    assert torch.equal(tiny.model.scale_shift_table, norm["scale_shift_table"])
    plan.detach()


def test_an_attached_model_saves_the_weights_it_was_loaded_with(tmp_path):
    """``state_dict()`` gives each held site's host values in place of its stand-in (pinned CPU memory here), so
    ``save_pretrained`` writes the model as loaded; before, the stand-ins failed it or were saved as empty tensors."""
    tiny = Tiny("tiny-wan")
    before = _state(tiny.model)
    plan = _attach(tiny)
    tiny.forward()
    attached = tiny.model.state_dict()
    tiny.model.save_pretrained(tmp_path)
    plan.detach()
    assert not any(isinstance(v, HeldWeight) for v in attached.values())
    assert _same_state({k: v.detach() for k, v in attached.items()}, before)
    reloaded = type(tiny.model).from_pretrained(tmp_path)
    assert _same_state(_state(reloaded), before)


def test_a_hook_that_wraps_a_routed_forward_after_attach_gets_the_hosts_product_after_detach():
    """Detach cannot take its forward out from under a hook installed later (group offloading, a user's wrapper); the
    forward the hook kept must then be the module's own product, not the form's."""
    tiny = Tiny("tiny-flux")
    stock = tiny.forward()
    plan = _attach(tiny)
    routed = tiny.forward()
    module = tiny.model.transformer_blocks[0].attn.to_q
    kept = module.forward  # the routed forward, wrapped the way a hook wraps it
    module.forward = functools.partial(lambda inner, x: inner(x), kept)
    plan.detach()
    assert not torch.equal(routed, stock)
    assert torch.equal(tiny.forward(), stock)


def test_a_detach_that_fails_at_one_site_restores_the_others_and_a_second_detach_finishes(monkeypatch):
    """A copy back that fails (memory) at one site: the other sites and the guards are restored, the failed site still
    serves the host's product from its held values and saves them, and the plan stays attached until a second
    detach restores it."""
    tiny = Tiny("tiny-flux")
    stock, before = tiny.forward(), _state(tiny.model)
    plan = _attach(tiny)
    tiny.forward()
    failing = plan.linear.routers[2]
    restore = type(failing.custody).restore

    def out_of_memory(custody):
        if custody is failing.custody:
            raise torch.OutOfMemoryError("simulated: out of memory copying the weight back")
        return restore(custody)

    monkeypatch.setattr(type(failing.custody), "restore", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        plan.detach()
    monkeypatch.setattr(type(failing.custody), "restore", restore)
    assert plan.attached and isinstance(tiny.model.get_submodule(failing.name).weight, HeldWeight)
    assert sum(isinstance(r.module.weight, HeldWeight) for r in plan.linear.routers) == 1
    assert torch.allclose(tiny.forward(), stock, rtol=1e-4, atol=1e-5)  # the host everywhere, the held site too
    assert _same_state(_state(tiny.model), before)
    plan.detach()
    assert not plan.attached and torch.equal(tiny.forward(), stock) and _same_state(_state(tiny.model), before)


def test_an_attach_whose_calibration_raises_leaves_the_model_as_it_came():
    from .helpers import LENIENT_SPEED

    tiny = Tiny("tiny-flux")
    stock, before = tiny.forward(), _state(tiny.model)

    def interrupted():
        tiny.forward()
        raise KeyboardInterrupt("calibration interrupted")

    with pytest.raises(KeyboardInterrupt):
        ditgate.attach(tiny.model, profile=LENIENT_SPEED, forms=["sdpa_math"], linear=True, calibrate=interrupted,
                       progress=False, timing_cache=False)
    assert not any("forward" in m.__dict__ or "_apply" in m.__dict__ for m in tiny.model.modules())
    assert not tiny.model._load_state_dict_pre_hooks and "fuse_lora" not in tiny.model.__dict__
    assert torch.equal(tiny.forward(), stock) and _same_state(_state(tiny.model), before)
    _attach(tiny).detach()  # and it attaches again


def test_a_module_whose_hook_was_taken_off_is_routed_again():
    """Taking an offloading hook off (accelerate's remove_hook_from_module, pipe.remove_all_hooks) leaves the module's
    own bound forward as an instance attribute: that is no hook."""
    accelerate = pytest.importorskip("accelerate")
    from accelerate.hooks import remove_hook_from_module

    tiny = Tiny("tiny-wan")
    accelerate.cpu_offload(tiny.model, execution_device="cpu")
    remove_hook_from_module(tiny.model, recurse=True)
    plan = _attach(tiny)
    record = plan.report().linear
    plan.detach()
    assert record.sites and not record.left_alone


def test_a_pipeline_cast_to_another_dtype_is_refused_before_any_component_changes(tmp_path):
    from diffusers import DiffusionPipeline

    class Pipe(DiffusionPipeline):
        def __init__(self, text_encoder, transformer):
            super().__init__()
            self.register_modules(text_encoder=text_encoder, transformer=transformer)

    encoder, denoiser = Tiny("tiny-flux", seed=1), Tiny("tiny-wan")
    pipe = Pipe(encoder.model, denoiser.model)
    plan = ditgate.attach(pipe, forms=["sdpa_math"], measure=False, linear=["int8_linear"], progress=False)
    denoiser.forward()
    with pytest.raises(HeldWeightError, match=r"\.to\(torch.float16\) refused before it changed anything"):
        pipe.to(torch.float16)
    assert {p.dtype for m in (encoder.model, denoiser.model) for p in m.parameters()} == {torch.float32}
    pipe.to("cpu")  # a move is not refused
    kept = denoiser.model.state_dict(keep_vars=True)["blocks.0.attn1.to_q.weight"]
    assert isinstance(kept, torch.nn.Parameter) and not isinstance(kept, HeldWeight)  # keep_vars: the Parameter
    held = denoiser.model.blocks[0].attn1.to_q.weight
    with torch.enable_grad():
        assert held.requires_grad and isinstance(held[...], HeldWeight)  # a view of it is a stand-in, not an error
    plan.detach()
    assert "to" not in vars(pipe)
    pipe.to(torch.float16)
    assert {p.dtype for p in denoiser.model.parameters()} == {torch.float16}
