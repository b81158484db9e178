"""The quantized sparse forms pool Q and K for the selector in the pass that quantizes them, and reuse
those copies in their kernel (TRITON_INTERPRET=1 on a CPU): the tile means equal the selector's own, the
lists are the same, and the outputs have the same bits as without the shared pass."""

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

import ditgate  # noqa: E402
from ditgate.kernels.quant_attention import KernelConfig, Quantized, quant_attention, quantize  # noqa: E402
from ditgate.models.presets import get_preset  # noqa: E402
from ditgate.sparse.layout import TokenLayout  # noqa: E402
from ditgate.sparse.selector import TileSelector, _pool  # noqa: E402

CFG = KernelConfig(32, 32, 4, 1)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _qkv(seed, H=4, HK=2, SQ=70, SK=97, D=64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, SQ, H, D, generator=g).to(torch.bfloat16).transpose(1, 2)  # B, S, H, D storage
    k = (torch.randn(1, HK, SK, D, generator=g) + 0.5).to(torch.bfloat16)  # a common offset, as real keys have
    v = torch.randn(1, HK, SK, D, generator=g).to(torch.bfloat16)
    return q.to(DEVICE), k.to(DEVICE), v.to(DEVICE)


def test_the_quantization_pass_sums_what_the_selector_pools_and_keeps_k_mean_and_v_scale():
    q, k, v = _qkv(1)
    qz = quantize(q, k, v, "fp8", 0.125, CFG, sums=True)
    query, key = qz.tile_means(64, 70, 97)  # two 32-row blocks per query tile; a partial last tile each
    assert query.shape == (1, 4, 2, 64) and key.shape == (1, 2, 4, 64)
    assert torch.allclose(query, _pool(q, 64, 2), atol=1e-5)
    assert torch.allclose(key, _pool(k, 32, 4), atol=1e-5)
    # K's mean and V's channel scale from the same one-pass statistics as before they were fused
    assert torch.allclose(qz.k_sums.sum(2) / 97, k.float().mean(2), atol=1e-5)
    absmax = v.float().abs().amax(2).reshape(2, 64)
    assert torch.allclose(qz.v_scale, absmax / 448.0, rtol=1e-6)
    # one launch for both tensors, also where Q has more tiles than K (programs past a tensor's tiles do nothing)
    q2, k2, v2 = _qkv(7, SQ=150, SK=40)
    qz2 = quantize(q2, k2, v2, "fp8", 0.125, CFG, sums=True)
    query2, key2 = qz2.tile_means(96, 150, 40)
    assert query2.shape == (1, 4, 2, 64) and key2.shape == (1, 2, 2, 64)
    assert torch.allclose(query2, _pool(q2, 96, 2), atol=1e-5) and torch.allclose(key2, _pool(k2, 32, 2), atol=1e-5)
    with pytest.raises(ValueError, match="whole blocks"):
        qz.tile_means(48, 70, 97)
    with pytest.raises(ValueError, match="without the sums"):
        quantize(q, k, v, "fp8", 0.125, CFG).tile_means(64, 70, 97)


@pytest.mark.parametrize("qk", ["fp8", "int8"])
def test_prepared_copies_are_used_as_made_and_a_mismatch_is_refused(qk):
    q, k, v = _qkv(2)
    _, k2, v2 = _qkv(3)
    g = torch.Generator().manual_seed(4)
    keep = torch.rand(1, 4, 3, 4, generator=g) < 0.6
    keep[..., 0] = True
    keep = keep.to(DEVICE)
    lists = KeyBlockListsFrom(keep)
    kw = dict(qk=qk, kv_index=lists.kv_index, kv_count=lists.kv_count, config=CFG)
    plain = quant_attention(q, k, v, **kw)
    made = quantize(q, k, v, qk, 64 ** -0.5, CFG, sums=True)
    assert torch.equal(quant_attention(q, k, v, prepared=made, **kw), plain)
    # the copies are what the kernel reads: copies of other keys give those keys' result
    other = quantize(q, k2, v2, qk, 64 ** -0.5, CFG)
    assert torch.equal(quant_attention(q, k, v, prepared=other, **kw), quant_attention(q, k2, v2, **kw))
    with pytest.raises(ValueError, match="prepared copies were made for"):
        quant_attention(q, k, v, prepared=quantize(q, k, v, qk, 0.1, CFG), **kw)
    with pytest.raises(ValueError, match="prepared copies were made for"):
        quant_attention(q, k, v, prepared=dataclasses.replace(made, permuted_v=True), **kw)


def KeyBlockListsFrom(keep):  # noqa: N802 - a constructor by another name
    from ditgate.kernels.lists import KeyBlockLists

    return KeyBlockLists.from_block_mask(keep, CFG.block_m, CFG.block_n)


def test_the_selector_takes_the_consumers_tiles_only_when_it_selects():
    layout = TokenLayout.video_then(10 * 32)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 10 * 32, 4, 64, generator=g).to(torch.bfloat16).transpose(1, 2).to(DEVICE)
    k, v = (torch.randn(1, 2, 10 * 32, 64, generator=g).to(torch.bfloat16).to(DEVICE) for _ in range(2))
    qz = quantize(q, k, v, "fp8", 0.125, CFG, sums=True)
    for kernels in (False, True):
        selector = TileSelector(32, kernels=kernels)
        asked = []

        def pooled():
            asked.append(1)
            return qz.tile_means(64, 320, 320)

        own = selector.select(q, k, layout, 0.3, 64)
        given = selector.select(q, k, layout, 0.3, 64, pooled)
        assert asked == [1]
        assert torch.equal(given.kv_count, own.kv_count) and torch.equal(given.kv_index, own.kv_index)
        assert selector.select(q, k, layout, 1.0, 64, lambda: pytest.fail("pooled at full budget")) is None
        with pytest.raises(ValueError, match="pooled tiles must be"):
            selector.select(q, k, layout, 0.3, 64, lambda: qz.tile_means(32, 320, 320))


def _tiny_wan_fp16():
    base = get_preset("tiny-wan")  # head dim 64 and 16-bit weights: what the kernel takes
    preset = dataclasses.replace(base, config=dict(base.config, num_attention_heads=1, attention_head_dim=64),
                                 geometry=dict(base.geometry, frames=4, height=16, width=16))
    model = preset.build().to(device=DEVICE, dtype=torch.float16)
    inputs = {n: (x.to(torch.float16) if x.is_floating_point() else x).to(DEVICE) if torch.is_tensor(x) else x
              for n, x in preset.inputs(model).items()}
    return model, inputs


def test_the_fp8_sparse_form_pools_for_its_selection_and_runs_on_those_copies():
    """Through a plan: the form's pooling is asked for once per selected call, its copies reach its run,
    and the model's output has the same bits as when the selector pools for itself."""
    from ditgate.forms.quant import Fp8SparseAttention

    class Spy(Fp8SparseAttention):
        spec = dataclasses.replace(Fp8SparseAttention.spec, name="spy_fp8_sparse")
        share = True

        def __init__(self):
            super().__init__()
            self.pooled, self.prepared = 0, []

        def pool_for_selection(self, call, inputs, rows, block):
            self.pooled += 1
            return super().pool_for_selection(call, inputs, rows, block) if self.share else None

        def run(self, inputs):
            self.prepared.append(inputs.prepared)
            return super().run(inputs)

    model, inputs = _tiny_wan_fp16()
    setting = ditgate.SparseSetting(ditgate.BudgetSchedule(budget=0.3, dense_steps=0, dense_layers=0), block=16,
                                    forms=("fp8_sparse",))
    outs = {}
    for share in (True, False):
        spy = Spy()
        spy.share = share
        if not spy.availability().available:
            pytest.skip(spy.availability().reason)
        plan = ditgate.attach(model, forms=["spy_fp8_sparse"], measure=False, extra_forms=[spy], sparse=setting)
        with torch.no_grad():
            outs[share] = ditgate.hosts.model_output(model(**{**inputs, "timestep": torch.tensor([800], device=DEVICE)})
                                                     ).clone()
        plan.detach()
        assert spy.pooled == len(spy.prepared) > 0  # self-attention sites only: cross-attention stays on the host
        if share:
            assert all(isinstance(p, Quantized) and p.q_sums is not None for p in spy.prepared)
        else:
            assert spy.prepared == [None] * spy.pooled
    assert torch.equal(outs[True], outs[False])


@pytest.mark.parametrize("qk, permute_v", [("fp8", True), ("int8", False)])
def test_the_passes_give_every_batch_entry_and_head_its_own_sums_scales_and_means(qk, permute_v):
    """The quantization's passes and the selector's pooling take a block of every head in turn
    (``quant_passes._block_and_head``): with two batch entries and grouped key/value heads, each head's tile means,
    K mean and V scale are its own, as torch computes them."""
    from ditgate.kernels.tile_select import pool_tiles

    g = torch.Generator().manual_seed(6)
    q = torch.randn(2, 70, 4, 64, generator=g).to(torch.bfloat16).transpose(1, 2).to(DEVICE)
    k = (torch.randn(2, 2, 97, 64, generator=g) + 0.5).to(torch.bfloat16).to(DEVICE)
    v = torch.randn(2, 2, 97, 64, generator=g).to(torch.bfloat16).to(DEVICE)
    qz = quantize(q, k, v, qk, 0.125, CFG, permute_v=permute_v, sums=True)
    query, key = qz.tile_means(64, 70, 97)
    assert torch.allclose(query, _pool(q, 64, 2), atol=1e-5) and torch.allclose(key, _pool(k, 32, 4), atol=1e-5)
    assert torch.allclose(qz.k_sums.sum(2) / 97, k.float().mean(2), atol=1e-5)
    assert torch.allclose(qz.v_scale, v.float().abs().amax(2).reshape(4, 64) / 448.0, rtol=1e-6)
    for x, block in ((q, 48), (k, 32)):
        means = pool_tiles(x, block)
        assert torch.allclose(means, _pool(x, block, means.shape[2]), atol=1e-5)
