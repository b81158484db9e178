"""fa3_fp8's one-pass quantization at scales carried from a site's previous call (kernels.fp8_heads_carried).

On a CPU under TRITON_INTERPRET=1 against float64: the copies at the carried scales and mean, the statistics a pass
leaves for the next, the repair of heads whose carried scale did not hold; the form keeping them per site with
FA3's kernel replaced by float64 attention over the copies. On a Hopper GPU with fa3-fwd (marked gpu): the form
over a site's calls against SDPA.
"""

import textwrap

import pytest
import torch
import torch.nn.functional as F

from ditgate.forms import AttentionInputs, create_forms

pytest.importorskip("triton")

from ditgate.kernels.fp8_heads import accumulator_size, quantize_heads, split_accumulators  # noqa: E402
from ditgate.kernels.fp8_heads_carried import quantize_heads_carried  # noqa: E402

from .helpers import HOPPER, compiled_child  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8_MAX, HEADROOM = 448.0, 4.0


def _inputs(B, HQ, HKV, S, D, seed, scales=(1.0, 1.0, 1.0)):
    """B, S, H, D storage seen through B, H, S, D views; K with a per-channel offset that stays from call to call
    (as a model's keys keep theirs from step to step), the rest drawn from ``seed``."""
    offset = 3 * torch.randn(D, generator=torch.Generator().manual_seed(D))
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S, HQ, D, generator=g) * scales[0]
    k = (torch.randn(B, S, HKV, D, generator=g) + offset) * scales[1]
    v = torch.randn(B, S, HKV, D, generator=g) * scales[2]
    return tuple(t.bfloat16().to(DEVICE).transpose(1, 2) for t in (q, k, v))


def _stats(q, k):
    return [torch.zeros(accumulator_size(q, k), dtype=torch.int64, device=DEVICE) for _ in range(2)]


def _counter():
    return torch.zeros(1, dtype=torch.int32, device=DEVICE)


def _e4m3(x):
    return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).double()


def _agrees(copy, exact_units):
    """A copy (B, S, H, D e4m3) against float64 values in its units (B, H, S, D): the nearest e4m3 value, except
    where the value lies within float32's rounding of a tie (the kernel divides by a reciprocal in float32)."""
    got = copy.cpu().double().transpose(1, 2)
    exact = exact_units.clamp(-FP8_MAX, FP8_MAX)
    step = torch.exp2((torch.log2(exact.abs().clamp(min=2.0 ** -6)).floor() - 3))
    off = (got - exact).abs()
    assert (off <= step * 0.5 + 1e-4).all()
    moved = got != _e4m3(exact)
    assert ((off - step * 0.5).abs()[moved] <= 1e-6 * exact.abs()[moved] + 1e-9).all()


def _per_head(descale, group):
    return descale.double().cpu().repeat_interleave(group, 1)[:, :, None, None]


SHAPE = (1, 4, 2, 70, 64)  # B, Hq, Hkv (grouped queries), S (a partial block), D


def test_the_pass_quantizes_at_the_carried_scales_and_leaves_the_next_calls_statistics():
    B, HQ, HKV, S, D = SHAPE
    q1, k1, v1 = _inputs(*SHAPE, seed=1)
    q2, k2, v2 = _inputs(*SHAPE, seed=2, scales=(1.5, 0.8, 2.0))  # within the headroom both ways
    last, into = _stats(q1, k1)
    quantize_heads(q1, k1, v1, accumulators=last)
    repaired = _counter()
    z = quantize_heads_carried(q2, k2, v2, last, into, repaired)
    assert repaired.item() == 0
    # the scales: the first call's absmax (K's raw, as the two passes take it) times the headroom
    p1 = [t.double().cpu() for t in (q1, k1, v1)]
    amax1 = torch.stack([p1[0].reshape(B, HKV, -1).abs().amax(-1), p1[1].abs().amax((2, 3)), p1[2].abs().amax((2, 3))])
    assert torch.allclose(z.descale.double().cpu(), amax1 * HEADROOM / FP8_MAX, rtol=1e-6)
    mean1 = p1[1].mean(2, keepdim=True)
    p2 = [t.double().cpu() for t in (q2, k2, v2)]
    exact = (p2[0], p2[1] - mean1, p2[2])
    for i, copy in enumerate((z.query, z.key, z.value)):
        _agrees(copy, exact[i] / _per_head(z.descale[i], HQ // HKV if i == 0 else 1))
    # what the pass leaves: the absmax of what it quantized (K less the mean it used) and K's column sums
    sums, amax = split_accumulators(into, k2)
    want = torch.stack([p2[0].reshape(B, HKV, -1).abs().amax(-1), exact[1].abs().amax((2, 3)),
                        p2[2].abs().amax((2, 3))])
    assert torch.allclose(amax.double().cpu().view(3, B, HKV), want, rtol=1e-3)
    assert torch.allclose(sums.double().cpu().view(B, HKV, D) / 65536, p2[1].sum(2), atol=S * 2.0 ** -16)


def test_heads_whose_carried_scale_did_not_hold_are_quantized_again_exactly():
    B, HQ, HKV, S, D = SHAPE
    q1, k1, v1 = _inputs(*SHAPE, seed=3)
    # Q a thousand times smaller (its carried scale far too large), V ten times larger (clamped), K as it was
    q2, k2, v2 = _inputs(*SHAPE, seed=4, scales=(1e-3, 1.0, 10.0))
    last, into = _stats(q1, k1)
    quantize_heads(q1, k1, v1, accumulators=last)
    quantize_heads_carried(q1, k1, v1, last, into, _counter())  # a carried call: ``into`` holds its statistics
    repaired = _counter()
    z = quantize_heads_carried(q2, k2, v2, into, last, repaired)
    assert repaired.item() == 2 * B * HKV  # every Q and V head, no K head
    p2 = [t.double().cpu() for t in (q2, k2, v2)]
    exact_q = p2[0].reshape(B, HKV, -1).abs().amax(-1) / FP8_MAX
    exact_v = p2[2].abs().amax((2, 3)) / FP8_MAX
    assert torch.allclose(z.descale[0].double().cpu(), exact_q, rtol=1e-6)
    assert torch.allclose(z.descale[2].double().cpu(), exact_v, rtol=1e-6)
    carried_k = split_accumulators(into, k1)[1].view(3, B, HKV)[1] * HEADROOM / FP8_MAX
    assert torch.allclose(z.descale[1], carried_k, rtol=1e-6)  # K kept its carried scale
    _agrees(z.query, p2[0] / _per_head(z.descale[0], HQ // HKV))
    _agrees(z.value, p2[2] / _per_head(z.descale[2], 1))
    assert z.value.cpu().double().abs().max().item() == FP8_MAX  # the exact scale puts the absmax on 448


def test_only_the_heads_that_missed_are_repaired_across_batches_and_many_blocks():
    """Two batches, 18 blocks of rows per head (more than the repair launch's programs per head): batch 1's keys a
    hundred times larger (clamped at the carried scale) and batch 0's values a thousand times smaller (scale far too
    large) are quantized again; every other head keeps its carried scale; every copy is the nearest e4m3 value."""
    B, HQ, HKV, S, D = 2, 2, 1, 2200, 64
    q1, k1, v1 = _inputs(B, HQ, HKV, S, D, seed=6)
    q2, k2, v2 = _inputs(B, HQ, HKV, S, D, seed=7)
    k2, v2 = k2.clone(), v2.clone()
    k2[1] *= 100
    v2[0] *= 1e-3
    last, into = _stats(q1, k1)
    quantize_heads(q1, k1, v1, accumulators=last)
    repaired = _counter()
    z = quantize_heads_carried(q2, k2, v2, last, into, repaired)
    assert repaired.item() == 2
    sums, amax = split_accumulators(last, k1)
    carried = amax.double().cpu().view(3, B, HKV) * HEADROOM / FP8_MAX
    mean = sums.double().cpu().view(B, HKV, 1, D) / 65536 / S
    p2 = [t.double().cpu() for t in (q2, k2, v2)]
    exact = (p2[0], p2[1] - mean, p2[2])
    got = z.descale.double().cpu()
    assert torch.allclose(got[0], carried[0], rtol=1e-6)  # Q: no head missed
    assert torch.allclose(got[1, 0], carried[1, 0], rtol=1e-6) and torch.allclose(got[2, 1], carried[2, 1], rtol=1e-6)
    assert torch.allclose(got[1, 1], exact[1][1].abs().amax() / FP8_MAX, rtol=1e-5)  # repaired: the exact scales
    assert torch.allclose(got[2, 0], exact[2][0].abs().amax() / FP8_MAX, rtol=1e-5)
    for i, copy in enumerate((z.query, z.key, z.value)):
        _agrees(copy, exact[i] / _per_head(z.descale[i], HQ // HKV if i == 0 else 1))


def test_the_pass_refuses_accumulators_that_do_not_fit():
    q, k, v = _inputs(*SHAPE, seed=5)
    last, into = _stats(q, k)
    with pytest.raises(ValueError, match="must not be last"):
        quantize_heads_carried(q, k, v, last, last, _counter())
    with pytest.raises(ValueError, match="accumulator_size"):
        quantize_heads_carried(q, k, v, last[:-1], into, _counter())
    with pytest.raises(ValueError, match="accumulator_size"):
        quantize_heads_carried(q, k, v, last.int(), into, _counter())


# --- the form: statistics per site, FA3's kernel replaced by float64 attention over the copies --------------------

def _dequantized_attention(q8, k8, v8, scale, causal, descale):
    """FA3's FP8 call as float64 attention over the dequantized copies (B, S, H, D in and out)."""
    group = q8.shape[2] // k8.shape[2]
    q, k, v = (t.double().transpose(1, 2) * d.double().repeat_interleave(g, 1)[:, :, None, None]
               for t, d, g in zip((q8, k8, v8), descale, (group, 1, 1)))
    out = F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), scale=scale)
    return out.transpose(1, 2).bfloat16()


def _bound(f, taken):
    """``f`` with its kernels bound without the probe (no FA3 here), counting which quantization each call took."""
    import ditgate.kernels.fp8_heads as heads
    import ditgate.kernels.fp8_heads_carried as carried
    from ditgate.kernels.launches import recording

    def two_pass(*a, **kw):
        taken.append("two")
        return heads.quantize_heads(*a, **kw)

    def one_pass(*a, **kw):
        taken.append("one")
        return carried.quantize_heads_carried(*a, **kw)
    f._quantize, f._carried, f._accumulator_size, f._recording = two_pass, one_pass, heads.accumulator_size, recording
    f._attend = _dequantized_attention
    f.taken = taken
    return f


@pytest.fixture
def form():
    """fa3_fp8 with its kernels bound without the probe, FA3's kernel as float64 attention over the copies."""
    f = _bound(create_forms(["fa3_fp8"])["fa3_fp8"], [])
    yield f
    f.release()


def _run(form, q, k, v, site):
    return form.run(AttentionInputs(q, k, v, site=site))


def _cosine(a, b):
    return F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def _reference(q, k, v):
    group = q.shape[1] // k.shape[1]
    q, k, v = (t.double().cpu() for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))


def test_the_form_keeps_statistics_per_site_and_shape(form):
    calls = [_inputs(*SHAPE, seed=10 + i, scales=(1 + 0.1 * i, 1.0, 1 - 0.1 * i)) for i in range(3)]
    for i, (q, k, v) in enumerate(calls):
        for site in ("blocks.0.attn", "blocks.1.attn"):
            out = _run(form, q, k, v, site)
            cos = _cosine(out.cpu(), _reference(q, k, v))
            assert cos > 0.998, (i, site, cos)
    assert form.taken == ["two", "two", "one", "one", "one", "one"]  # each site's first call takes two passes
    assert form.repaired_heads() == 0
    other = _inputs(1, 4, 2, 40, 64, seed=20)  # another shape at a known site: its own first call
    _run(form, *other, "blocks.0.attn")
    _run(form, *other, None)  # no site (a benchmark): two passes, nothing kept
    _run(form, *other, None)
    assert form.taken[6:] == ["two", "two", "two"]
    assert form._statistics.kept() == 3
    resident = form.resident_bytes()
    assert resident > 0
    form.release()
    assert form.resident_bytes() == 0 and form._statistics.kept() == 0
    _run(form, *calls[0], "blocks.0.attn")
    assert form.taken[-1] == "two"  # released: the statistics are gone


def test_shapes_whose_statistics_are_the_same_size_keep_their_own(form):
    """Cond and uncond calls with keys cut to their own prompts differ in length alone: each keeps its statistics
    (here the second's values are two hundred times the first's; reading each other's would repair every V head)."""
    a = _inputs(*SHAPE, seed=60)
    b = _inputs(1, 4, 2, 40, 64, seed=61, scales=(1.0, 1.0, 200.0))
    for _ in range(3):
        for q, k, v in (a, b):
            _run(form, q, k, v, "s")
    assert form.taken == ["two", "two", "one", "one", "one", "one"]
    assert form.repaired_heads() == 0


def test_the_environment_can_keep_every_call_on_two_passes(monkeypatch):
    monkeypatch.setenv("DITGATE_FA3_FP8_CARRY", "0")
    f = _bound(create_forms(["fa3_fp8"])["fa3_fp8"], [])
    q, k, v = _inputs(*SHAPE, seed=50)
    for _ in range(3):
        _run(f, q, k, v, "s")
    assert f.taken == ["two", "two", "two"] and f._statistics.kept() == 0
    f.release()


def test_one_pass_is_as_accurate_as_two(form):
    """Attention over the carried copies against float64, beside the same call quantized in two passes."""
    q1, k1, v1 = _inputs(*SHAPE, seed=30)
    q2, k2, v2 = _inputs(*SHAPE, seed=31, scales=(1.3, 1.0, 0.7))
    _run(form, q1, k1, v1, "s")
    carried = _cosine(_run(form, q2, k2, v2, "s").cpu(), _reference(q2, k2, v2))
    two = _cosine(_run(form, q2, k2, v2, None).cpu(), _reference(q2, k2, v2))
    assert form.taken == ["two", "one", "two"]
    assert carried > 0.998 and abs(carried - two) < 2e-4, (carried, two)


DRY_CALL = HOPPER + textwrap.dedent("""
    from ditgate.forms import AttentionInputs, create_forms
    from ditgate.gate.compile_ahead import compile_launches
    from ditgate.kernels.launches import recorded_launches

    form = create_forms(["fa3_fp8"])["fa3_fp8"]
    import ditgate.kernels.fp8_heads as heads, ditgate.kernels.fp8_heads_carried as carried
    from ditgate.kernels.launches import recording
    form._quantize, form._carried = heads.quantize_heads, carried.quantize_heads_carried
    form._accumulator_size, form._recording = heads.accumulator_size, recording
    form._attend = lambda q, k, v, scale, causal, descale: torch.zeros(q.shape, dtype=torch.bfloat16)
    q, k, v = (torch.empty(1, 300, h, 128, dtype=torch.bfloat16).transpose(1, 2) for h in (8, 2, 2))
    form._pool = __import__("ditgate.forms.workspace", fromlist=["x"]).WorkspacePool()
    live = AttentionInputs(q, k, v, site="blocks.1.attn")  # a site with statistics from earlier calls
    key, stats = form._statistics.site_buffers(form._pool, live)
    for buf in stats:
        buf.fill_(7)
    form._statistics._last[key] = 1
    with recorded_launches() as launches:
        form.run(AttentionInputs(q, k, v, site="blocks.0.attn"))
        form.run(live)
    untouched = all(bool((buf == 7).all()) for buf in stats) and form._statistics._last == {key: 1}
    kept = form._statistics.kept() - 1
    launches = launches[:4]
    print(json.dumps({"recorded": [l.kernel.fn.__name__ for l in launches], "kept": kept, "untouched": untouched,
                      "compiled": compile_launches(launches, workers=2),
                      "built": sorted(c["kernel"] for c in compiles if not c["hit"])}))
""")


def test_a_dry_call_records_both_paths_keeps_nothing_touches_no_statistics_and_they_compile(tmp_path):
    got = compiled_child(tmp_path, DRY_CALL)
    kernels = ["_reduce_kernel", "_quantize_kernel", "_carried_kernel", "_repair_kernel"]
    assert got["recorded"] == kernels and got["kept"] == 0
    assert got["untouched"]  # a dry call at a site with statistics leaves them (its zeroing runs on scratch)
    assert got["compiled"] == 4 and got["built"] == sorted(kernels)


# --- on a Hopper GPU with fa3-fwd -------------------------------------------------------------------------------

@pytest.mark.gpu
def test_fa3_fp8_over_a_sites_calls_matches_sdpa():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    form = create_forms(["fa3_fp8"])["fa3_fp8"]
    if not form.availability().available:
        pytest.skip(f"fa3_fp8 unavailable: {form.availability().reason}")
    g = torch.Generator(device="cuda").manual_seed(0)
    for i, scale in enumerate([1.0, 1.2, 0.9, 8.0, 1.0]):  # the fourth call's V outgrows the headroom
        q, k, v = (torch.randn(1, 4608, 24, 128, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)
                   * s for s in (1.0, 1.0, scale))
        out = form.run(AttentionInputs(q, k, v, site="flux.0"))
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
        cos = _cosine(out.float(), ref)
        assert cos > 0.998, (i, cos)
        if i == 2:
            assert form.repaired_heads() == 0
    assert form.repaired_heads() == 24  # the fourth call's V heads (the fifth's are within the headroom again)
    form.release()
