"""LoRA states a plan must not quantize under: a LoRA fused into the weight before attach, a DoRA adapter; and the
base weights' ``requires_grad`` as PEFT leaves them, after detach."""

import pytest
import torch

import ditgate
from ditgate.hosts.linear_weights import HeldWeightError

from .helpers import Tiny

peft = pytest.importorskip("peft")


def _lora_state(seed: int, **config) -> dict:
    from peft.utils import get_peft_model_state_dict

    donor = Tiny("tiny-wan")
    torch.manual_seed(seed)
    donor.model.add_adapter(peft.LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "net.2"],
                                            init_lora_weights=False, **config), adapter_name="donor")
    return {k: v.clone() for k, v in get_peft_model_state_dict(donor.model, adapter_name="donor").items()}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _attach(tiny: Tiny):
    return ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False, linear=["int8_linear"], progress=False)


def test_a_lora_fused_before_attach_keeps_its_sites_on_the_host_so_unfusing_still_works():
    """PEFT unfuses by subtracting the delta from the weight's values (also inside a forward, after disable_lora): at
    a quantized site that failed half way and left the delta applied twice after detach."""
    state = _lora_state(3)
    reference, tiny = Tiny("tiny-wan"), Tiny("tiny-wan")
    for t in (reference, tiny):
        t.model.load_lora_adapter(state, adapter_name="a", prefix=None)
        t.model.fuse_lora()
    plan = _attach(tiny)
    record = plan.report().linear
    fused = {name for name, why in record.left_alone if "fused into its weight" in why}
    with_lora = reference.forward()
    tiny.model.disable_lora()
    reference.model.disable_lora()
    unfused = tiny.forward()
    plan.detach()
    without = reference.forward()
    assert fused and all(name.endswith(("to_q", "net.2")) for name in fused)
    assert not fused & {s.name for s in record.sites}
    assert _rel(unfused, without) < 0.2 * _rel(with_lora, without)  # the delta gone, the other sites' 8-bit error left
    tiny.model.unfuse_lora()
    reference.model.unfuse_lora()
    for (name, a), (_, b) in zip(tiny.model.state_dict().items(), reference.model.state_dict().items()):
        assert torch.equal(a, b), name


def test_a_dora_adapter_keeps_its_sites_on_the_host_and_one_loaded_after_attach_says_why():
    """DoRA reads its base weight's values on every call (its weight norm)."""
    state = _lora_state(5, use_dora=True)
    reference, tiny = Tiny("tiny-wan"), Tiny("tiny-wan")
    for t in (reference, tiny):
        t.model.load_lora_adapter(state, adapter_name="d", prefix=None)
    plan = _attach(tiny)
    out = tiny.forward()
    record = plan.report().linear
    plan.detach()
    assert any("DoRA" in why for _, why in record.left_alone)
    assert _rel(out, reference.forward()) < 0.02  # the other sites' 8-bit error
    late = Tiny("tiny-wan")
    plan = _attach(late)
    with pytest.raises(HeldWeightError, match="a DoRA adapter"):
        late.model.load_lora_adapter(state, adapter_name="d", prefix=None)
    plan.detach()


def test_the_base_weights_requires_grad_after_detach_is_what_peft_left_it():
    """PEFT freezes the base weights of the modules it wraps; a plan that held some of them hands the flag back as
    PEFT set it on the stand-in, not as it was at attach."""
    state = _lora_state(7)
    reference, tiny = Tiny("tiny-wan"), Tiny("tiny-wan")
    reference.model.load_lora_adapter(state, adapter_name="a", prefix=None)
    plan = _attach(tiny)
    tiny.model.load_lora_adapter(state, adapter_name="a", prefix=None)
    plan.detach()
    flags = {n: p.requires_grad for n, p in tiny.model.named_parameters()}
    assert flags == {n: p.requires_grad for n, p in reference.model.named_parameters()}
    assert not flags["blocks.0.attn1.to_q.base_layer.weight"]
