"""Exact detach, scoping to the attached model, attach-twice and detach-twice, pipelines."""

import pytest
import torch

import ditgate
from ditgate.hosts import find_attention_modules, model_output

from .helpers import TINY, Tiny


def _processors(model):
    return [m.module.processor for m in find_attention_modules(model)]


@pytest.mark.parametrize("name", TINY)
def test_detach_is_bit_exact(name):
    tiny = Tiny(name)
    before = tiny.forward()
    state = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    procs = _processors(tiny.model)
    plan = ditgate.attach(tiny.model)  # measuring plan with its hooks
    tiny.forward()
    tiny.forward()
    plan.detach()
    assert torch.equal(tiny.forward(), before)
    assert all(a is b for a, b in zip(_processors(tiny.model), procs))
    after = tiny.model.state_dict()
    assert state.keys() == after.keys() and all(torch.equal(state[k], after[k]) for k in state)
    assert not tiny.model._forward_hooks and not tiny.model._forward_pre_hooks


def test_detach_twice_is_a_no_op_and_attach_twice_is_an_error():
    tiny = Tiny("tiny-wan")
    plan = ditgate.attach(tiny.model, measure=False)
    with pytest.raises(ditgate.AlreadyAttachedError, match="already routed"):
        ditgate.attach(tiny.model)
    plan.detach()
    plan.detach()
    assert not plan.attached
    again = ditgate.attach(tiny.model, measure=False)  # after detach the model can be attached anew
    again.detach()


def test_an_unattached_model_runs_exactly_as_without_ditgate():
    import diffusers.models.transformers.transformer_wan as wan_module

    original_dispatch = wan_module.dispatch_attention_fn
    a, b = Tiny("tiny-wan", seed=0), Tiny("tiny-wan", seed=1)
    b_before = b.forward()
    b_procs = _processors(b.model)
    plan = ditgate.attach(a.model, forms=["sdpa_math"], measure=False)
    a.forward()
    assert wan_module.dispatch_attention_fn is original_dispatch  # nothing process-wide was patched
    assert torch.equal(b.forward(), b_before)
    assert all(p1 is p2 for p1, p2 in zip(_processors(b.model), b_procs))
    assert all(s.calls == 1 for s in plan.report().sites)  # b's calls never reached a's plan
    plan.detach()
    assert wan_module.dispatch_attention_fn is original_dispatch


def test_every_denoiser_of_a_pipeline_is_attached():
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    high, low = Tiny("tiny-wan", seed=0), Tiny("tiny-wan", seed=1)
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=FlowMatchEulerDiscreteScheduler(),
                       transformer=high.model, transformer_2=low.model)
    plan = ditgate.attach(pipe, forms=["sdpa_math"], measure=False)
    high.forward()
    low.forward()
    names = [s.name for s in plan.report().sites]
    assert sum(n.startswith("transformer.") for n in names) == 4
    assert sum(n.startswith("transformer_2.") for n in names) == 4
    assert all(s.calls == 1 for s in plan.report().sites)
    plan.detach()


def test_one_model_under_two_denoiser_names_is_one_denoiser():
    """A two-expert pipeline given the same model twice: a measuring plan hooked it twice and its first forward raised
    (the whole-model check's nested forward took one hook off under the other)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    from .helpers import LENIENT_SPEED

    tiny = Tiny("tiny-wan")
    stock = tiny.forward()
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=FlowMatchEulerDiscreteScheduler(),
                       transformer=tiny.model, transformer_2=tiny.model)
    plan = ditgate.attach(pipe, profile=LENIENT_SPEED, forms=["sdpa_math"], timing_cache=False, progress=False)
    calibrated = tiny.forward()
    names = [s.name for s in plan.report().sites]
    plan.detach()
    assert torch.allclose(calibrated, stock, rtol=1e-4, atol=1e-5)
    assert names and all(n.startswith("transformer.") for n in names)
    assert torch.equal(tiny.forward(), stock)


def test_processors_saved_while_attached_call_the_hosts_code_after_detach():
    """``saved = model.attn_processors`` while attached, then ``set_attn_processor(saved)`` after detach: the saved
    routed copies kept routing into the detached plan, and a second attach refused the model as already routed."""
    from .helpers import FakeForm

    tiny = Tiny("tiny-wan")
    stock = tiny.forward()
    noisy = FakeForm("noisy", noise=0.5)
    plan = ditgate.attach(tiny.model, forms=["noisy"], extra_forms=[noisy], measure=False)
    saved = tiny.model.attn_processors
    assert not torch.equal(tiny.forward(), stock)
    plan.detach()
    tiny.model.set_attn_processor(saved)
    assert torch.equal(tiny.forward(), stock)
    ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False).detach()
    import pickle

    assert pickle.loads(pickle.dumps(tiny.model)) is not None  # the saved copies are of the original class again


def test_an_attached_model_refuses_to_be_copied_and_copies_after_detach():
    """A deep copy shared the plan's routed processors, forward and hooks with the original: its forward calibrated
    the original's plan, or returned the original model's output."""
    import copy
    import pickle

    from ditgate.hosts.intercept import AttachedCopyError

    tiny = Tiny("tiny-wan")
    stock = tiny.forward()
    plan = ditgate.attach(tiny.model, forms=["sdpa_math"])  # measuring: hooks and an eager forward too
    with pytest.raises(AttachedCopyError, match="detach the plan"):
        copy.deepcopy(tiny.model)
    processor = tiny.model.blocks[0].attn1.processor  # the processors alone copy (diffusers' ComponentsManager does)
    for copied in (copy.copy(processor), copy.deepcopy(processor)):
        assert type(copied) is type(processor).__mro__[1] and copied.__dict__.keys() == processor.__dict__.keys()
    plan.detach()
    plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False)
    with pytest.raises(AttachedCopyError):
        pickle.dumps(tiny.model)
    plan.detach()
    copied = copy.deepcopy(tiny.model)
    with torch.no_grad():
        assert torch.equal(model_output(copied(**tiny.inputs)), stock)
    assert pickle.loads(pickle.dumps(tiny.model)) is not None


def test_attach_rejects_what_is_not_a_model_or_pipeline():
    with pytest.raises(TypeError, match="diffusers pipeline or a torch.nn.Module"):
        ditgate.attach("a string")

    class NoDenoiser:
        components = {"vae": torch.nn.Linear(2, 2)}

    with pytest.raises(ValueError, match="no denoiser"):
        ditgate.attach(NoDenoiser())
