"""Routed linear sites under torch.compile: the decisions are guarded Python, the served path torch ops alone."""

import pytest
import torch

import ditgate
from ditgate.gate import compare

from .helpers import Tiny


def _routed_feed_forward(form: str):
    """Tiny Wan's first feed-forward with a static plan serving its linears with ``form``: (ffn, an input, the host's
    output before attach, the plan)."""
    torch._dynamo.reset()
    tiny = Tiny("tiny-wan")
    ffn = tiny.model.blocks[0].ffn
    x = torch.randn(1, 64, 32)
    with torch.no_grad():
        host = ffn(x)
        plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False, linear=[form])
    return ffn, x, host, plan


@pytest.mark.slow
@pytest.mark.parametrize("form", ["int8_linear", "fp8_linear", "fp8_tensor_linear"])
def test_a_routed_feed_forward_compiles_in_one_graph_and_computes_what_eager_does(form):
    ffn, x, host, plan = _routed_feed_forward(form)
    with torch.no_grad():
        eager = ffn(x)
        compiled = torch.compile(ffn, fullgraph=True)(x)
    assert torch.allclose(compiled, eager, rtol=0, atol=1e-5)
    assert compare(compiled, host).rel_l2 > 1e-4  # the quantized form ran inside the graph, not the host
    plan.detach()
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("form", ["fp8_linear", "int8_linear"])
def test_a_routed_model_compiles_and_replays_as_a_cuda_graph(form):
    from ditgate.models.presets import get_preset

    torch._dynamo.reset()
    preset = get_preset("tiny-wan")
    model = preset.build("cuda", torch.bfloat16)
    inputs = preset.inputs(model, "cuda", torch.bfloat16)
    with torch.no_grad():
        plan = ditgate.attach(model, forms=["sdpa_cudnn", "sdpa_flash", "sdpa_math"], measure=False,
                              linear=ditgate.LinearSetting(forms=(form,), roles=("feed-forward",)))
        if not any(s.weights == form for s in plan.report().linear.sites):
            plan.detach()
            pytest.skip(f"{form} serves no site on this GPU")
        eager = model(**inputs)[0]
        graphed = torch.compile(model, mode="reduce-overhead")
        for _ in range(3):  # record, then replay
            out = graphed(**inputs)[0]
    assert compare(out.float(), eager.float()).cosine > 0.9999
    plan.detach()
    torch._dynamo.reset()


def _graph_facts(model, inputs):
    """The guards and the FX graphs of one compile of ``model`` (a backend that keeps the graphs dynamo hands it)."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    guards = len(torch._dynamo.explain(model)(**inputs).out_guards)
    torch._dynamo.reset()
    torch.compile(model, backend=keep)(**inputs)
    torch._dynamo.reset()
    return guards, graphs


def _fp8_linear_or_skip():
    from ditgate.forms.linear import create_linear_forms

    avail = create_linear_forms(["fp8_linear"])["fp8_linear"].availability()
    if not avail.available:
        pytest.skip(avail.reason)


def test_a_form_disabled_by_eager_failures_leaves_compiled_graphs_to_the_host(monkeypatch, caplog):
    """The route is a constant of the graph: disabling a form must change the plan's generation, which the graph
    guards on, or the graph would keep calling the form."""
    ffn, x, host, plan = _routed_feed_forward("int8_linear")
    with torch.no_grad():
        routed = ffn(x)
        compiled = torch.compile(ffn, backend="eager", fullgraph=True)
        assert torch.allclose(compiled(x), routed, atol=1e-5) and compare(routed, host).rel_l2 > 1e-4
        form = plan.linear.context.forms["int8_linear"]

        def raises(*args, **kwargs):
            raise RuntimeError("fails on purpose")

        monkeypatch.setattr(form, "run", raises)
        with caplog.at_level("WARNING", logger="ditgate"):
            for _ in range(3):  # eager calls fail past the limit: the form is disabled at both sites
                assert torch.equal(ffn(x), host)
        assert "the host serves this site from now on" in caplog.text
        assert torch.equal(compiled(x), host)  # traced again: the graph calls the host now
    plan.detach()
    torch._dynamo.reset()


def test_a_compiled_linear_site_costs_a_few_guards_and_runs_its_route():
    """The route is decided at trace time as a constant (``LinearRouter.traced_route``) and a settled site runs its
    form's ``graph_serve`` through one constant mapping: the graph guards on the plan's generation and the call's
    facts, not on the chooser's and each site's path to its form. Traced through, the decision and the form's methods
    cost about 70 guards per site (about 24 now), checked on every call of the compiled model."""
    from collections import Counter

    from ditgate.models.presets import get_preset

    _fp8_linear_or_skip()
    preset = get_preset("tiny-flux")
    model = preset.build("cpu", torch.bfloat16)
    inputs = preset.inputs(model, "cpu", torch.bfloat16)
    with torch.no_grad():
        stock_guards, _ = _graph_facts(model, inputs)
        plan = ditgate.attach(model, forms=["sdpa_math"], measure=False,
                              linear=ditgate.LinearSetting(forms=("fp8_linear",)))
        model(**inputs)  # eager: the routes resolve
        served = Counter(s.serving for s in plan.report().linear.sites)
        guards, graphs = _graph_facts(model, inputs)
        plan.detach()
    routed = served["fp8_linear"]
    assert routed >= 10 and len(graphs) == 1
    products = sum(1 for n in graphs[0].graph.nodes if n.target is torch.ops.aten._scaled_mm.default
                   or getattr(n.target, "__name__", "") == "_scaled_mm")
    assert products == routed  # every routed site's 8-bit product is in the graph, and nothing else's
    assert (guards - stock_guards) / routed < 30, (guards, stock_guards, routed)
