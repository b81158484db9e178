"""fa3_fp8 inside a compiled graph: its quantization as torch ops (forms.fp8_heads_traced), fused by the compiler,
and FA3's FP8 kernel as a custom op (ops.fa3_fp8_quantized).

On a CPU: the quantization eagerly and compiled against a float64 reference (K's scale the exact absolute maximum
of K less its mean), the form's graph path compiled end to end (FA3 is missing here, so the op's fallback serves
the dequantized copies, with a warning), and the op path still reachable. On a Hopper GPU with fa3-fwd (marked gpu):
the compiled graph path against SDPA.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F

from ditgate.forms import AttentionInputs, create_forms
from ditgate.forms.fp8_heads_traced import E4M3_MAX, quantize_heads_traced

from .test_fa3 import _inputs as fa3_inputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CASES = [(1, 2, 2, 64, 64, 64), (2, 4, 2, 70, 97, 128), (1, 6, 2, 33, 150, 64)]
IDS = ["square-hd64", "batch-gqa-cross-hd128", "gqa3-cross-odd-hd64"]


def _inputs(B, HQ, HKV, SQ, SKV, D, dtype=torch.bfloat16, seed=0, k_offset=4.0):
    """``test_fa3``'s inputs (B, S, H, D storage seen through B, H, S, D views), K offset per channel by default."""
    return fa3_inputs(B, HQ, HKV, SQ, SKV, D, dtype, seed, k_offset)


def _reference(q, k, v):
    """float64 descales [3, B, Hkv] and the smoothed operands: Q's scale over its kv head's group of query heads,
    K's the exact absolute maximum of K less its mean over the sequence."""
    q, k, v = (t.double().cpu() for t in (q, k, v))
    B, HKV = q.shape[0], k.shape[1]
    smoothed = k - k.mean(2, keepdim=True)
    amax = torch.stack([q.reshape(B, HKV, -1).abs().amax(-1), smoothed.abs().amax((2, 3)), v.abs().amax((2, 3))])
    return torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax)), (q, smoothed, v)


def _check_against_reference(q, k, v, got):
    q8, k8, v8, descale = got
    B, HQ, SQ, D = q.shape
    HKV = k.shape[1]
    assert descale.shape == (3, B, HKV) and descale.dtype == torch.float32
    assert all(t.dtype == torch.float8_e4m3fn for t in (q8, k8, v8))
    assert q8.shape == q.shape and k8.shape == k.shape and v8.shape == v.shape
    scale, exact = _reference(q, k, v)
    assert torch.allclose(descale.double().cpu(), scale, rtol=1e-5, atol=0)
    for i, (copy, x) in enumerate(zip((q8, k8, v8), exact)):
        per_head = descale[i].double().cpu().repeat_interleave(HQ // HKV if i == 0 else 1, 1)[:, :, None, None]
        y = x / per_head
        assert y.abs().max() <= E4M3_MAX * (1 + 1e-5)  # the scale covers the head: nothing clamps
        per_scale = y.reshape(B, HKV, -1).abs().amax(-1)  # Q's over its kv head's group of query heads
        assert per_scale.min() > E4M3_MAX * 0.99  # and each scale's largest value uses the top of e4m3
        step = torch.exp2(torch.log2(y.abs().clamp(min=2.0 ** -6)).floor() - 3)
        assert ((copy.double().cpu() - y).abs() <= step * 0.5 + 1e-3).all(), i  # the nearest e4m3 value


@pytest.mark.parametrize("shape", CASES, ids=IDS)
def test_traced_quantization_matches_float64(shape):
    q, k, v = _inputs(*shape, seed=sum(shape))
    _check_against_reference(q, k, v, quantize_heads_traced(q, k, v))


@pytest.mark.parametrize("shape", CASES, ids=IDS)
def test_q_and_v_copies_are_the_triton_passes_bits_and_k_is_at_least_as_fine(shape):
    """Against ``kernels.fp8_heads`` (interpreted here): Q's and V's copies and descales bit for bit; K's descale the
    exact absmax of K less its mean, never above the passes' bound."""
    from ditgate.kernels.fp8_heads import quantize_heads

    q, k, v = _inputs(*shape, seed=3)
    q8, k8, v8, descale = quantize_heads_traced(q, k, v)
    z = quantize_heads(q, k, v)
    assert torch.equal(descale[0], z.descale[0]) and torch.equal(descale[2], z.descale[2])
    assert (q8.transpose(1, 2).contiguous().view(torch.uint8) == z.query.view(torch.uint8)).all()
    assert (v8.transpose(1, 2).contiguous().view(torch.uint8) == z.value.view(torch.uint8)).all()
    assert (descale[1] <= z.descale[1] * (1 + 1e-6)).all() and (descale[1] < z.descale[1]).any()


def test_an_all_zero_head_gets_descale_one_and_zero_copies():
    q, k, v = _inputs(1, 2, 2, 16, 16, 64)
    q, k, v = q.clone(), k.clone(), v.clone()
    q[:, 1].zero_(), k[:, 0].fill_(3.0), v[:, 0].zero_()  # K constant over the sequence: zero once smoothed
    q8, k8, v8, descale = quantize_heads_traced(q, k, v)
    assert descale[0, 0, 1] == 1 and descale[1, 0, 0] == 1 and descale[2, 0, 0] == 1
    assert not q8[:, 1].float().any() and not k8[:, 0].float().any() and not v8[:, 0].float().any()


def test_uneven_head_groups_are_refused():
    q, k, v = _inputs(1, 3, 2, 8, 8, 64)[0], *_inputs(1, 2, 2, 8, 8, 64)[1:]
    with pytest.raises(ValueError, match="3 query heads"):
        quantize_heads_traced(q, k, v)


@pytest.mark.parametrize("shape", CASES[1:], ids=IDS[1:])
def test_compiled_quantization_gives_the_eager_copies(shape):
    q, k, v = _inputs(*shape, seed=7)
    torch._dynamo.reset()
    compiled = torch.compile(quantize_heads_traced, fullgraph=True)(q, k, v)
    _check_against_reference(q, k, v, compiled)
    eager = quantize_heads_traced(q, k, v)
    assert torch.allclose(compiled[3], eager[3], rtol=1e-6, atol=0)
    for a, b in zip(compiled[:3], eager[:3]):  # the compiler may round x / scale a hair differently
        assert (a.view(torch.uint8) == b.view(torch.uint8)).float().mean() > 0.999


def _compiled_graph_path(form, q, k, v, scale):
    form.graph_quantization = "traced"
    torch._dynamo.reset()
    fn = torch.compile(lambda q, k, v: form.in_graph(AttentionInputs(q, k, v, scale=scale)), fullgraph=True)
    return fn(q, k, v)


def _fa3_serves() -> bool:
    return create_forms(["fa3_fp8"])["fa3_fp8"].availability().available


@pytest.mark.skipif(_fa3_serves(), reason="FA3's kernel serves here; the GPU test covers that")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("scale", [0.1, None], ids=["scale", "default-scale"])
def test_the_graph_path_compiles_and_without_fa3_sdpa_serves_the_dequantized_copies(dtype, scale):
    """Each query head of a group at its own magnitude and V's heads apart: a copy dequantized with another head's
    scale, or attending to another kv head, would be far off."""
    form = create_forms(["fa3_fp8"])["fa3_fp8"]
    q, k, v = _inputs(2, 4, 2, 70, 97, 128, dtype, seed=11)
    heads = torch.tensor([1.0, 2.0, 0.5, 1.5], device=q.device, dtype=dtype)[None, :, None, None]
    q, v = q * heads, v * heads[:, ::2] * torch.tensor([1.0, -1.0], device=q.device, dtype=dtype)[None, :, None, None]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _compiled_graph_path(form, q, k, v, scale)
    assert any("FlashAttention-3 FP8 raised" in str(w.message) for w in caught)
    assert out.shape == q.shape and out.dtype == dtype
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=scale, enable_gqa=True)
    for h in range(4):  # each head on its own: a mixed-up group would fail here
        cos = F.cosine_similarity(out[:, h].float().flatten(), ref[:, h].flatten(), dim=0).item()
        assert cos > 0.995, (h, cos)


def test_the_kernel_op_passes_torchs_op_checks():
    """``ops.fa3_fp8_quantized``: its fake against its real output (the fallback here), under fake tensors and
    compile (the schema check is left out: it compares outputs, and torch cannot compare e4m3 tensors on a CPU)."""
    q, k, v = _inputs(1, 4, 2, 24, 40, 64, seed=9)
    q8, k8, v8, descale = quantize_heads_traced(q, k, v)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FA3 is missing here: the fallback serves, and says so
        torch.library.opcheck(torch.ops.ditgate.fa3_fp8_quantized.default, (q8, k8, v8, descale, 0.125, False),
                              test_utils=("test_faketensor", "test_aot_dispatch_static"))


@pytest.mark.parametrize("setting", [None, "op", "traced"])
def test_the_setting_picks_the_graph_path(monkeypatch, setting):
    """The op (the Triton passes, opaque) by default and under ``DITGATE_FA3_FP8_GRAPH=op``; the torch ops and FA3's
    kernel alone under ``traced``."""
    if setting is not None:
        monkeypatch.setenv("DITGATE_FA3_FP8_GRAPH", setting)
    form = create_forms(["fa3_fp8"])["fa3_fp8"]
    q, k, v = _inputs(1, 2, 2, 16, 16, 64)
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda q, k, v: form.in_graph(AttentionInputs(q, k, v)),
                                                    tracing_mode="fake")(q, k, v)
    seen = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    traced = setting == "traced"
    assert (torch.ops.ditgate.fa3_fp8.default in seen) is not traced
    assert (torch.ops.ditgate.fa3_fp8_quantized.default in seen) is traced


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_compiled_graph_path_matches_sdpa_on_hopper(dtype):
    form = create_forms(["fa3_fp8"])["fa3_fp8"]
    if not form.availability().available:
        pytest.skip(form.availability().reason)
    q, k, v = _inputs(1, 24, 24, 4608, 4608, 128, dtype, seed=5, k_offset=1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _compiled_graph_path(form, q, k, v, 128 ** -0.5)
    fallbacks = [str(w.message) for w in caught if "raised inside a compiled graph" in str(w.message)]
    assert not fallbacks, fallbacks  # the kernel served
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    cos = F.cosine_similarity(out.float().flatten(), ref.flatten(), dim=0).item()
    print(f"fa3_fp8 compiled graph path {dtype}: cosine {cos:.6f}")
    assert out.dtype == dtype and cos > 0.998, cos


def test_a_mistyped_setting_is_said_and_the_op_serves(monkeypatch, caplog):
    monkeypatch.setenv("DITGATE_FA3_FP8_GRAPH", "tracd")
    with caplog.at_level("WARNING", logger="ditgate"):
        form = create_forms(["fa3_fp8"])["fa3_fp8"]
    assert form.graph_quantization == "op" and "'tracd' is neither 'op' nor 'traced'" in caplog.text
