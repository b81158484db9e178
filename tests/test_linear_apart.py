"""A linear site whose input is an activation's output (the feed-forward's down projection): found by structure, its
input quantized in a kernel of its own inside a compiled graph (``ditgate::rowwise_quant``) rather than fused into
the activation's kernel, and timed whole by a plan for a compiled model."""

import os
import subprocess
import sys

import pytest
import torch

import ditgate
from ditgate.gate.linear import COMPILED_TIMING, LinearSetting
from ditgate.hosts.linears import find_linear_sites

from .helpers import LENIENT_SPEED, Tiny, model_output

LENIENT = LENIENT_SPEED


@pytest.mark.parametrize("family", ["tiny-wan", "tiny-flux", "tiny-ltx"])
def test_the_feed_forwards_down_projection_is_found_after_its_activation(family):
    sites = find_linear_sites(Tiny(family).model)
    after = {s.path for s in sites if s.after_activation}
    assert after and all(p.endswith(".net.2") for p in after)
    assert all(s.role == "feed-forward" for s in sites if s.after_activation)
    ups = [s for s in sites if s.path.endswith(".net.0.proj")]
    assert ups and not any(s.after_activation for s in ups)  # the up projection takes the block's stream


def test_the_structure_decides_not_the_class_names():
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Dropout(0.0), torch.nn.Linear(32, 8))
    chain = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.0), torch.nn.Linear(8, 8))
    assert [s.after_activation for s in find_linear_sites(mlp)] == [False, True]
    assert [s.after_activation for s in find_linear_sites(chain)] == [False, False]  # a linear's output, not an activation's


def _quantization_ops(model, inputs) -> int:
    """How many ``ditgate::rowwise_quant`` calls one compile of ``model`` puts in its graphs."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=keep)(**inputs)
    torch._dynamo.reset()
    op = torch.ops.ditgate.rowwise_quant
    return sum(1 for g in graphs for n in g.graph.nodes if n.target in (op, op.default))


@pytest.mark.parametrize("form", ["int8_linear", "fp8_linear"])
def test_a_compiled_graph_quantizes_an_activations_output_in_its_own_op(form):
    from ditgate.forms.linear import create_linear_forms

    avail = create_linear_forms([form])[form].availability()
    if not avail.available:
        pytest.skip(avail.reason)
    tiny = Tiny("tiny-wan")
    after = [s.path for s in find_linear_sites(tiny.model) if s.after_activation]
    counts = {}
    for how in ("apart", "fused"):
        with torch.no_grad():
            plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False,
                                  linear=LinearSetting(forms=(form,), activation_quantization=how))
            eager = tiny.forward()  # the routes resolve; the weights settle
            served = {s.name for s in plan.report().linear.sites if s.serving == form}
            counts[how] = _quantization_ops(tiny.model, tiny.inputs)
            compiled = model_output(torch.compile(tiny.model)(**tiny.inputs))
            plan.detach()
            torch._dynamo.reset()
        assert torch.allclose(compiled.float(), eager.float(), rtol=0, atol=2e-2), how
    assert set(after) <= served
    assert counts == {"apart": len(after), "fused": 0}


def _timing_variants(tiny: Tiny, how: str) -> tuple[set, set]:
    """The timing variants of ``int8_linear`` in a plan made for a compiled model, by whether the site that timed
    each was a down projection (after an activation) or another."""
    plan = ditgate.attach(tiny.model, profile=LENIENT, forms=["sdpa_math"], timing_cache=False, progress=False,
                          linear=LinearSetting(forms=("int8_linear",), compiled=True, activation_quantization=how))
    tiny.forward()
    down = {r.name for r in plan.linear.routers if r.after_activation}
    entries = [(k, t) for k, t in plan.chooser.book._entries.items() if k.form == "int8_linear"]
    plan.detach()
    assert down and all(t.site for _, t in entries)
    return {k.variant for k, t in entries if t.site in down}, {k.variant for k, t in entries if t.site not in down}


def test_a_plan_for_a_compiled_model_times_a_site_quantizing_apart_whole():
    """Its graph runs the quantization as a kernel of its own, so the product alone would flatter it; the sites
    whose quantization fuses keep the product-alone timing."""
    tiny = Tiny("tiny-wan")
    down, others = _timing_variants(tiny, "apart")
    assert down == {""} and others == {COMPILED_TIMING}
    down, others = _timing_variants(tiny, "fused")  # the down projections' key timed once, at another site
    assert down <= {COMPILED_TIMING} and others == {COMPILED_TIMING}


def test_a_site_whose_weights_did_not_settle_quantizes_apart_in_a_graph_too():
    """Weights kept as candidates (a site with verdicts of several forms, say) run the same ``graph_serve``."""
    tiny = Tiny("tiny-wan")
    with torch.no_grad():
        plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False, linear=["int8_linear"])
        eager = tiny.forward()
        for router in plan.linear.routers:  # as if calibration had left them unsettled
            form = router.custody.payload_form
            if form is not None:
                router.candidates[form] = router.custody.payload()
                router.custody.payload_form = None
        assert any(r.candidates for r in plan.linear.routers if r.after_activation)
        ops = _quantization_ops(tiny.model, tiny.inputs)
        compiled = model_output(torch.compile(tiny.model)(**tiny.inputs))
        torch._dynamo.reset()
    assert ops == len([s for s in find_linear_sites(tiny.model) if s.after_activation])
    assert torch.allclose(compiled.float(), eager.float(), rtol=0, atol=2e-2)


def test_an_unknown_activation_quantization_is_refused():
    with pytest.raises(ValueError, match="activation_quantization"):
        LinearSetting(activation_quantization="later")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])])
def test_the_op_matches_the_torch_quantization_and_its_fake(device):
    """On a CPU the op runs these torch ops themselves; on a GPU, ditgate's Triton kernel, which must give their bits."""
    from ditgate.forms.linear import quantize_fp8, quantize_int8

    x = torch.randn(48, 6, dtype=torch.bfloat16, device=device).t()  # [6, 48], K strided
    for fp8, reference in ((True, quantize_fp8), (False, quantize_int8)):
        values, scales = torch.ops.ditgate.rowwise_quant(x, fp8)
        want_values, want_scales = reference(x)
        assert torch.equal(values.view(torch.uint8) if fp8 else values,
                           want_values.view(torch.uint8) if fp8 else want_values)
        assert torch.equal(scales, want_scales.reshape(-1, 1))
        torch.library.opcheck(torch.ops.ditgate.rowwise_quant.default, (x, fp8))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_compiled_graph_launches_the_quantization_kernel_from_its_own_code():
    """The op is a triton_op: inductor's generated code launches ditgate's kernel itself (no Python body of the op
    runs per call), after the activation's own kernel, with the eager kernel's numerics."""
    from torch._inductor.utils import run_and_get_code

    from ditgate.forms.linear import quantize_fp8
    from ditgate.forms.rowwise_op import quantize_apart

    h = torch.randn(96, 640, device="cuda", dtype=torch.bfloat16)
    gelu = torch.compile(lambda t: torch.nn.functional.gelu(t, approximate="tanh"), fullgraph=True)
    both = torch.compile(lambda t: quantize_apart(torch.nn.functional.gelu(t, approximate="tanh"), True),
                         fullgraph=True)
    (values, scales), codes = run_and_get_code(both, h)
    code = "\n".join(codes)
    assert "_rowwise_kernel" in code and "rowwise_quant.default" not in code
    want_values, want_scales = quantize_fp8(gelu(h))
    assert torch.equal(scales, want_scales.reshape(-1, 1))
    assert torch.equal(values.view(torch.uint8), want_values.view(torch.uint8))


def test_torch_finds_the_ops_kernel_for_its_compile_caches():
    """torch keys its compiled-graph caches on the kernels it finds by reading a triton_op's source; a kernel it
    did not find would not invalidate them when edited. (In a process of its own: under the interpreter, which
    these tests set, the kernel is an interpreted function that torch does not look for.)"""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    probe = ("import ditgate\nfrom torch._library.triton import get_triton_kernels_for_op\n"
             "print([getattr(k, '__name__', '') for k in get_triton_kernels_for_op('ditgate::rowwise_quant')])")
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "['_rowwise_kernel']"


def test_under_the_interpreter_the_op_serves_cuda_tensors_with_torch_ops(monkeypatch):
    """A traced launch cannot run under Triton's interpreter (the op's body is its own fake there): with
    TRITON_INTERPRET=1 on a CUDA machine the op takes the torch ops, which trace."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ditgate.forms import rowwise_op

    launched = []
    monkeypatch.setattr(rowwise_op, "quantize_rows", lambda *args, **kwargs: launched.append(args))
    for interpreted in (True, False):
        monkeypatch.setattr(rowwise_op, "INTERPRETED", interpreted)
        with FakeTensorMode():
            x = torch.empty(4, 8, dtype=torch.bfloat16, device="cuda")
            out = rowwise_op._rowwise_quant(x, True)
        if interpreted:
            assert not launched and out[0].shape == (4, 8) and out[1].shape == (4, 1)
            assert out[0].dtype == torch.float8_e4m3fn and out[0].device.type == "cuda"
    assert len(launched) == 1  # not interpreted: the kernel's launcher
