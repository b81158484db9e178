"""ditgate's own 8-bit attention quantized in one read at K's mean and V's scales carried from a site's previous call
(kernels.quant_passes_carried), under TRITON_INTERPRET=1 against ``quantize`` and float64.

Where the carried statistics are this call's own, the one-read copies are ``quantize``'s bit for bit (both modes,
V permuted for the Hopper schedule or not); the statistics it leaves are this call's; a V channel whose carried
scale did not hold is repaired (its head's blocks again, the exact scale for that channel) and counted; K's mean
may be stale without any repair, and the attention over the copies still agrees with float64; the forms keep the
statistics per site and count repairs."""

import textwrap

import pytest
import torch

pytest.importorskip("triton")

from ditgate.forms import AttentionInputs, create_forms  # noqa: E402
from ditgate.kernels.quant_attention import KernelConfig, quant_attention  # noqa: E402
from ditgate.kernels.quant_passes import quantize  # noqa: E402
from ditgate.kernels.quant_passes_carried import quantize_carried, split_statistics, statistics_size  # noqa: E402

from .helpers import HOPPER, compiled_child  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CFG = KernelConfig(32, 32, 4, 1)
HEADROOM = 4.0


def _qkv(B, H, HK, S, D, seed, v_scale=1.0):
    """B, S, H, D storage seen as B, H, S, D (diffusers' views); K with a per-channel offset, as a model's keys."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S, H, D, generator=g)
    k = torch.randn(B, S, HK, D, generator=g) + 2 * torch.randn(D, generator=torch.Generator().manual_seed(1))
    v = torch.randn(B, S, HK, D, generator=g) * v_scale
    return tuple(t.bfloat16().to(DEVICE).transpose(1, 2) for t in (q, k, v))


def _stats(k):
    return torch.zeros(statistics_size(k), dtype=torch.float32, device=DEVICE)


def _counter():
    return torch.zeros(1, dtype=torch.int32, device=DEVICE)


def _own(q, k, v, qk, permute):
    """``quantize``'s copies and the statistics it wrote, and ``last`` statistics that carry exactly those."""
    stats = _stats(k)
    z = quantize(q, k, v, qk, 0.125, CFG, permute_v=permute, statistics=stats)
    last = stats.clone()
    split_statistics(last, k)[1].div_(HEADROOM)  # the carried V scale is HEADROOM times the last exact one
    return z, stats, last


@pytest.mark.parametrize("qk", ["fp8", "int8"])
@pytest.mark.parametrize("permute", [False, True])
@pytest.mark.parametrize("shape", [(1, 2, 2, 64, 32), (2, 4, 2, 70, 64)], ids=["square", "batch-gqa-odd"])
def test_at_this_calls_own_statistics_the_copies_are_quantizes_bit_for_bit(qk, permute, shape):
    B, H, HK, S, D = shape
    q, k, v = _qkv(B, H, HK, S, D, seed=S + D)
    want, stats, last = _own(q, k, v, qk, permute)
    into, repaired = _stats(k), _counter()
    got = quantize_carried(q, k, v, qk, 0.125, CFG, last, into, repaired, permute_v=permute)
    for name in ("q", "q_scale", "k", "k_scale", "vt", "v_scale", "k_sums"):
        assert torch.equal(getattr(got, name).view(torch.uint8) if getattr(got, name).dtype.itemsize == 1
                           else getattr(got, name), getattr(want, name).view(torch.uint8)
                           if getattr(want, name).dtype.itemsize == 1 else getattr(want, name)), name
    assert got.settings == want.settings and (got.sq_pad, got.sk_pad) == (want.sq_pad, want.sk_pad)
    assert torch.equal(into, stats)  # the statistics left for the next call are this call's
    assert repaired.item() == 0


def test_with_a_workspace_every_copy_and_scratch_comes_from_it_and_the_values_do_not_change():
    """A form's calls take their scales and sums from its workspace, as they do their copies: no allocation per call
    but the output, and the same values as fresh tensors."""
    from ditgate.forms.workspace import WorkspacePool

    B, H, HK, S, D = 1, 2, 2, 64, 32
    q, k, v = _qkv(B, H, HK, S, D, seed=5)
    pool = WorkspacePool()

    def buffers(shape, dtype, name):
        return pool.get(shape, dtype, q.device, name)

    fields = ("q", "q_scale", "k", "k_scale", "vt", "v_scale", "k_sums", "q_sums")
    fresh = quantize(q, k, v, "fp8", 0.125, CFG, sums=True, statistics=_stats(k))
    last, into = _stats(k), _stats(k)
    pooled = quantize(q, k, v, "fp8", 0.125, CFG, buffers, sums=True, statistics=last)
    for name in fields:
        assert torch.equal(getattr(pooled, name).float(), getattr(fresh, name).float()), name
    carried = [quantize_carried(q, k, v, "fp8", 0.125, CFG, last, into, _counter(), buffers, sums=True)
               for _ in range(2)]
    kept = {buf.data_ptr() for buf in pool._buffers.values()}
    for z in (pooled, *carried):
        for name in fields:
            if name != "v_scale" or z is not pooled:  # two passes leave V's scales in the statistics buffer
                assert getattr(z, name).data_ptr() in kept, name
    for name in ("q", "q_scale", "k", "k_scale", "k_sums", "q_sums"):  # V's copy is at the carried scales
        assert torch.equal(getattr(carried[1], name).float(), getattr(fresh, name).float()), name
    assert carried[0].k_sums.data_ptr() == carried[1].k_sums.data_ptr()


def _v_copy_agrees(z, v, scale):
    """V's transposed FP8 copy (not permuted) is V over ``scale`` ([B * HK, D]) in e4m3, rounded as torch rounds,
    except where the rounding carries into the next power of two or meets a tie: Triton's interpreter (3.6) drops
    such carries (7.9 became 4) and rounds ties away from zero, where the GPU's cast does neither."""
    B, HK, S, D = v.shape
    y = v.float() / scale.float().view(B, HK, 1, D)
    want = y.to(torch.float8_e4m3fn).float()
    got = z.vt.float().view(B * HK, D, -1)[:, :, :S].transpose(1, 2).reshape(B, HK, S, D)
    carries = torch.floor(torch.log2(want.abs().clamp(min=2.0 ** -9))) > torch.floor(
        torch.log2(y.abs().clamp(min=2.0 ** -9)))
    step = torch.exp2(torch.floor(torch.log2(y.abs().clamp(min=2.0 ** -6))) - 3)
    ties = ((y.abs() / step) % 1 - 0.5).abs() < 1e-6
    assert (y.abs() <= 448 * (1 + 1e-6)).all()  # nothing clamped (448 itself within float32 rounding)
    assert ((got == want) | carries | ties).all()
    assert (got == want).float().mean() > 0.8


def test_a_channel_whose_carried_scale_did_not_hold_is_repaired_alone():
    B, H, HK, S, D = 1, 2, 2, 64, 32
    q, k, v = _qkv(B, H, HK, S, D, seed=3)
    _, stats, _ = _own(q, k, v, "fp8", False)
    exact_before = split_statistics(stats, k)[1].clone()
    grown = v.clone()
    grown[:, 1, :, 5] *= 10  # head 1, channel 5: ten times its last absmax, above the headroom of 4: clamped
    shrunk = v.clone()
    shrunk[:, 0, :, 7] /= 1000  # head 0, channel 7: its carried scale now 4000 times too large
    for v2, head, channel in ((grown, 1, 5), (shrunk, 0, 7)):
        into, repaired = _stats(k), _counter()
        z = quantize_carried(q, k, v2, "fp8", 0.125, CFG, stats, into, repaired)
        exact = v2.double().abs().amax(2).view(B * HK, D) / 448
        assert torch.allclose(split_statistics(into, k)[1].double(), exact, rtol=1e-6)
        want = HEADROOM * exact_before.double()
        want[head, channel] = exact[head, channel]
        assert torch.allclose(z.v_scale.double(), want, rtol=1e-6)
        assert repaired.item() == 1
        _v_copy_agrees(z, v2, z.v_scale)


def test_a_stale_key_mean_needs_no_repair_and_attention_still_agrees():
    B, H, HK, S, D = 1, 2, 1, 64, 64
    q, k, v = _qkv(B, H, HK, S, D, seed=5)
    _, stats, _ = _own(q, k, v, "int8", False)
    k2 = k + 5.0  # every key moved: the carried mean is far off, the blocks' own scales still exact
    into, repaired = _stats(k), _counter()
    z = quantize_carried(q, k2, v, "int8", D ** -0.5, CFG, stats, into, repaired)
    assert repaired.item() == 0
    assert torch.allclose(split_statistics(into, k)[0].double(), k2.double().mean(2).view(B * HK, D), atol=1e-4)
    out = quant_attention(q, k2, v, qk="int8", prepared=z, config=CFG)
    qd, kd, vd = (t.double().cpu() for t in (q, k2, v))
    ref = torch.softmax(qd @ kd.repeat_interleave(H // HK, 1).transpose(-1, -2) * D ** -0.5, -1) \
        @ vd.repeat_interleave(H // HK, 1)
    assert ((out.double().cpu() - ref).norm() / ref.norm()).item() < 0.10


def test_statistics_that_are_not_finite_do_not_carry_into_the_next_call():
    """A last call whose K or V held an inf left a mean or scales that are not numbers: this call's copies are still
    right (the mean taken as zero, every V head repaired at its exact scales)."""
    B, H, HK, S, D = 1, 2, 2, 64, 32
    q, k, v = _qkv(B, H, HK, S, D, seed=9)
    last = _stats(k)
    mean, exact = split_statistics(last, k)
    mean[0].fill_(float("nan"))
    mean[1].fill_(float("inf"))
    exact[0].fill_(float("nan"))
    exact[1].fill_(float("inf"))
    into, repaired = _stats(k), _counter()
    z = quantize_carried(q, k, v, "fp8", 0.125, CFG, last, into, repaired)
    assert torch.isfinite(into).all() and repaired.item() == B * HK
    assert torch.allclose(z.v_scale.double(), v.double().abs().amax(2).view(B * HK, D) / 448, rtol=1e-6)
    _v_copy_agrees(z, v, z.v_scale)
    assert torch.isfinite(z.k.float()).all() and torch.isfinite(z.k_scale).all()


def test_bad_statistics_buffers_are_refused():
    q, k, v = _qkv(1, 2, 2, 32, 32, seed=7)
    good = _stats(k)
    with pytest.raises(ValueError, match="statistics_size"):
        quantize_carried(q, k, v, "fp8", 0.125, CFG, good[:-1], _stats(k), _counter())
    with pytest.raises(ValueError, match="contiguous"):
        quantize(q, k, v, "fp8", 0.125, CFG, statistics=torch.zeros(2 * good.numel(), device=DEVICE)[::2])
    with pytest.raises(ValueError, match="must not be last"):
        quantize_carried(q, k, v, "fp8", 0.125, CFG, good, good, _counter())


def _site_call(form, q, k, v, site="blocks.0.attn1"):
    return form.run(AttentionInputs(query=q, key=k, value=v, scale=None, site=site))


@pytest.mark.parametrize("name", ["fp8", "int8"])
def test_the_forms_carry_per_site_and_count_repairs(name):
    form = create_forms([name])[name]
    if not form.availability().available:
        pytest.skip(form.availability().reason)
    B, H, HK, S, D = 1, 2, 2, 64, 64
    q, k, v = _qkv(B, H, HK, S, D, seed=11)
    first = _site_call(form, q, k, v)
    second = _site_call(form, q, k, v)  # one read, at the first call's statistics
    assert form.repaired_heads() == 0
    qd, kd, vd = (t.double().cpu() for t in (q, k, v))
    ref = torch.softmax(qd @ kd.transpose(-1, -2) * D ** -0.5, -1) @ vd
    for out in (first, second):
        assert ((out.double().cpu() - ref).norm() / ref.norm()).item() < 0.15
    v3 = v.clone()
    v3[:, 0] *= 20  # head 0's values twenty times larger: its carried scales do not hold
    _site_call(form, q, k, v3)
    assert form.repaired_heads() == 1
    _site_call(form, q, k, v3, site="blocks.1.attn1")  # another site starts on two passes: nothing to repair
    assert form.repaired_heads() == 1
    form.release()
    assert form.repaired_heads() == 0


COMPILE = HOPPER + textwrap.dedent("""
    from ditgate.gate.compile_ahead import compile_launches
    from ditgate.kernels.hopper_attention import quantize_for_schedule
    from ditgate.kernels.launches import recorded_launches
    from ditgate.kernels.quant_passes_carried import quantize_carried, statistics_size

    q, k, v = (torch.empty(1, 300, h, 128, dtype=torch.bfloat16).transpose(1, 2) for h in (8, 2, 2))
    last, into = (torch.empty(statistics_size(k)) for _ in range(2))
    repaired = torch.zeros(1, dtype=torch.int32)
    with recorded_launches() as launches:
        for mode in ("fp8", "int8"):
            quantize_for_schedule(q, k, v, mode, 0.1, quantizer=lambda *a, **kw: quantize_carried(
                *a[:6], last, into, repaired, *a[6:], **kw))
    print(json.dumps({"recorded": [l.kernel.fn.__name__ for l in launches],
                      "compiled": compile_launches(launches, workers=2),
                      "built": sorted(c["kernel"] for c in compiles if not c["hit"])}))
""")


def test_the_one_read_launches_compile_for_hopper(tmp_path):
    got = compiled_child(tmp_path, COMPILE)
    kernels = ["_carried_pass_kernel", "_kv_scales_kernel", "_repair_v_kernel"]
    assert got["recorded"] == kernels * 2
    # only the pass depends on the mode (K's copy): the scales and the repair compile once for both
    assert got["compiled"] == 4
    assert sorted(got["built"]) == sorted(kernels + ["_carried_pass_kernel"])


def test_the_report_and_explain_name_the_forms_that_repaired_heads():
    import ditgate

    from .helpers import Tiny

    tiny = Tiny("tiny-wan")
    plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False)
    try:
        tiny.forward()
        assert plan.report().repaired_heads == ()
        plan.forms["sdpa_math"].repaired_heads = lambda: 3  # as a carrying form counts its repairs
        assert plan.report().repaired_heads == (("sdpa_math", 3),)
        assert "sdpa_math 3 head(s)" in plan.explain()
    finally:
        plan.detach()
