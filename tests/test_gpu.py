"""GPU-only checks (skipped without CUDA): every available CUDA form against a float32 reference, and a
gated attach on a tiny model in bf16. Timings are in benchmarks/, not here."""

import pytest
import torch

import ditgate
from ditgate.forms import AttentionInputs, create_forms, describe_call
from ditgate.gate import compare
from ditgate.hosts import model_output
from ditgate.models.presets import get_preset

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FLOORS = {"exact": 0.9999, "bounded": 0.999}
# all-FP8 attention measures cosine 0.9983-0.9985 on random N(0, 1) inputs on the H200, its P's bytes from FMAs
# included (benchmarks/results/h200/README.md)
FORM_FLOORS = {"fp8": 0.998}


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("seq_kv", [1000, 77])
def test_cuda_forms_match_a_float32_reference(head_dim, seq_kv):
    gen = torch.Generator(device="cuda").manual_seed(head_dim + seq_kv)
    q = torch.randn(1, 1000, 4, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
    k, v = (torch.randn(1, seq_kv, 4, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
            for _ in range(2))
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    call = describe_call(q, k, v, None, 0.0, False, False, torch.cuda.get_device_capability())
    ran = []
    for name, form in create_forms().items():
        if form.not_supported_reasons(call):
            continue
        out = form.run(AttentionInputs(q, k, v))
        assert out.shape == ref.shape and torch.isfinite(out).all(), name
        acc = compare(out.float(), ref)
        assert acc.cosine >= FORM_FLOORS.get(name, FLOORS[form.precision.value]), (name, acc)
        ran.append(name)
    assert {"sdpa_cudnn", "sdpa_flash", "sdpa_efficient"} & set(ran)


def test_gated_attach_on_cuda_is_exact_after_detach():
    preset = get_preset("tiny-wan")
    model = preset.build("cuda", torch.bfloat16)
    inputs = preset.inputs(model, "cuda", torch.bfloat16)
    with torch.no_grad():
        host = model_output(model(**inputs)).clone()
        plan = ditgate.attach(model)
        first = model_output(model(**inputs))
        routed = model_output(model(**inputs))
    assert torch.equal(first, host)
    assert compare(routed.float(), host.float()).cosine > 0.999
    assert all(s.verdicts for s in plan.report().sites)
    plan.detach()
    with torch.no_grad():
        assert torch.equal(model_output(model(**inputs)), host)


@pytest.mark.parametrize("head_dim,rows", [(64, 128), (128, 128), (64, 192)])
def test_sparse_forms_equal_attention_under_the_expanded_mask(head_dim, rows):
    """Every available block-sparse consumer (ours, flex, fa4's) against float32 SDPA under the
    token-expanded mask of one random selection (odd length: the tail block is partial). With 192-row query
    blocks (what the plain and FP8 forms ask for at head dim 64 on Hopper) only ditgate's forms take them:
    plain and FP8 on three warpgroups, INT8 on the Triton kernel split into 64-row blocks."""
    from ditgate.kernels.lists import KeyBlockLists

    gen = torch.Generator(device="cuda").manual_seed(head_dim)
    S, H, block = 1000, 4, 128
    q, k, v = (torch.randn(1, S, H, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
               for _ in range(3))
    n, n_m = -(-S // block), -(-S // rows)
    tiles = torch.rand(1, H, n_m, n, device="cuda", generator=gen) < 0.4
    tiles[..., torch.arange(n_m), torch.arange(n_m) * rows // block] = True  # every row keeps its diagonal
    lists = KeyBlockLists.from_block_mask(tiles, rows, block)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                           attn_mask=lists.token_mask(S, S))
    dense = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    call = describe_call(q, k, v, lists, 0.0, False, False, torch.cuda.get_device_capability())
    ran = []
    names = ("block_sparse", "fp8_sparse", "int8_sparse") + (("flex_sparse", "fa4_sparse") if rows == block else ())
    for name in names:
        form = create_forms([name])[name]
        if form.not_supported_reasons(call):
            continue
        out = form.run(AttentionInputs(q, k, v, attn_mask=lists)).float()
        floor = 0.9999 if name in ("block_sparse", "flex_sparse", "fa4_sparse") else 0.998
        assert compare(out, ref).cosine >= floor, name
        assert compare(out, dense).cosine < compare(out, ref).cosine - 1e-3, name  # the selection mattered
        ran.append(name)
    assert "block_sparse" in ran


def test_sparse_forms_ask_for_the_query_tiles_their_schedule_takes():
    """On Hopper at head dim 64, plain and FP8 ask the stage for 192-row tiles; INT8, head dim 128 and
    key tiles other than 128 keep the setting's square tiles."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the three-warpgroup schedule is Hopper's")
    forms = create_forms(["block_sparse", "fp8_sparse", "int8_sparse"])
    for d in (64, 128):
        q = torch.randn(1, 2, 256, d, device="cuda", dtype=torch.bfloat16)
        call = describe_call(q, q, q, None, 0.0, False, False, torch.cuda.get_device_capability())
        rows = {name: form.selection_rows(call, 128) for name, form in forms.items()}
        want = 192 if d == 64 else None
        assert rows == {"block_sparse": want, "fp8_sparse": want, "int8_sparse": None}, d
        assert forms["block_sparse"].selection_rows(call, 64) is None


@pytest.mark.parametrize("rows, heads", [(128, (8, 8)), (192, (8, 2))], ids=["square", "tall-gqa"])
def test_the_selectors_kernel_keeps_each_rows_best_tiles_at_a_long_shape(rows, heads):
    """The selector's Triton path (pooling, the scores' product, ``tile_select.choose_and_list``) at a long video
    sequence with text after it: every video row keeps exactly its budget, its diagonal and the text tiles, and its
    chosen video tiles are the best by float64 scores of the same tile means wherever the kept and the first
    left-out score differ by more than rounding (near ties may fall either way)."""
    from ditgate.kernels.tile_select import pool_tiles
    from ditgate.sparse.layout import TokenLayout
    from ditgate.sparse.selector import TileSelector

    H, HK = heads
    layout = TokenLayout.video_then(20000, (("text", 512),))
    gen = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(1, layout.length, H, 64, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
    k = torch.randn(1, layout.length, HK, 64, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
    selector = TileSelector(128, kernels=True)
    lists = selector.select(q, k, layout, 0.3, rows)
    geo, keep = selector.geometry(layout, q.device, rows), selector.keep_count(layout, 0.3, rows)
    scores = torch.einsum("bhmd,bhnd->bhmn", pool_tiles(q, rows).double(),
                          pool_tiles(k, 128).double().repeat_interleave(H // HK, 1))
    scores = torch.where(geo.fixed, geo.fixed_score.double(), scores)
    n = scores.shape[-1]
    used = torch.arange(lists.kv_index.shape[-1], device="cuda") < lists.kv_count[..., None]
    kept = torch.zeros(*scores.shape[:-1], n + 1, dtype=torch.bool, device="cuda")  # unused slots land past the end
    kept = kept.scatter_(-1, torch.where(used, lists.kv_index, n).long(), True)[..., :n]
    video = geo.sparse[None, None, :].expand_as(lists.kv_count)
    competing = ~geo.fixed[None, None]
    diagonal = (geo.fixed_score > 0).sum(-1)  # the video key tiles each query tile overlaps, kept within its budget
    assert ((kept & competing).sum(-1) == keep - diagonal)[video].all()
    assert (kept | ~geo.always[None, None]).all() and (kept | ~(geo.fixed_score > 0)[None, None]).all()
    lowest_kept = torch.where(kept & competing, scores, float("inf")).amin(-1)
    highest_left = torch.where(~kept & competing, scores, float("-inf")).amax(-1)
    scale = torch.where(competing, scores.abs(), 0.0).amax(-1).clamp_min(1e-6)  # the fixed scores are infinite
    clear = (lowest_kept - highest_left).abs() > 1e-5 * scale
    assert (lowest_kept >= highest_left)[video & clear].all()
    assert clear[video].float().mean() > 0.9  # the check above covered most rows
