"""ditgate under torch.compile: both orders, no graph breaks, static routes guarded on the plan, exact detach.

Most tests compile with ``backend="aot_eager"`` or a counting backend (graphs are what they check; inductor on
a CPU costs tens of seconds per model); one compiles with inductor.
"""

import dataclasses
import functools

import pytest
import torch

import ditgate
from ditgate.forms import MaskKind
from ditgate.gate import PROFILES
from ditgate.hosts import find_attention_modules, model_output
from ditgate.router.site import NOT_MEASURED_IN_GRAPH, PADDING_NOT_IN_GRAPH
from ditgate.router.traced import RAISED_IN_TRACE

from .helpers import FakeForm, ListsForm, Tiny, sdpa, twice

FAMILIES = ("tiny-wan", "tiny-ltx", "tiny-flux", "tiny-hunyuan-video", "tiny-cogvideox")
# speed never decides here: the forms are the host's own SDPA (see tests/test_gate.py)
LENIENT = dataclasses.replace(PROFILES["quality"], name="lenient", min_speedup=1e-3, min_whole_ratio=1e-3, rounds=3)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=8, accumulated_recompile_limit=256):  # torch's defaults
        yield  # (attach raises them for models of many blocks: hosts.regional)
    torch._dynamo.reset()


class Copy(FakeForm):
    """Exact SDPA; in a graph the same SDPA with none of FakeForm's per-call bookkeeping."""

    def in_graph(self, inputs):
        return sdpa(inputs)


class Doubled(Copy):
    """Twice the attention: a route whose output shows whether a graph still calls it."""

    def run(self, inputs):
        return 2 * sdpa(inputs)

    def in_graph(self, inputs):
        return 2 * sdpa(inputs)


class Graphs:
    """A torch.compile backend that counts the graphs it is handed and runs them as traced."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, gm, example_inputs):
        self.count += 1
        return gm.forward


def _copy_plan(target, **kwargs):
    return ditgate.attach(target, profile=LENIENT, forms=["copy"], extra_forms=[Copy("copy")], **kwargs)


def _run(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model_output(model(**inputs)).clone()


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> bool:
    return bool((a - b).norm() <= tol * b.norm())


def _breaks(model, inputs) -> int:
    with torch.no_grad():
        return torch._dynamo.explain(model)(**inputs).graph_break_count


def _compiled_routes(plan) -> dict[str, set[tuple[str, str]]]:
    return {s.name: {(c.route, c.reason) for c in s.compiled} for s in plan.report().sites}


def _assert_as_before(tiny: Tiny, stock: torch.Tensor, processors: list) -> None:
    assert torch.equal(tiny.forward(), stock)
    assert all(m.module.processor is p for m, p in zip(find_attention_modules(tiny.model), processors))
    assert "forward" not in tiny.model.__dict__
    assert not tiny.model._forward_pre_hooks and not tiny.model._forward_hooks


@pytest.mark.parametrize("name", FAMILIES)
def test_an_attached_model_compiles_with_no_more_graph_breaks_than_stock(name):
    tiny = Tiny(name)
    stock = _breaks(tiny.model, tiny.inputs)
    plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False)
    tiny.forward()
    torch._dynamo.reset()
    assert _breaks(tiny.model, tiny.inputs) == stock == 0
    assert all(s.compiled for s in plan.report().sites)  # every site's route was traced into the graph
    plan.detach()


@pytest.mark.parametrize("name", FAMILIES)
def test_attach_then_compile_serves_the_measured_routes(name):
    tiny = Tiny(name)
    stock = tiny.forward()
    processors = [m.module.processor for m in find_attention_modules(tiny.model)]
    plan = _copy_plan(tiny.model)
    tiny.forward()  # calibrates, eagerly
    routed = tiny.forward()
    eager_routes = {s.name: s.serving for s in plan.report().sites}
    compiled = torch.compile(tiny.model, backend="aot_eager")
    assert _close(_run(compiled, tiny.inputs), routed)
    padded = name == "tiny-hunyuan-video"  # its masked calls keep the mask in a graph (the test below)
    for site, routes in _compiled_routes(plan).items():
        if eager_routes[site] == "copy" and not padded:
            assert routes == {("copy", "")}, (site, routes)
    plan.detach()
    _assert_as_before(tiny, stock, processors)
    assert _close(_run(compiled, tiny.inputs), stock)  # the wrapper recompiled with the host's processors


def test_a_padding_mask_stays_a_mask_inside_a_graph_and_says_why():
    tiny = Tiny("tiny-hunyuan-video")
    plan = _copy_plan(tiny.model)
    tiny.forward()
    routed = tiny.forward()
    joint = "single_transformer_blocks.0.attn"
    assert {s.name: s.serving for s in plan.report().sites}[joint] == "copy"  # eagerly: the keys cut, copy serves
    compiled = torch.compile(tiny.model, backend="aot_eager")
    assert _close(_run(compiled, tiny.inputs), routed)
    ((route, reason),) = _compiled_routes(plan)[joint]
    assert route == "host" and "mask kind boolean" in reason and PADDING_NOT_IN_GRAPH in reason
    plan.detach()


@pytest.mark.parametrize("name", FAMILIES)
def test_compile_then_attach_recompiles_with_the_routes(name):
    tiny = Tiny(name)
    stock = tiny.forward()
    graphs = Graphs()
    compiled = torch.compile(tiny.model, backend=graphs)
    assert _close(_run(compiled, tiny.inputs), stock)
    plan = ditgate.attach(compiled, forms=["sdpa_math"], measure=False)
    assert all(not s.name.startswith("_orig_mod") for s in plan.report().sites)
    before = graphs.count
    assert _close(_run(compiled, tiny.inputs), stock)
    assert graphs.count == before + 1  # one recompile, with the routes
    assert all(("sdpa_math", "") in routes for routes in _compiled_routes(plan).values())
    _run(compiled, tiny.inputs)
    assert graphs.count == before + 1  # and no more
    plan.detach()
    assert torch.equal(tiny.forward(), stock)
    assert _close(_run(compiled, tiny.inputs), stock)


def test_a_measured_plan_calibrates_eagerly_under_a_compiled_wrapper():
    tiny = Tiny("tiny-wan")
    stock = tiny.forward()
    graphs = Graphs()
    compiled = torch.compile(tiny.model, backend=graphs)
    _run(compiled, tiny.inputs)
    plan = _copy_plan(compiled)
    first = _run(compiled, tiny.inputs)  # calibrating: the host serves, eagerly, and each site is measured
    assert torch.equal(first, stock)
    assert all(v.form == "copy" for v in plan.chooser.verdicts.values()) and len(plan.chooser.verdicts) == 4
    assert all(dict(((c.route, c.reason), c.calls) for c in s.routes) == {("host", "calibrating"): 1}
               for s in plan.report().sites)
    # the wrapper was set aside while calibrating (the model called eagerly from the start): the whole-model check
    # ran after that forward, and the wrapper's compiled call is back
    assert len(plan.report().whole_model) == 1 and "forward" not in tiny.model.__dict__
    assert compiled.__dict__["forward"] is not tiny.model.__call__
    before = graphs.count
    assert _close(_run(compiled, tiny.inputs), stock)
    assert graphs.count == before + 1  # one recompile, with the routes
    assert _close(_run(compiled, tiny.inputs), stock)
    assert all(routes == {("copy", "")} for routes in _compiled_routes(plan).values())
    plan.detach()


@pytest.mark.parametrize("how", ["torch.compile", "model.compile"])
def test_a_model_compiled_with_fullgraph_calibrates_and_then_serves_its_routes(how):
    """Under fullgraph=True a compiled call whose frame is the measuring forward (disabled for dynamo) compiles
    nothing, which torch refuses ("found no compiled frames"): the second forward of a measured plan raised. The
    compiled call is set aside while the plan measures."""
    tiny = Tiny("tiny-wan")
    stock = tiny.forward()
    graphs = Graphs()
    if how == "torch.compile":
        compiled = torch.compile(tiny.model, backend=graphs, fullgraph=True)
    else:
        tiny.model.compile(backend=graphs, fullgraph=True)
        compiled = tiny.model
    _run(compiled, tiny.inputs)
    plan = _copy_plan(compiled)
    outs = [_run(compiled, tiny.inputs) for _ in range(3)]
    assert all(_close(out, stock) for out in outs)
    assert len(plan.report().whole_model) == 1
    assert all(routes == {("copy", "")} for routes in _compiled_routes(plan).values())
    plan.detach()
    assert _close(_run(compiled, tiny.inputs), stock)


@pytest.mark.parametrize("fullgraph", [False, True])
def test_calibrating_a_compiled_wrapper_with_a_function_gives_its_compiled_forward_back(fullgraph):
    """``plan.calibrate(fn)`` on a plan that also calibrates live stacks two eager forwards: the first, removed inside
    ``fn`` by its check, gave the wrapper its compiled forward back while the second was on, and the second then
    put back the first one's stand-in: the wrapper ran eagerly for good (no graph for a new shape)."""
    from .helpers import twice

    tiny = Tiny("tiny-wan")
    graphs = Graphs()
    wrapper = torch.compile(tiny.model, backend=graphs, fullgraph=fullgraph, dynamic=False)
    compiled_forward = wrapper.__dict__["forward"]
    plan = ditgate.attach(wrapper, forms=["sdpa_math"], timing_cache=False, progress=False)
    plan.calibrate(lambda: [_run(wrapper, tiny.inputs) for _ in range(2)])
    plan.detach()
    before = graphs.count
    _run(wrapper, twice(tiny.inputs))  # a new shape: the wrapper compiles it
    assert wrapper.__dict__["forward"] is compiled_forward and graphs.count == before + 1
    assert "_ditgate_set_aside" not in tiny.model.__dict__


def test_one_model_in_two_compiled_wrappers_of_a_pipeline_calibrates_through_either():
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    tiny = Tiny("tiny-wan")
    stock = tiny.forward()
    first, second = (torch.compile(tiny.model, backend=Graphs(), fullgraph=True) for _ in range(2))
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=FlowMatchEulerDiscreteScheduler(),
                       transformer=first, transformer_2=second)
    plan = _copy_plan(pipe)
    outs = [_run(second, tiny.inputs) for _ in range(3)]  # the second name's wrapper calibrates (fullgraph)
    assert all(_close(out, stock) for out in outs) and len(plan.report().whole_model) == 1
    plan.detach()


def test_calibrating_with_a_function_on_a_plan_that_calibrates_live_checks_the_model_once():
    tiny = Tiny("tiny-wan")
    plan = _copy_plan(tiny.model)
    plan.calibrate(lambda: [tiny.forward() for _ in range(2)])  # the first forward calibrates live and checks
    checks = plan.report().whole_model
    plan.detach()
    assert len(checks) == 1


def test_an_eager_forward_a_later_hook_kept_is_a_pass_through_a_fullgraph_compile_traces():
    """A forward replaced after attach (a diffusers hook on the model itself: a cache enabled after attach) keeps the
    plan's eager forward beneath it, and puts it back when it goes, after detach: it was disabled for dynamo, so the
    model no longer compiled under fullgraph=True ("found no compiled frames")."""
    tiny = Tiny("tiny-wan")
    stock = tiny.forward()
    plan = _copy_plan(tiny.model)
    kept = tiny.model.forward  # the plan's eager forward, as a hook registered now would keep it
    tiny.model.forward = functools.partial(lambda inner, *a, **k: inner(*a, **k), kept)
    tiny.forward()  # calibrates through the wrapper
    plan.detach()
    tiny.model.forward = kept  # the hook goes and puts back what it kept
    graphs = Graphs()
    tiny.model.compile(backend=graphs, fullgraph=True)
    assert _close(_run(tiny.model, tiny.inputs), stock) and graphs.count == 1


def test_a_pipeline_holding_a_compiled_transformer_is_attached_under_it():
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    tiny = Tiny("tiny-wan")
    stock = tiny.forward()
    compiled = torch.compile(tiny.model, backend="aot_eager")
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=FlowMatchEulerDiscreteScheduler(),
                       transformer=compiled)
    plan = ditgate.attach(pipe, forms=["sdpa_math"], measure=False)
    assert [s.name for s in plan.report().sites][0] == "transformer.blocks.0.attn1"
    assert _close(_run(pipe.transformer, tiny.inputs), stock)
    assert all(("sdpa_math", "") in routes for routes in _compiled_routes(plan).values())
    plan.detach()


@pytest.mark.parametrize("order", ["attach first", "compile first"])
@pytest.mark.parametrize("how", ["model.compile", "compile_repeated_blocks"])
def test_in_place_and_regional_compilation_in_either_order(how, order):
    tiny = Tiny("tiny-wan")
    stock = tiny.forward()
    graphs = Graphs()

    def compile_in_place():
        if how == "model.compile":
            tiny.model.compile(backend=graphs)
        else:
            tiny.model.compile_repeated_blocks(backend=graphs)

    if order == "compile first":
        compile_in_place()
        assert _close(tiny.forward(), stock)
    plan = _copy_plan(tiny.model)
    tiny.forward()  # calibrates, eagerly, whatever is compiled
    assert all(v.form == "copy" for v in plan.chooser.verdicts.values())
    if order == "attach first":
        compile_in_place()
    outs = [tiny.forward() for _ in range(2)]
    assert all(_close(out, stock) for out in outs)
    assert all(routes == {("copy", "")} for routes in _compiled_routes(plan).values())
    plan.detach()
    assert _close(tiny.forward(), stock)
    assert all(not type(m.module.processor).__dict__.get("_ditgate_routed") for m in find_attention_modules(tiny.model))


def test_regional_compilation_with_more_blocks_than_dynamos_limit_compiles_every_block_under_fullgraph():
    """compile_repeated_blocks(fullgraph=True), as diffusers' docs advise, of a 12-block attached Wan: each routed
    block compiles a graph of its own (its sites' routers are guarded), which dynamo's default limit of 8 per code
    object would turn into FailOnRecompileLimitHit at the ninth; attach makes room, and detach leaves it, as the
    detached blocks recompile on top of the graphs compiled while attached."""
    preset = dataclasses.replace(Tiny("tiny-wan").preset, config=dict(Tiny("tiny-wan").preset.config, num_layers=12))
    tiny = Tiny(preset)
    stock = tiny.forward()
    plan = _copy_plan(tiny.model)
    tiny.forward()  # calibrates
    assert torch._dynamo.config.recompile_limit >= 2 * 12
    graphs = Graphs()
    tiny.model.compile_repeated_blocks(backend=graphs, fullgraph=True)
    outs = [tiny.forward() for _ in range(2)]
    assert all(_close(out, stock) for out in outs)
    assert graphs.count == 12  # one per block, none run eagerly past a limit, none twice
    assert all(routes == {("copy", "")} for routes in _compiled_routes(plan).values())
    plan.detach()
    assert _close(tiny.forward(), stock)
    assert graphs.count == 13  # the detached blocks share one graph again, recompiled within the room


def test_regional_compilation_survives_attach_detach_cycles_under_fullgraph():
    """Each plan's graphs stay in dynamo's cache after its detach: a limit sized for one plan failed the third plan's
    compile of a 12-block model with FailOnRecompileLimitHit; each attach now makes room for its own graphs."""
    preset = dataclasses.replace(Tiny("tiny-wan").preset, config=dict(Tiny("tiny-wan").preset.config, num_layers=12))
    tiny = Tiny(preset)
    stock = tiny.forward()
    tiny.model.compile_repeated_blocks(backend=Graphs(), fullgraph=True)
    for _ in range(4):
        plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False, progress=False)
        routed = tiny.forward()
        plan.detach()
        assert _close(routed, stock) and _close(tiny.forward(), stock)


def test_detach_and_a_new_plan_never_leave_a_stale_route_in_a_compiled_graph():
    tiny = Tiny("tiny-wan")
    stock = tiny.forward()
    compiled = torch.compile(tiny.model, backend="aot_eager")
    doubled = ditgate.attach(compiled, forms=["doubled"], measure=False, extra_forms=[Doubled("doubled")])
    assert not _close(_run(compiled, tiny.inputs), stock, 0.1)  # the graph calls the doubled route
    doubled.detach()
    assert _close(_run(compiled, tiny.inputs), stock)
    exact = ditgate.attach(compiled, forms=["sdpa_math"], measure=False)
    assert _close(_run(compiled, tiny.inputs), stock)
    assert all(routes == {("sdpa_math", "")} for routes in _compiled_routes(exact).values())
    exact.detach()


def test_a_new_verdict_recompiles_and_a_shape_first_seen_in_a_graph_is_served_by_the_host():
    tiny = Tiny("tiny-wan")
    plan = _copy_plan(tiny.model)
    tiny.forward()  # calibrates at batch 1
    graphs = Graphs()
    compiled = torch.compile(tiny.model, backend=graphs)
    pair = twice(tiny.inputs)
    host_pair = _run(compiled, pair)  # batch 2: first seen inside a graph
    routes = _compiled_routes(plan)["blocks.0.attn1"]
    assert any(r == "host" and NOT_MEASURED_IN_GRAPH in why for r, why in routes), routes
    assert len(plan.chooser.verdicts) == 4  # nothing measured in the trace
    count = graphs.count
    _run(tiny.model, pair)  # an eager call at batch 2 measures it (on_new_shape="measure")
    assert len(plan.chooser.verdicts) == 8
    assert _close(_run(compiled, pair), host_pair)
    assert graphs.count > count  # the new verdicts changed the plan's generation: recompiled
    assert ("copy", "") in _compiled_routes(plan)["blocks.0.attn1"]
    plan.detach()


def test_a_form_that_raises_while_traced_leaves_its_calls_to_the_host():
    tiny = Tiny("tiny-wan")
    stock = tiny.forward()
    plan = ditgate.attach(tiny.model, forms=["boom"], measure=False, extra_forms=[FakeForm("boom", raises=True)])
    compiled = torch.compile(tiny.model, backend="aot_eager")
    assert torch.equal(_run(compiled, tiny.inputs), stock)
    assert all(routes == {("host", f"boom {RAISED_IN_TRACE}")} for routes in _compiled_routes(plan).values())
    text = plan.explain()
    assert "compiled" in text and "trace(s)" in text and "not counted" in text
    plan.detach()


def test_a_form_disabled_by_eager_failures_is_refused_before_tracing():
    tiny = Tiny("tiny-wan")
    stock = tiny.forward()
    plan = ditgate.attach(tiny.model, forms=["boom"], measure=False, extra_forms=[FakeForm("boom", raises=True)])
    for _ in range(3):
        tiny.forward()  # three failures per site disable the form there
    compiled = torch.compile(tiny.model, backend="aot_eager")
    assert torch.equal(_run(compiled, tiny.inputs), stock)
    for routes in _compiled_routes(plan).values():
        ((route, why),) = routes
        assert route == "host" and "disabled after 3 failures" in why
    plan.detach()


def test_the_sparse_schedule_compiles_once_per_budget_and_keeps_its_step_count():
    from ditgate.models.presets import get_preset

    base = get_preset("tiny-wan")
    preset = dataclasses.replace(base, geometry=dict(base.geometry, frames=4, height=16, width=16))  # 256 tokens
    model = preset.build()
    inputs = preset.inputs(model)
    setting = ditgate.SparseSetting(ditgate.BudgetSchedule(budget=0.3, dense_steps=2, dense_layers=0), block=16)
    plan = ditgate.attach(model, forms=["lists"], measure=False, sparse=setting, extra_forms=[ListsForm()])
    steps = (900, 900, 800, 700, 600, 500, 950, 900, 800)  # guidance's second call at 900; 950: a new generation

    def at(target, t):
        return _run(target, {**inputs, "timestep": torch.tensor([t])})

    eager = [at(model, t) for t in steps]
    graphs = Graphs()
    compiled = torch.compile(model, backend=graphs)
    counted = []
    for t, expected in zip(steps, eager):
        assert torch.equal(at(compiled, t), expected)
        counted.append(plan.sparse.counter.step)
    assert counted == [0, 0, 1, 2, 3, 4, 0, 1, 2] and plan.sparse.counter.generation == 3
    assert graphs.count == 2  # dense steps, sparse steps: one graph each
    assert _compiled_routes(plan)["blocks.1.attn1"] == {("host", "sparse: dense at this step (schedule)"),
                                                         ("lists", "")}
    assert _breaks(model, {**inputs, "timestep": torch.tensor([500])}) == 0
    plan.detach()


@pytest.mark.slow
def test_inductor_compiles_a_routed_model_to_the_eager_routed_output():
    tiny = Tiny("tiny-wan")
    plan = _copy_plan(tiny.model)
    tiny.forward()
    routed = tiny.forward()
    compiled = torch.compile(tiny.model)
    assert _close(_run(compiled, tiny.inputs), routed, 1e-4)
    assert all(routes == {("copy", "")} for routes in _compiled_routes(plan).values())
    plan.detach()


def _bf16_call(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, 64, 64, generator=gen).to(torch.bfloat16) for _ in range(3)]


@pytest.mark.parametrize("form_name", ["int8", "fp8_sparse"])
def test_ditgates_kernels_enter_a_graph_as_one_opaque_custom_op(form_name):
    from ditgate.forms import AttentionInputs, create_forms
    from ditgate.kernels.lists import KeyBlockLists

    form = create_forms([form_name])[form_name]
    if not form.availability().available:
        pytest.skip(form.availability().reason)
    q, k, v = _bf16_call()
    lists = None
    if form.spec.takes_selection:
        tiles = torch.tensor([[True, False], [True, True]])
        lists = KeyBlockLists.from_tile_mask(tiles, 1, 2, 32)
    graphs = Graphs()
    compiled = torch.compile(lambda q, k, v: form.in_graph(AttentionInputs(q, k, v, lists, 0.125)) * 1,
                             backend=graphs, fullgraph=True)
    out = compiled(q, k, v)
    assert graphs.count == 1
    assert torch.equal(out, form.run(AttentionInputs(q, k, v, lists, 0.125)))
    args = (q, k, v, form.qk, 0.125, *((lists.kv_index, lists.kv_count, 32, 32) if lists else (None, None, 0, 0)))
    torch.library.opcheck(torch.ops.ditgate.quant_attention, args, test_utils=("test_schema", "test_faketensor"))


def test_a_kernel_that_raises_inside_a_graph_hands_its_call_to_sdpa():
    q, k, v = (t.float() for t in _bf16_call())  # float32: the kernel refuses it
    with pytest.warns(RuntimeWarning, match="raised inside a compiled graph"):
        out = torch.ops.ditgate.quant_attention(q, k, v, "fp8", 0.125, None, None, 0, 0)
    assert _close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.125))
    assert out.transpose(1, 2).is_contiguous()  # the layout its fake declares
