"""LoRA (diffusers' PEFT integration) on a plan whose linear sites are quantized: loaded before or after attach,
two adapters, disabled, unloaded, fusing refused; the LoRA branch at full precision beside the quantized base."""

import pytest
import torch

import ditgate
from ditgate.hosts.linear_weights import LoraFuseRefusedError

from .helpers import Tiny

peft = pytest.importorskip("peft")

TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "net.2")


def _lora_state(seed: int) -> dict:
    """A LoRA for tiny Wan as diffusers would load it from a file: PEFT's state dict, B not zero."""
    from peft.utils import get_peft_model_state_dict

    donor = Tiny("tiny-wan")
    torch.manual_seed(seed)
    donor.model.add_adapter(peft.LoraConfig(r=4, lora_alpha=8, target_modules=list(TARGETS), init_lora_weights=False),
                            adapter_name="donor")
    return {k: v.clone() for k, v in get_peft_model_state_dict(donor.model, adapter_name="donor").items()}


def _attach(tiny: Tiny):
    return ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False, linear=["int8_linear"])


def _load(tiny: Tiny, seed: int, name: str) -> None:
    tiny.model.load_lora_adapter(_lora_state(seed), adapter_name=name, prefix=None)


def test_a_lora_loaded_before_or_after_attach_runs_beside_the_quantized_base():
    before, after = Tiny("tiny-wan"), Tiny("tiny-wan")
    _load(before, 1, "a")
    plan_before = _attach(before)
    plan_after = _attach(after)
    _load(after, 1, "a")
    out_before, out_after = before.forward(), after.forward()
    assert torch.equal(out_before, out_after)  # the same sites, the same quantized bases, the same LoRA branches
    for plan, tiny in ((plan_before, before), (plan_after, after)):
        wrapper = tiny.model.blocks[0].attn1.to_q
        assert wrapper.base_layer is next(r.module for r in plan.linear.routers if r.name == "blocks.0.attn1.to_q")
        lora_a = wrapper.lora_A["a"].weight
        assert lora_a.dtype == torch.float32 and lora_a.device.type == "cpu"  # never quantized, beside the base
        assert all(s.serving == "int8_linear" for s in plan.report().linear.sites)
    # at one site: the quantized base's product plus the host's LoRA branch, up to float32 rounding
    wrapper = after.model.blocks[1].ffn.net[2]
    x = torch.randn(1, 32, 32)
    with torch.no_grad():
        base = wrapper.base_layer(x)
        expected = base + wrapper.lora_B["a"](wrapper.lora_A["a"](x)) * wrapper.scaling["a"]
        assert torch.allclose(wrapper(x), expected, rtol=0, atol=1e-6)
        held = next(r for r in plan_after.linear.routers if r.name == "blocks.1.ffn.net.2").custody.original
        host_base = torch.nn.functional.linear(x, held, wrapper.base_layer.bias)
    assert not torch.equal(base, host_base)  # the base really is the quantized one
    plan_before.detach()
    plan_after.detach()


def test_two_adapters_disable_unload_and_detach():
    tiny = Tiny("tiny-wan")
    stock = tiny.forward()
    plan = _attach(tiny)
    quantized = tiny.forward()
    _load(tiny, 1, "a")
    _load(tiny, 2, "b")
    tiny.model.set_adapters(["a", "b"], weights=[1.0, 0.5])
    both = tiny.forward()
    tiny.model.set_adapters("a")
    only_a = tiny.forward()
    assert not torch.equal(both, only_a) and not torch.equal(only_a, quantized)
    tiny.model.disable_lora()
    assert torch.equal(tiny.forward(), quantized)  # adapters off: the routed model as it was
    tiny.model.enable_lora()
    with pytest.raises(LoraFuseRefusedError, match="fuse_lora refused"):
        tiny.model.fuse_lora()
    assert torch.equal(tiny.forward(), only_a)  # the refusal changed nothing
    tiny.model.unload_lora()
    assert torch.equal(tiny.forward(), quantized)  # unloading leaves the routed model as it was
    assert all(s.serving == "int8_linear" for s in plan.report().linear.sites)
    plan.detach()
    assert torch.equal(tiny.forward(), stock)
    assert "fuse_lora" not in tiny.model.__dict__


def test_detach_with_a_lora_loaded_leaves_the_lora_on_the_host_model():
    tiny, reference = Tiny("tiny-wan"), Tiny("tiny-wan")
    _load(reference, 3, "a")
    plan = _attach(tiny)
    _load(tiny, 3, "a")
    plan.detach()
    assert torch.equal(tiny.forward(), reference.forward())
    tiny.model.fuse_lora()  # with no plan attached, fusing is the host's business again
    assert torch.allclose(tiny.forward(), reference.forward(), atol=1e-5)


def test_a_pipelines_lora_verbs_with_a_plan_attached():
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    tiny = Tiny("tiny-wan")
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=FlowMatchEulerDiscreteScheduler(),
                       transformer=tiny.model)
    plan = ditgate.attach(pipe, forms=["sdpa_math"], measure=False, linear=["int8_linear"])
    quantized = tiny.forward()
    pipe.load_lora_weights({f"transformer.{k}": v for k, v in _lora_state(4).items()}, adapter_name="a")
    with_lora = tiny.forward()
    assert not torch.equal(with_lora, quantized)
    with pytest.raises(LoraFuseRefusedError):
        pipe.fuse_lora(components=["transformer"])
    pipe.unload_lora_weights()
    assert torch.equal(tiny.forward(), quantized)
    plan.detach()


@pytest.mark.slow  # ten blocks traced apart by dynamo (aot_eager), twice: 10-20 s
def test_lora_on_a_quantized_model_under_regional_compilation_past_dynamos_limit():
    """What a user stacks: attach (linear sites on INT8), load a LoRA, compile_repeated_blocks(fullgraph=True) on a
    model of more blocks than dynamo's default limit of graphs per code object, unload the LoRA, detach."""
    import dataclasses

    base = Tiny("tiny-wan").preset
    tiny = Tiny(dataclasses.replace(base, config=dict(base.config, num_layers=10)))
    stock = tiny.forward()
    with torch._dynamo.config.patch(recompile_limit=8, accumulated_recompile_limit=256):  # torch's defaults
        plan = _attach(tiny)
        quantized = tiny.forward()
        _load(tiny, 4, "a")
        eager_lora = tiny.forward()
        assert not torch.equal(eager_lora, quantized)
        tiny.model.compile_repeated_blocks(backend="aot_eager", fullgraph=True)
        assert all(torch.allclose(tiny.forward(), eager_lora, rtol=1e-5, atol=1e-6) for _ in range(2))
        tiny.model.delete_adapters("a")
        assert torch.allclose(tiny.forward(), quantized, rtol=1e-5, atol=1e-6)
        plan.detach()
        assert torch.allclose(tiny.forward(), stock, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()
