"""Routed linear sites under torch.compile: the decisions are guarded Python, the served path torch ops alone."""

import pytest
import torch

import ditgate
from ditgate.gate import compare

from .helpers import Tiny


def _routed_feed_forward(form: str):
    """Tiny Wan's first feed-forward with a static plan serving its linears with ``form``: (the model, ffn, an input,
    the host's output before attach, the plan)."""
    torch._dynamo.reset()
    tiny = Tiny("tiny-wan")
    ffn = tiny.model.blocks[0].ffn
    x = torch.randn(1, 64, 32)
    with torch.no_grad():
        host = ffn(x)
        plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False, linear=[form])
    return tiny.model, ffn, x, host, plan


@pytest.mark.slow
@pytest.mark.parametrize("form", ["int8_linear", "fp8_linear", "fp8_tensor_linear"])
def test_a_routed_feed_forward_compiles_in_one_graph_and_computes_what_eager_does(form):
    _, ffn, x, host, plan = _routed_feed_forward(form)
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
    _, ffn, x, host, plan = _routed_feed_forward("int8_linear")
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
    cost about 70 guards per site (about 25 now), checked on every call of the compiled model."""
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


def test_a_graph_two_modules_share_is_not_reused_for_a_site_it_was_not_traced_for():
    """Two feed-forwards compiled apart run the same code: a graph traced at one must not serve the other with the
    first's route (the route is a constant of the graph, so the graph guards on the site's name)."""
    torch._dynamo.reset()
    tiny = Tiny("tiny-wan")
    f0, f1 = tiny.model.blocks[0].ffn, tiny.model.blocks[1].ffn
    x = torch.randn(1, 64, 32)
    with torch.no_grad():
        host1 = f1(x)
        plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False, linear=["int8_linear"])
        routed0, routed1 = f0(x), f1(x)
        c0 = torch.compile(f0, backend="eager", fullgraph=True)
        c1 = torch.compile(f1, backend="eager", fullgraph=True)
        assert torch.allclose(c0(x), routed0, atol=1e-5) and torch.allclose(c1(x), routed1, atol=1e-5)
        form = plan.linear.context.forms["int8_linear"]
        block1 = {r.custody.payload().data.data_ptr() for r in plan.linear.routers if r.name.startswith("blocks.1.")}
        run = form.run

        def fails_at_block_1(x, weights, bias):
            if weights.data.data_ptr() in block1:
                raise RuntimeError("fails at block 1 on purpose")
            return run(x, weights, bias)

        form.run = fails_at_block_1
        for _ in range(3):  # eager calls: block 1's sites lose the form, block 0's keep it
            assert torch.equal(f1(x), host1)
        assert torch.allclose(c0(x), routed0, atol=1e-5)
        assert torch.equal(c1(x), host1)
    plan.detach()
    torch._dynamo.reset()


def test_a_graph_traced_under_one_plan_is_not_reused_under_the_next():
    """Plans count their generations from zero: a graph traced under a detached plan must not serve a new plan's
    calls at a generation the two happen to share. Here the new plan's history is still zero, so its graph must keep
    the host where the old plan's graph cast at the old history."""
    tiny_model, ffn, x, host, first = _routed_feed_forward("fp8_delayed_linear")
    with torch.no_grad():
        ffn(x)  # eager: the histories start
        compiled = torch.compile(ffn, backend="eager", fullgraph=True)
        assert compare(compiled(x), host).rel_l2 > 1e-4  # the form served in the graph
        first.detach()
        second = ditgate.attach(tiny_model, forms=["sdpa_math"], measure=False, linear=["fp8_delayed_linear"])
        ffn(torch.zeros_like(x))  # an eager call, all zeros: the first projection's history stays zero
        compiled(x)
        first_projection = next(r for r in second.linear.routers if r.name == "blocks.0.ffn.net.0.proj")
        traced = list(first_projection.ledger.traces)  # traced again under this plan, and it kept the host there
        assert traced and all(route == "host" and "every input this site had was zero" in why
                              for route, why in traced), traced
        second.detach()
    torch._dynamo.reset()


def test_a_compiled_models_report_says_what_its_graphs_serve_not_the_host():
    """A compiled model's calls run none of ditgate's Python, so the only calls its sites count are the calibration's;
    the report's ``serving`` then says what the graphs traced (before, every site of a gated plan for a compiled model
    read "host", its quantized weights and verdict beside it)."""
    from .helpers import LENIENT_SPEED

    _fp8_linear_or_skip()
    tiny = Tiny("tiny-flux")
    with torch.no_grad():
        plan = ditgate.attach(tiny.model, profile=LENIENT_SPEED, forms=["sdpa_math"], timing_cache=False,
                              progress=False, linear=ditgate.LinearSetting(forms=("fp8_linear",), compiled=True))
        tiny.forward()  # calibrates: every counted call is a calibration call
        calibrated = plan.report()
        torch._dynamo.reset()
        torch.compile(tiny.model)(**tiny.inputs)
        report = plan.report()
        plan.detach()
    torch._dynamo.reset()
    routed = [s for s in report.linear.sites if s.weights == "fp8_linear"]
    assert routed and all(s.serving == "host" for s in calibrated.linear.sites if s.weights == "fp8_linear")
    assert {s.serving for s in routed} == {"fp8_linear"}
    assert {s.serving for s in report.linear.sites if s.weights == "host"} <= {"host", "-"}
    attention = [s for s in report.sites if s.compiled]
    assert attention and all(s.serving == s.compiled[0].route for s in attention)
    assert {s.serving for s in calibrated.sites} == {"host"}  # eagerly, calibration alone


def test_serving_counts_only_the_traces_of_the_current_routes():
    """A site traced on the host by graphs made before calibration (or before a verdict was reverted) serves what the
    graphs traced since its routes last changed, however many older traces there were."""
    from ditgate.api.linear import serving_route
    from ditgate.router.ledger import SiteLedger

    ledger = SiteLedger()
    for _ in range(3):  # three graphs compiled before calibration, each holding the host here
        ledger.traced("host", "shape not measured yet", generation=1)
    ledger.traced("fp8_linear", "", generation=2)  # one graph since the verdict
    assert serving_route((), ledger.trace_counts()) == "host"  # every trace since attach
    assert serving_route((), ledger.current_trace_counts()) == "fp8_linear"
    assert sum(c.calls for c in ledger.trace_counts()) == 4  # the history stays in ``trace_counts``
