"""Linear sites on tiny real models: discovery and roles, static routing, exact detach, the held host weight, calls
the forms cannot take, and a raising form."""

import re

import pytest
import torch
import torch.nn.functional as F

import ditgate
from ditgate.gate import compare
from ditgate.gate.linear import LinearSetting
from ditgate.hosts.linear_weights import HeldWeight, HeldWeightError
from ditgate.hosts.linears import TOKEN_ROLES, find_linear_sites

from .helpers import Tiny

FAMILIES = ("tiny-wan", "tiny-flux", "tiny-ltx", "tiny-hunyuan-video")
# what each family's linears are, by the end of their path (N: a block index)
EXPECTED_ROLES = {
    "tiny-wan": {"blocks.N.attn1.to_q": "attn.q", "blocks.N.attn2.to_out.0": "attn.out",
                 "blocks.N.ffn.net.N.proj": "feed-forward", "blocks.N.ffn.net.2": "feed-forward",
                 "condition_embedder.time_proj": "modulation", "condition_embedder.time_embedder.linear_1": "embedding",
                 "condition_embedder.text_embedder.linear_2": "embedding", "proj_out": "output"},
    "tiny-flux": {"transformer_blocks.N.attn.add_k_proj": "attn.add_k", "transformer_blocks.N.attn.to_add_out":
                  "attn.add_out", "transformer_blocks.N.norm1.linear": "modulation",
                  "transformer_blocks.N.ff_context.net.2": "feed-forward", "single_transformer_blocks.N.proj_mlp":
                  "feed-forward", "single_transformer_blocks.N.norm.linear": "modulation", "x_embedder": "embedding",
                  "norm_out.linear": "modulation", "proj_out": "output"},
    "tiny-ltx": {"transformer_blocks.N.attn2.to_k": "attn.k", "transformer_blocks.N.ff.net.N.proj": "feed-forward",
                 "time_embed.linear": "modulation", "proj_in": "embedding", "caption_projection.linear_1": "embedding",
                 "proj_out": "output"},
    "tiny-hunyuan-video": {"context_embedder.token_refiner.refiner_blocks.N.ff.net.N.proj": "feed-forward",
                           "context_embedder.token_refiner.refiner_blocks.N.norm_out.linear": "modulation",
                           "time_text_embed.guidance_embedder.linear_2": "embedding",
                           "transformer_blocks.N.attn.add_q_proj": "attn.add_q",
                           "single_transformer_blocks.N.proj_out": "feed-forward", "proj_out": "output"},
}


def _generic(path: str) -> str:
    return re.sub(r"\.\d+\.", ".N.", path)


def _host_forward_of_sites(tiny: Tiny, **static) -> torch.Tensor:
    """The forward with the same (exact, static) attention routes and every linear on the host."""
    plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False, **static)
    out = tiny.forward()
    plan.detach()
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_every_linear_is_a_site_with_its_role(family):
    tiny = Tiny(family)
    sites = find_linear_sites(tiny.model, prefix="transformer")
    linears = [m for m in tiny.model.modules() if isinstance(m, torch.nn.Linear)]
    assert [s.module for s in sites] == linears
    roles = {_generic(s.path.removeprefix("transformer.")): s.role for s in sites}
    for path, role in EXPECTED_ROLES[family].items():
        assert roles[path] == role, path
    assert {"attn.q", "attn.k", "attn.v", "feed-forward", "modulation"} <= set(roles.values())


@pytest.mark.parametrize("family", FAMILIES)
def test_a_static_plan_serves_the_per_token_sites_and_detaches_bit_exactly(family):
    tiny = Tiny(family)
    before = tiny.forward()
    state = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    params = {k: (p, p.dtype, p.device) for k, p in tiny.model.named_parameters()}
    host = _host_forward_of_sites(tiny)
    plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False, linear=["int8_linear"])
    routed = tiny.forward()
    record = plan.report().linear
    assert {s.role for s in record.sites} <= set(TOKEN_ROLES)
    assert all(s.serving == "int8_linear" and s.weights == "int8_linear" and s.calls >= 1 for s in record.sites)
    assert all(re.fullmatch(r"M\d+:K\d+:N\d+:float32", key) for s in record.sites for key in s.shapes)
    acc = compare(routed, host)
    assert 0.9999 < acc.cosine < 1 and acc.rel_l2 > 0
    plan.detach()
    assert torch.equal(tiny.forward(), before)
    after = tiny.model.state_dict()
    assert after.keys() == state.keys() and all(torch.equal(after[k], state[k]) for k in state)
    for k, p in tiny.model.named_parameters():  # the same Parameter objects, dtype and device
        assert params[k] == (p, p.dtype, p.device), k
    assert not any(isinstance(b, torch.Tensor) and "ditgate" in n for n, b in tiny.model.named_buffers())
    again = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False, linear=["int8_linear"])
    assert torch.equal(tiny.forward(), routed)  # a second attach serves the same routes
    again.detach()
    assert torch.equal(tiny.forward(), before)


def test_the_host_weight_waits_in_cpu_memory_behind_a_stand_in():
    """On a CPU the held copy is plain CPU memory (pinning needs CUDA); the module's weight is a stand-in with the
    host's shape, dtype and device, which PEFT and ModelMixin read, and which refuses to be computed with."""
    tiny = Tiny("tiny-wan")
    module = tiny.model.blocks[0].attn1.to_q
    original = module.weight
    values, storage = original.detach().clone(), original.data_ptr()
    plan = ditgate.attach(tiny.model, measure=False, linear=True)
    stand_in = module.weight
    assert isinstance(stand_in, HeldWeight) and isinstance(stand_in, torch.nn.Parameter)
    assert (stand_in.shape, stand_in.dtype, stand_in.device) == (values.shape, values.dtype, values.device)
    assert original.data_ptr() != storage and torch.equal(original.data, values)  # a copy, held by the plan
    assert tiny.model.dtype == torch.float32 and tiny.model.device.type == "cpu"
    tiny.model.to("cpu")  # moving the model moves the stand-in and the 8-bit buffers with it
    assert isinstance(module.weight, HeldWeight) and module.ditgate_qweight.view(torch.float8_e4m3fn).numel() > 0
    with pytest.raises(HeldWeightError, match="blocks.0.attn1.to_q's weight is quantized"):
        module.weight.data.add_(1)
    with pytest.raises(HeldWeightError, match="detach the plan"):
        tiny.model.to(torch.float64)
    plan.detach()
    assert module.weight is original and torch.equal(original, values) and original.dtype == torch.float32


def test_moving_the_model_to_its_own_dtype_leaves_the_quantized_weights_as_they_were():
    """``module.to(dtype)`` casts a module's floating buffers: the 8-bit weights and their float32 scales are held as
    integer bits, so ``pipe.to(torch.float32)`` on a float32 model does not turn them into float32 values."""
    tiny = Tiny("tiny-wan")
    plan = ditgate.attach(tiny.model, measure=False, linear=LinearSetting(forms=("fp8_linear",)), progress=False)
    routed = tiny.forward()
    router = next(r for r in plan.linear.routers if r.custody.payload_form == "fp8_linear")
    before = router.custody.payload()
    tiny.model.to(torch.float32)
    after = router.custody.payload()
    assert (after.data.dtype, after.scale.dtype) == (torch.float8_e4m3fn, torch.float32)
    assert torch.equal(after.data.view(torch.uint8), before.data.view(torch.uint8))
    assert torch.equal(after.scale, before.scale)
    assert torch.equal(tiny.forward(), routed)
    plan.detach()


def test_keep_host_on_the_device_keeps_the_original_values_in_place():
    tiny = Tiny("tiny-wan")
    module = tiny.model.blocks[0].ffn.net[2]
    storage = module.weight.data_ptr()
    plan = ditgate.attach(tiny.model, measure=False, linear=LinearSetting(forms=("int8_linear",), keep_host="device"))
    tiny.forward()
    site = next(s for s in plan.report().linear.sites if s.name == "blocks.0.ffn.net.2")
    payload = module.ditgate_qweight.numel() + module.ditgate_wscale.numel() * 4
    assert site.bytes_now == site.bytes_before + payload
    plan.detach()
    assert module.weight.data_ptr() == storage


def _router(plan, module):
    return next(r for r in plan.linear.routers if r.module is module)


def _site_routes(plan, name: str) -> dict:
    site = next(s for s in plan.report().linear.sites if s.name == name)
    return {(c.route, c.reason): c.calls for c in site.routes}


def test_autograd_takes_the_host_path_with_the_held_weight():
    tiny = Tiny("tiny-wan")
    plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False, linear=["int8_linear"])
    module = tiny.model.blocks[0].attn1.to_k
    held = _router(plan, module).custody.original
    x = torch.randn(1, 40, 32, requires_grad=True)
    out = module(x)
    assert torch.equal(out, F.linear(x, held, module.bias))
    out.sum().backward()  # gradients reach the input and the host's own weight
    assert x.grad is not None and held.grad is not None
    assert _site_routes(plan, "blocks.0.attn1.to_k") == {
        ("host", "int8_linear: autograd is on and the form has no backward"): 1}
    plan.detach()


def test_a_float32_input_to_a_bfloat16_site_is_the_hosts_autocast_product():
    tiny = Tiny("tiny-wan")
    tiny.model.to(torch.bfloat16)
    module = tiny.model.blocks[0].ffn.net[2]
    x = torch.randn(2, 40, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        stock = module(x)
        plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False, linear=["int8_linear"])
        routed = module(x)
        served = module(x.to(torch.bfloat16))
    assert torch.equal(routed, stock)
    assert _site_routes(plan, "blocks.0.ffn.net.2") == {
        ("host", "int8_linear: input float32, host weight bfloat16"): 1, ("host", "int8_linear: autocast is on"): 1}
    with torch.no_grad():
        assert module(x.to(torch.bfloat16)).dtype == torch.bfloat16
    assert _site_routes(plan, "blocks.0.ffn.net.2")[("int8_linear", "")] == 1
    assert compare(served.float(), stock.float()).cosine > 0.999
    plan.detach()


def test_a_raising_form_hands_the_call_to_the_host_and_is_counted():
    tiny = Tiny("tiny-ltx")
    host = _host_forward_of_sites(tiny)
    plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False, linear=["int8_linear"])
    form = plan.linear.context.forms["int8_linear"]

    def explode(*args, **kwargs):
        raise RuntimeError("int8 exploded on purpose")

    form.run = explode
    outs = [tiny.forward() for _ in range(4)]
    assert all(torch.equal(out, host) for out in outs)  # every call the host's
    for site in plan.report().linear.sites:
        (failure,) = site.failures
        assert failure.failures == 3 and failure.disabled and "exploded on purpose" in failure.last_error
        routes = {(c.route, c.reason.split(" (")[0]): c.calls for c in site.routes}
        assert routes[("host", "int8_linear raised")] == 3
        assert routes[("host", "int8_linear: disabled after 3 failures; last: RuntimeError: int8 exploded on purpose")] \
            == site.calls - 3
    plan.detach()


@pytest.mark.parametrize("family", ["tiny-flux", "tiny-wan"])
def test_the_projections_diffusers_fused_are_per_token_sites_a_static_plan_serves(family):
    """``fuse_qkv_projections()`` before attach (diffusers' recipe for Flux with torchao): the fused products are
    sites of their own roles, served like the projections they replace, and detach leaves the fused model as it was."""
    fused, unfused = Tiny(family), Tiny(family)
    fused.model.fuse_qkv_projections()
    state = {k: v.clone() for k, v in fused.model.state_dict().items()}
    plans = [ditgate.attach(t.model, forms=["sdpa_math"], measure=False, linear=["int8_linear"])
             for t in (fused, unfused)]
    outs = [t.forward() for t in (fused, unfused)]
    record = plans[0].report().linear
    for plan in plans:
        plan.detach()
    roles = {s.role for s in record.sites if s.calls}
    assert {"attn.qkv"} <= roles <= set(TOKEN_ROLES)
    assert {"attn.add_qkv" if family == "tiny-flux" else "attn.kv"} <= roles
    fused_roles = ("attn.qkv", "attn.kv", "attn.add_qkv", "attn.add_kv")
    assert all(s.serving == "int8_linear" for s in record.sites if s.role in fused_roles)
    assert compare(outs[0], outs[1]).cosine > 0.99999  # per-row input scales and per-channel weight scales alike
    assert all(torch.equal(v, state[k]) for k, v in fused.model.state_dict().items()) and state.keys() == \
        fused.model.state_dict().keys()


def test_a_fused_models_projections_that_calibration_never_called_leave_the_device_and_come_back_when_called():
    """A measured plan on a model running diffusers' fused projections: the separate Q/K/V projections are not called
    (the fused one is), so their host weights leave the device like a quantized site's; after
    ``unfuse_qkv_projections`` their first call measures them, served from the held values."""
    from .helpers import LENIENT_SPEED

    fused = Tiny("tiny-flux")
    fused.model.fuse_qkv_projections()
    state = {k: v.clone() for k, v in fused.model.state_dict().items()}
    plan = ditgate.attach(fused.model, profile=LENIENT_SPEED, forms=["sdpa_math"], timing_cache=False,
                          progress=False, linear=ditgate.LinearSetting(forms=("int8_linear",)))
    fused.forward()
    record = {s.name: s for s in plan.report().linear.sites}
    away = [s for name, s in record.items() if name.endswith(("attn.to_q", "attn.to_k", "attn.add_v_proj"))]
    held = [fused.model.get_submodule(s.name).weight for s in away]
    assert away and all(s.calls == 0 for s in away)
    assert all(isinstance(w, HeldWeight) for w in held)  # on a GPU: bytes_now the bias alone (a CPU is the device)
    with pytest.raises(Exception, match="not called while its attention runs the fused projection to_qkv"):
        fused.model.transformer_blocks[0].attn.to_q.weight.clone()
    fused.model.unfuse_qkv_projections()  # the processor calls the separate projections again
    unfused = fused.forward()
    served = {s.name: s for s in plan.report().linear.sites}
    plan.detach()
    assert all(served[s.name].calls > 0 for s in away)
    stock = Tiny("tiny-flux").forward()
    assert compare(unfused, stock).cosine > 0.9999
    fused.model.fuse_qkv_projections()  # detach gave back the weights they were fused from
    assert all(torch.equal(v, state[k]) for k, v in fused.model.state_dict().items())
