"""FlashAttention-3 forms (fa3, fa3_fp8) and their per-head e4m3 quantization (kernels.fp8_heads).

On a CPU: the forms' declarations and reasons, the static chooser and the gate stepping past them, and the
quantization kernel under TRITON_INTERPRET=1 against a float64 reference. On a Hopper GPU with fa3-fwd
installed (marked gpu): both forms against SDPA.
"""

import pytest
import torch
import torch.nn.functional as F

import ditgate
from ditgate.forms import (BOUNDED_PRIORITY, EXACT_PRIORITY, AttentionCall, AttentionInputs, MaskKind, Precision,
                           create_forms, spec_reasons)

from .helpers import Tiny

pytest.importorskip("triton")

from ditgate.kernels.fp8_heads import quantize_heads  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8_MAX = 448.0


def _call(**kw):
    base = dict(batch=1, heads_q=24, heads_kv=24, seq_q=4608, seq_kv=4608, head_dim=128, head_dim_v=128,
                dtype="bfloat16", device_type="cuda", capability=(9, 0), mask=MaskKind.NONE, is_causal=False,
                dropout_p=0.0, enable_gqa=False, needs_grad=False)
    return AttentionCall(**{**base, **kw})


def _reasons(form, call):
    """Everything a form holds against a call apart from its availability (which needs the package here)."""
    return spec_reasons(form.spec, call) + form.extra_reasons(call)


# --- declarations and reasons ----------------------------------------------------------------------------------

def test_forms_are_declared_in_their_priorities():
    forms = create_forms(["fa3", "fa3_fp8"])
    assert forms["fa3"].precision is Precision.EXACT and "fa3" in EXACT_PRIORITY
    assert forms["fa3_fp8"].precision is Precision.BOUNDED and "fa3_fp8" in BOUNDED_PRIORITY
    assert EXACT_PRIORITY.index("fa4") < EXACT_PRIORITY.index("fa3") < EXACT_PRIORITY.index("sdpa_cudnn")
    for form in forms.values():
        assert form.spec.package == "fa3-fwd" and form.spec.min_capability == form.spec.max_capability == (9, 0)
        assert _reasons(form, _call()) == []  # Flux 1024 in bf16 on an H100
        assert _reasons(form, _call(heads_kv=8, seq_kv=333)) == []  # grouped-query, cross lengths


def test_envelopes_say_what_the_build_cannot_do():
    fa3, fp8 = create_forms(["fa3", "fa3_fp8"]).values()
    assert any("dtype float16" in r for r in _reasons(fa3, _call(dtype="float16")))  # fp16 is compiled out
    assert _reasons(fp8, _call(dtype="float16")) == []  # quantized anyway; the bf16 output is cast back
    assert any("compute capability" in r for r in _reasons(fa3, _call(capability=(10, 0))))
    assert any("compute capability" in r for r in _reasons(fp8, _call(capability=(8, 0))))
    assert any("bottom-right" in r for r in _reasons(fa3, _call(is_causal=True, seq_kv=1000)))
    assert _reasons(fa3, _call(is_causal=True)) == []
    assert any("mask kind boolean" in r for r in _reasons(fa3, _call(mask=MaskKind.BOOLEAN)))
    assert any("multiple of 16" in r for r in _reasons(fp8, _call(head_dim=72, head_dim_v=72)))
    assert _reasons(fa3, _call(head_dim=72, head_dim_v=72)) == []
    assert any("value head dim" in r for r in _reasons(fa3, _call(head_dim=128, head_dim_v=64)))
    assert _reasons(fa3, _call(head_dim=192, head_dim_v=128)) == []  # a combination FA3 compiles
    assert any("value head dim" in r for r in _reasons(fp8, _call(head_dim=192, head_dim_v=128)))
    assert any("has no backward" in r for r in _reasons(fa3, _call(needs_grad=True)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's answer")
def test_unavailable_without_cuda_with_the_install_hint():
    for name, form in create_forms(["fa3", "fa3_fp8"]).items():
        avail = form.availability()
        assert not avail.available and avail.reason.startswith("no CUDA device"), (name, avail)
        if avail.version is None:
            assert "pip install 'ditgate[fa3]'" in avail.reason
        assert form.not_supported_reasons(_call())[0].startswith("unavailable: no CUDA device")


def test_unavailable_on_other_gpus_and_without_the_package(monkeypatch):
    import sys

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 9))
    assert "needs a Hopper GPU" in create_forms(["fa3"])["fa3"].availability().reason
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setitem(sys.modules, "fa3_fwd_interface", None)  # import fails, as when the wheel is absent
    for form in create_forms(["fa3", "fa3_fp8"]).values():
        avail = form.availability()
        assert not avail.available and "fa3_fwd_interface not importable" in avail.reason, avail


def test_static_chooser_and_gate_step_past_them_on_this_machine():
    if create_forms(["fa3"])["fa3"].availability().available:
        pytest.skip("fa3 is available here: nothing to step past")
    tiny = Tiny("tiny-flux")
    host = tiny.forward()
    plan = ditgate.attach(tiny.model, forms=["fa3", "fa3_fp8", "sdpa_math"], measure=False)
    assert torch.allclose(tiny.forward(), host, atol=1e-5)
    assert {s.serving for s in plan.report().sites} == {"sdpa_math"}
    plan.detach()
    plan = ditgate.attach(tiny.model, forms=["fa3", "fa3_fp8", "sdpa_math"])
    tiny.forward()
    verdicts = plan.report().sites[0].verdicts
    assert verdicts
    refusals = {r.form: r for r in verdicts[0].refusals}
    for name in ("fa3", "fa3_fp8"):
        assert refusals[name].kind == "unavailable" and refusals[name].detail, refusals[name]
    plan.detach()


def test_bench_kernels_lists_both_with_a_reason_or_a_time():
    from ditgate.cli.bench_kernels import KERNEL_PRESETS, bench_kernels

    assert {"image-8192-hd128", "image-8192-hd64", "flux-1024", "wan-14b-480p", "ltx-1216x704x257"} <= set(
        KERNEL_PRESETS)
    rows = {r.name: r for r in bench_kernels([KERNEL_PRESETS["tiny"]], ["fa3", "fa3_fp8", "sdpa_math"],
                                             torch.device("cpu"), torch.float32, warm=1)}
    assert set(rows) == {"fa3", "fa3_fp8", "sdpa_math"}
    assert all(r.status == "ok" or r.reason for r in rows.values())
    assert rows["sdpa_math"].status == "ok" and "the best exact (sdpa_math)" in rows["sdpa_math"].detail


# --- the quantization kernel against float64 -------------------------------------------------------------------

def _inputs(B, HQ, HKV, SQ, SKV, D, dtype, seed, k_offset=0.0):
    """Q, K, V as diffusers hands them over: B, S, H, D storage seen through B, H, S, D views."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, SQ, HQ, D, generator=g)
    k = torch.randn(B, SKV, HKV, D, generator=g) + k_offset * torch.randn(D, generator=g)
    v = torch.randn(B, SKV, HKV, D, generator=g) * 3
    return tuple(t.to(dtype).to(DEVICE).transpose(1, 2) for t in (q, k, v))


def _reference(q, k, v):
    """The scales and e4m3 copies in float64: per-(batch, kv head) scales, Q's over its group of query heads,
    K less its mean with the bound amax(k) + max |mean|; copies in B, S, H, D."""
    q, k, v = (t.double().cpu() for t in (q, k, v))
    B, HQ, SQ, D = q.shape
    HKV = k.shape[1]
    mean = k.mean(2, keepdim=True)
    amax = torch.stack([q.reshape(B, HKV, -1).abs().amax(-1),
                        k.abs().amax((2, 3)) + mean.abs().amax((2, 3)),
                        v.abs().amax((2, 3))])
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return scale, (q, k - mean, v)


def _e4m3(x):
    return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def _step(y):
    """The e4m3 step at |y| (2**-9 below its normal range)."""
    return torch.exp2((torch.log2(y.abs().clamp(min=2.0 ** -6)).floor() - 3))


CASES = [(1, 2, 2, 64, 64, 64), (2, 4, 2, 70, 97, 128), (1, 6, 2, 33, 150, 64), (1, 2, 1, 40, 50, 96)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", CASES, ids=["square-hd64", "batch-gqa-cross-hd128", "gqa3-cross-odd-hd64",
                                                   "mqa-hd96"])
def test_quantize_heads_matches_float64(shape, dtype):
    q, k, v = _inputs(*shape, dtype, seed=sum(shape), k_offset=4.0)
    z = quantize_heads(q, k, v)
    B, HQ, SQ, D = q.shape
    HKV, SKV = k.shape[1], k.shape[2]
    assert z.query.shape == (B, SQ, HQ, D) and z.key.shape == z.value.shape == (B, SKV, HKV, D)
    assert z.query.dtype == torch.float8_e4m3fn and z.query.is_contiguous() and z.descale.shape == (3, B, HKV)
    scale, smoothed = _reference(q, k, v)
    assert torch.allclose(z.descale.double().cpu(), scale, rtol=1e-5, atol=0)
    heads = [HQ // HKV, 1, 1]
    for i, (copy, exact) in enumerate(zip((z.query, z.key, z.value), smoothed)):
        per_head = z.descale[i].double().cpu().repeat_interleave(heads[i], 1)[:, :, None, None]
        y = exact / per_head  # in units of the copy, with the kernel's own scale
        got = copy.cpu().double().transpose(1, 2)
        assert ((got - y).abs() <= _step(y) * 0.5 + 1e-4).all()  # the nearest e4m3 value
        same = (got == _e4m3(y).double()).double().mean().item()
        assert same > 0.999, (i, same)  # round to nearest even, but for ties the float32 arithmetic moved
        assert y.abs().max() <= FP8_MAX * (1 + 1e-6)


def _bits(t):
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def test_quantize_heads_is_deterministic_and_order_free():
    q, k, v = _inputs(2, 4, 2, 70, 97, 128, torch.bfloat16, seed=3, k_offset=2.0)
    a, b, c = quantize_heads(q, k, v), quantize_heads(q, k, v), quantize_heads(q, k, v, reverse=False)
    for other in (b, c):
        for name in ("query", "key", "value", "descale"):
            assert torch.equal(_bits(getattr(a, name)), _bits(getattr(other, name))), name


def test_quantize_heads_fills_the_given_buffers_and_refuses_bad_shapes():
    q, k, v = _inputs(1, 2, 2, 40, 40, 64, torch.bfloat16, seed=5)
    made = {}

    def buffers(shape, dtype, name):
        made[name] = torch.full(shape, 7, dtype=torch.uint8 if dtype == torch.float8_e4m3fn else dtype,
                                device=DEVICE)
        return made[name].view(dtype) if dtype == torch.float8_e4m3fn else made[name]

    z = quantize_heads(q, k, v, buffers=buffers)
    assert {"q", "k", "v", "descale", "accumulators"} <= set(made)
    assert z.query.data_ptr() == made["q"].data_ptr() and torch.equal(z.query, quantize_heads(q, k, v).query)
    with pytest.raises(ValueError, match="not a multiple"):
        quantize_heads(torch.cat([q, q[:, :1]], 1), k, v)
    with pytest.raises(ValueError, match="shapes do not fit"):
        quantize_heads(q, k[..., :32], v[..., :32])


def _attention(q, k, v):
    q, k, v = (t.double().cpu() for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1))


def _cosine(a, b):
    return F.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()


def test_smoothing_keeps_keys_with_an_offset_accurate():
    """Attention over the dequantized copies (FA3's FP8 P.V rounding aside) against float64 attention: K's mean
    costs nothing (softmax cancels it) and keeps keys that share a per-channel offset accurate, where quantizing
    those keys as they are loses more."""
    q, k, v = _inputs(1, 2, 2, 128, 128, 64, torch.bfloat16, seed=11, k_offset=8.0)
    z = quantize_heads(q, k, v)
    dq = [c.cpu().double().transpose(1, 2) * z.descale[i].double().cpu()[:, :, None, None]
          for i, c in enumerate((z.query, z.key, z.value))]
    ref = _attention(q, k, v)
    smoothed = _cosine(_attention(*dq), ref)
    k_plain = k.double().cpu()
    k_scale = k_plain.abs().amax((2, 3), keepdim=True) / FP8_MAX
    plain = _cosine(_attention(dq[0], _e4m3(k_plain / k_scale).double() * k_scale, dq[2]), ref)
    assert smoothed > 0.998 and smoothed > plain, (smoothed, plain)


# --- on a Hopper GPU with fa3-fwd -------------------------------------------------------------------------------

def _form_or_skip(name):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    form = create_forms([name])[name]
    avail = form.availability()
    if not avail.available:
        pytest.skip(f"{name} unavailable: {avail.reason}")
    return form


GPU_CASES = [(2, 8, 8, 1024, 1024, 128, False), (1, 8, 2, 512, 777, 64, False), (1, 4, 4, 333, 333, 256, True),
             (1, 24, 24, 4608, 4608, 128, False)]
GPU_IDS = ["batch-hd128", "gqa-cross-hd64", "causal-hd256", "flux-1024"]


def _gpu_inputs(B, HQ, HKV, SQ, SKV, D, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(B, s, h, D, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
                 for s, h in ((SQ, HQ), (SKV, HKV), (SKV, HKV)))


def _sdpa32(q, k, v, causal):
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                          enable_gqa=q.shape[1] != k.shape[1])


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=GPU_IDS)
def test_fa3_matches_sdpa(case):
    form = _form_or_skip("fa3")
    *shape, causal = case
    q, k, v = _gpu_inputs(*shape, torch.bfloat16)
    out = form.run(AttentionInputs(q, k, v, is_causal=causal))
    ref = _sdpa32(q, k, v, causal)
    assert out.shape == ref.shape and out.dtype == torch.bfloat16
    assert _cosine(out.float(), ref) > 0.99999 and (out.float() - ref).abs().max().item() < 3e-2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", GPU_CASES, ids=GPU_IDS)
def test_fa3_fp8_matches_sdpa(case, dtype):
    form = _form_or_skip("fa3_fp8")
    *shape, causal = case
    q, k, v = _gpu_inputs(*shape, dtype)
    out = form.run(AttentionInputs(q, k, v, is_causal=causal, scale=0.9 * shape[-1] ** -0.5))
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                         scale=0.9 * shape[-1] ** -0.5, enable_gqa=q.shape[1] != k.shape[1])
    assert out.shape == ref.shape and out.dtype == dtype
    cos = _cosine(out.float(), ref)
    print(f"fa3_fp8 {shape} causal={causal} {dtype}: cosine {cos:.6f}")
    assert cos > 0.995, cos
    assert form.resident_bytes() > 0
    form.release()
    assert form.resident_bytes() == 0
