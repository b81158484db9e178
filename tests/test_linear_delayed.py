"""fp8_delayed_linear: the activation's scale from the largest input its site has seen. Eager calls take their own
absmax first and are never clamped; compiled calls use the history, count a call whose input went past it, and feed
the history for the next call; a compiled call at a site no eager call started goes to the host."""

import pytest
import torch

import ditgate
from ditgate.forms.linear import create_linear_forms
from ditgate.forms.linear_delayed import MARGIN, delayed_clamped_calls
from ditgate.gate import compare
from ditgate.gate.linear import LinearSetting

from .helpers import LENIENT_SPEED, Tiny

NAME = "fp8_delayed_linear"


def _form():
    form = create_linear_forms([NAME])[NAME]
    if not form.availability().available:
        pytest.skip(form.availability().reason)
    return form


def _reference(x, w):
    return x.double() @ w.double().T


def test_eager_calls_take_their_own_absmax_first_and_are_never_clamped():
    form = _form()
    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(48, 64, generator=gen), torch.randn(20, 64, generator=gen)
    weights = form.quantize(w)
    assert weights.state.tolist() == [0.0, 0.0, 0.0] and weights.nbytes == 48 * 64 + 4 + 12
    for factor in (1.0, 0.1, 10.0):  # a smaller input keeps the larger scale; a larger one raises it first
        out = form.run(x * factor, weights, None)
        ref = _reference(x * factor, w)
        assert compare(out, ref).rel_l2 < 0.06
    assert weights.state[0].item() == pytest.approx(10 * x.abs().max().item())
    assert delayed_clamped_calls(weights) == 0
    values, scale = form.quantize_input(x * 10, weights)
    assert values.float().abs().max().item() == pytest.approx(448 / MARGIN, rel=0.07)  # the headroom is kept


def test_an_input_that_holds_an_inf_or_a_nan_does_not_spoil_the_history():
    form = _form()
    gen = torch.Generator().manual_seed(3)
    w, x = torch.randn(16, 32, generator=gen), torch.randn(8, 32, generator=gen)
    weights = form.quantize(w)
    form.run(x, weights, None)
    seen = weights.state[0].item()
    for bad in (float("inf"), float("nan")):
        spoiled = x.clone()
        spoiled[0, 0] = bad
        form.run(spoiled, weights, None)
        assert weights.state[0].item() == seen
    assert delayed_clamped_calls(weights) == 2  # both counted
    assert compare(form.run(x, weights, None), _reference(x, w)).rel_l2 < 0.06


def test_a_state_made_under_inference_mode_serves_calls_outside_it():
    form = _form()
    w, x = torch.randn(16, 32), torch.randn(8, 32)
    with torch.inference_mode():
        weights = form.quantize(w)
        form.run(x, weights, None)
    form.run(x * 3, weights, None)  # in place on the state outside inference mode
    assert weights.state[0].item() == pytest.approx(3 * x.abs().max().item())


@pytest.mark.slow
def test_a_compiled_call_uses_the_history_counts_a_clamped_call_and_the_next_call_covers_it():
    torch._dynamo.reset()
    form = _form()
    gen = torch.Generator().manual_seed(1)
    w, x = torch.randn(32, 64, generator=gen), torch.randn(16, 64, generator=gen)
    weights = form.quantize(w)
    eager = form.run(x, weights, None)
    compiled = torch.compile(lambda t: form.run(t, weights, None), fullgraph=True)
    assert torch.allclose(compiled(x), eager, rtol=0, atol=1e-5)  # at the history's scale: what eager made
    assert delayed_clamped_calls(weights) == 0
    big = x * (4 * MARGIN)
    clamped = compiled(big)  # past twice the largest input seen: clamped at e4m3's largest value, and counted
    assert delayed_clamped_calls(weights) == 1
    assert weights.state[0].item() == pytest.approx(big.abs().max().item())
    assert compare(clamped, _reference(big, w)).rel_l2 > 0.1
    again = compiled(big)  # the history now covers it
    assert delayed_clamped_calls(weights) == 1
    assert compare(again, _reference(big, w)).rel_l2 < 0.06
    torch._dynamo.reset()


@pytest.mark.slow
def test_a_compiled_call_at_a_site_no_eager_call_started_goes_to_the_host_and_then_the_form_serves(caplog):
    torch._dynamo.reset()
    tiny = Tiny("tiny-wan")
    ffn = tiny.model.blocks[0].ffn
    x = torch.randn(1, 64, 32)
    with torch.no_grad(), caplog.at_level("WARNING", logger="ditgate"):
        host = ffn(x)
        plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False, progress=False,
                              linear=LinearSetting(forms=(NAME,), roles=("feed-forward",), keep_host="device"))
        sites = sum(s.weights == NAME for s in plan.report().linear.sites)
        assert sites >= 2 and f"{NAME} serves {sites} linear site(s) whose input scale starts at their first eager " \
                              "call" in caplog.text
        graphed = torch.compile(ffn, fullgraph=True)
        first = graphed(x)
        assert torch.allclose(first, host, rtol=0, atol=1e-5)  # no history at either site yet: the host served both
        eager = ffn(x)  # eager calls start each site's history
        assert compare(eager, host).rel_l2 > 1e-4
        compiled = graphed(x)  # traced again: dynamo guards on the eager call
    assert torch.allclose(compiled, eager, rtol=0, atol=1e-5)
    record = plan.report().linear
    assert {s.weights for s in record.sites if s.role == "feed-forward"} == {NAME}
    assert all(s.clamped_calls == 0 for s in record.sites)
    plan.detach()
    torch._dynamo.reset()
    assert torch.equal(ffn(x), host)
    assert not any("ditgate" in name for name, _ in ffn.named_buffers())


def test_a_site_whose_eager_inputs_were_all_zero_keeps_the_host_in_a_compiled_graph(caplog):
    torch._dynamo.reset()
    tiny = Tiny("tiny-wan")
    ffn = tiny.model.blocks[0].ffn
    x = torch.randn(1, 64, 32)
    graphs = []

    def keep_graph(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with torch.no_grad(), caplog.at_level("WARNING", logger="ditgate"):
        host = ffn(x)
        plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False, progress=False,
                              linear=LinearSetting(forms=(NAME,), roles=("feed-forward",), keep_host="device"))
        ffn(torch.zeros_like(x))  # starts both histories: the first site's at zero, the second's at its bias's GELU
        histories = plan.linear.histories()
        assert sorted(histories.values())[0] == 0 and sorted(histories.values())[1] > 0
        second = next(r for r in plan.linear.routers if histories.get(r.name, 0) > 0)
        second.module(10 * torch.randn(64, second.module.in_features))  # its history past any input below
        compiled = torch.compile(ffn, fullgraph=True, backend=keep_graph)(x)
    # a compiled cast at a zero history's scale would clamp every element of the first site's input (and count it)
    assert all(s.clamped_calls == 0 for s in plan.report().linear.sites)
    assert compare(compiled, host).cosine > 0.999
    (graph,) = graphs
    assert graph.code.count("_scaled_mm") == 1  # the second site's product: the form serves it
    assert "every input this site had was zero" in caplog.text
    plan.detach()
    torch._dynamo.reset()


def test_the_eager_kernels_give_the_torch_ops_bits_and_state():
    pytest.importorskip("triton")
    from ditgate.kernels.rowwise_quant import quantize_delayed

    form = _form()
    device = "cuda" if torch.cuda.is_available() else "cpu"  # interpreted on a CPU; the torch ops on a CPU either way
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(16, 300, generator=gen)
    torch_ops = form.quantize(w)
    state = torch.zeros(3, device=device)
    state[0] = torch_ops.state[0] = 3.0  # a history above this input's absmax: the scale stays the history's
    for factor in (1.0, 0.01, 40.0):  # kept, kept, raised
        wide = torch.randn(7, 600, generator=gen).bfloat16() * factor
        x = wide[:, ::2]  # a strided view, K = 300
        got, got_scale = quantize_delayed(wide.to(device)[:, ::2], state, MARGIN)
        want, want_scale = form.quantize_input(x, torch_ops)
        assert torch.equal(got_scale.cpu().reshape(1, 1), want_scale)
        assert torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8))
        assert torch.equal(state.cpu(), torch_ops.state)
    for bad in (float("inf"), float("nan")):  # out of the history; counted once per call, whatever its rows
        x = torch.randn(40, 300, generator=gen).bfloat16()
        x[0, 1] = x[33, 7] = bad
        quantize_delayed(x.to(device), state, MARGIN)
        form.quantize_input(x, torch_ops)
        assert torch.equal(state.cpu(), torch_ops.state) and state[2].item() == 0
    assert state[1].item() == 2
    fresh, fresh_ops = torch.zeros(3, device=device), form.quantize(w)  # no history: the finite elements set it
    x = torch.randn(9, 300, generator=gen).bfloat16() * 10
    x[4, 4] = float("inf")
    got, got_scale = quantize_delayed(x.to(device), fresh, MARGIN)
    want, want_scale = form.quantize_input(x, fresh_ops)
    finite = x.float().abs().masked_fill(x.isinf(), 0).max().item()
    assert fresh[0].item() == fresh_ops.state[0].item() == finite and fresh[1].item() == 1
    assert torch.equal(got_scale.cpu().reshape(1, 1), want_scale)
    assert torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8))
    with pytest.raises(ValueError, match="3 contiguous float32 elements"):
        quantize_delayed(x.to(device), torch.zeros(2, device=device), MARGIN)


@pytest.mark.slow
def test_a_receipt_carries_each_sites_history_so_its_compiled_calls_serve_without_an_eager_forward(tmp_path, caplog):
    torch._dynamo.reset()
    lenient = LENIENT_SPEED  # CPU timings decide nothing here
    tiny = Tiny("tiny-wan")
    ffn = tiny.model.blocks[0].ffn
    seen = []
    hook = ffn.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    setting = LinearSetting(forms=(NAME,), roles=("feed-forward",), keep_host="device")
    plan = ditgate.attach(tiny.model, profile=lenient, forms=["sdpa_math"], timing_cache=False, progress=False,
                          linear=setting)
    tiny.forward()  # calibrates
    tiny.forward()  # routed, eagerly: each site's history
    hook.remove()
    x = seen[-1]
    histories = plan.linear.histories()
    assert histories and all(v > 0 for v in histories.values())
    path = plan.save(tmp_path / "receipt.json")
    with torch.no_grad():
        eager = ffn(x)
    plan.detach()
    with torch.no_grad():
        host = ffn(x)
    with caplog.at_level("WARNING", logger="ditgate"):
        again = ditgate.attach(tiny.model, receipt=path, linear=setting, timing_cache=False, progress=False)
    assert "starts at their first eager call" not in caplog.text
    assert again.linear.histories() == histories
    with torch.no_grad():
        compiled = torch.compile(ffn, fullgraph=True)(x)  # before any eager call of this plan: the forms serve
    assert compare(compiled, host).rel_l2 > 1e-4 and compare(compiled, eager).rel_l2 < 0.02
    assert delayed_clamped_calls(*(r.custody.payload() for r in again.linear.routers)) == 0
    again.detach()
    torch._dynamo.reset()
