"""GPU-only (skipped without CUDA): routed models under inductor, CUDA graph trees and manual CUDA-graph capture.

A tiny Wan with head dim 64 (256 video tokens) in bf16, so that ditgate's own kernels serve its calls. Every check
compares with the same plan's eager routed output; timings are in ``ditgate bench model --compile``.
"""

import dataclasses

import pytest
import torch

import ditgate
from ditgate.forms import create_forms
from ditgate.gate import compare
from ditgate.hosts import model_output
from ditgate.models.presets import get_preset

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DENSE_FORMS = ("fp8", "int8", "fa4", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "sage", "flex")
SPARSE_FORMS = ("block_sparse", "fp8_sparse", "int8_sparse", "flex_sparse", "fa4_sparse")
# between a form's eager call and its op in a graph only rounding differs (the same kernels); bounded forms'
# quantization can round a few elements the other way
FLOOR = 0.9995


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _wan64(seed: int = 0):
    base = get_preset("tiny-wan")
    preset = dataclasses.replace(base, config=dict(base.config, attention_head_dim=64, ffn_dim=64),
                                 geometry=dict(base.geometry, frames=4, height=16, width=16))
    model = preset.build("cuda", torch.bfloat16)
    return preset, model, preset.inputs(model, "cuda", torch.bfloat16, seed=seed)


def _run(model, inputs, **overrides) -> torch.Tensor:
    with torch.no_grad():
        return model_output(model(**{**inputs, **overrides})).clone()


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return compare(a.float(), b.float()).cosine


def _serving(plan, form: str) -> bool:
    return any(s.serving == form for s in plan.report().sites)


def _sparse_setting(**schedule) -> ditgate.SparseSetting:
    return ditgate.SparseSetting(ditgate.BudgetSchedule(**{"budget": 0.3, "dense_steps": 0, "dense_layers": 0,
                                                          **schedule}), block=64)


@pytest.mark.parametrize("form", DENSE_FORMS)
def test_each_cuda_form_compiles_with_inductor_to_its_eager_route(form):
    if not create_forms([form])[form].availability().available:
        pytest.skip(f"{form} unavailable here")
    _, model, inputs = _wan64()
    plan = ditgate.attach(model, forms=[form], measure=False)
    eager = _run(model, inputs)
    if not _serving(plan, form):
        pytest.skip(f"{form} serves no call of this model: {plan.explain()}")
    with torch.no_grad():
        assert torch._dynamo.explain(model)(**inputs).graph_break_count == 0
    torch._dynamo.reset()
    compiled = torch.compile(model)
    assert _cos(_run(compiled, inputs), eager) >= FLOOR
    assert any((form, "") in {(c.route, c.reason) for c in s.compiled} for s in plan.report().sites)
    plan.detach()


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
@pytest.mark.parametrize("form", ["fp8", "int8", "fa4", "sdpa_cudnn"])
def test_cuda_graph_trees_replay_the_routes_on_new_values(form, mode):
    if not create_forms([form])[form].availability().available:
        pytest.skip(f"{form} unavailable here")
    _, model, inputs = _wan64()
    _, _, other = _wan64(seed=1)
    plan = ditgate.attach(model, forms=[form], measure=False)
    eager, eager_other = _run(model, inputs), _run(model, other)
    compiled = torch.compile(model, mode=mode)
    for _ in range(3):  # warm-up, record, replay
        out = _run(compiled, inputs)
    assert _cos(out, eager) >= FLOOR
    assert _cos(_run(compiled, other), eager_other) >= FLOOR  # a replay on other values
    plan.detach()


@pytest.mark.parametrize("form", SPARSE_FORMS)
def test_the_sparse_schedule_under_inductor_and_cuda_graphs_matches_eager(form):
    if not create_forms([form])[form].availability().available:
        pytest.skip(f"{form} unavailable here")
    _, model, inputs = _wan64()
    plan = ditgate.attach(model, forms=[form], measure=False, sparse=_sparse_setting(dense_steps=1))
    steps = (900, 800, 700, 950, 850)
    eager = [_run(model, inputs, timestep=torch.tensor([t], device="cuda")) for t in steps]
    if not _serving(plan, form):
        pytest.skip(f"{form} serves no call of this model: {plan.explain()}")
    compiled = torch.compile(model, mode="max-autotune")
    unique = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for t, expected in zip(steps, eager):
        assert _cos(_run(compiled, inputs, timestep=torch.tensor([t], device="cuda")), expected) >= FLOOR, t
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - unique == 2  # a dense and a sparse graph
    plan.detach()


@pytest.mark.parametrize("sparse", [False, True])
def test_manual_cuda_graph_capture_of_an_attached_model(sparse):
    form = "fp8_sparse" if sparse else "fp8"
    if not create_forms([form])[form].availability().available:
        pytest.skip(f"{form} unavailable here")
    _, model, inputs = _wan64()
    _, _, other = _wan64(seed=1)
    plan = ditgate.attach(model, forms=[form], measure=False, sparse=_sparse_setting() if sparse else None)
    expected = _run(model, other)
    static = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):  # warm-up: routes resolved, workspaces made, layouts read
            model(**static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = model_output(model(**static))  # no host synchronisation may happen in here
    for k, v in other.items():
        if isinstance(v, torch.Tensor):
            static[k].copy_(v)
    graph.replay()
    assert _cos(out, expected) >= FLOOR
    assert _serving(plan, form)
    plan.detach()
