"""Token layout and tile selector: pinned and diagonal tiles kept, budget exact, dense at full budget."""

import math

import pytest
import torch

from ditgate.kernels.lists import KeyBlockLists
from ditgate.sparse.layout import Segment, TokenLayout
from ditgate.sparse.selector import TileSelector

B = 8


def _layout():
    # 10 video tiles, then a text stretch that straddles a tile boundary, then padding
    return TokenLayout.video_then(10 * B, (("text", 12), ("padding", 12)))


def test_layout_marks_tiles_and_checks_its_segments():
    lay = _layout()
    sparse, pad = lay.tile_sparsifiable(B), lay.tile_padding(B)
    assert sparse.tolist() == [True] * 10 + [False] * 3
    assert pad.tolist() == [False] * 12 + [True]  # the tile mixing text and padding is not dropped
    with pytest.raises(ValueError, match="gap or overlap"):
        TokenLayout(10, (Segment(0, 4, "video"), Segment(5, 10, "text")))
    with pytest.raises(ValueError, match="unknown segment kind"):
        Segment(0, 1, "smell")
    merged = TokenLayout.of(("conditioning", 4), ("text", 0), ("conditioning", 4), ("video", 8))
    assert merged.segments == (Segment(0, 8, "conditioning"), Segment(8, 16, "video"))


def _qk(seed, S=104, H=4, HK=2, D=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, H, S, D, generator=g), torch.randn(1, HK, S, D, generator=g)


@pytest.mark.parametrize("budget", [0.1, 0.3, 0.5, 0.9])
def test_selector_keeps_diagonal_and_pinned_and_respects_the_budget(budget):
    lay, sel = _layout(), TileSelector(B)
    q, k = _qk(1)
    lists = sel.select(q, k, lay, budget)
    keep = math.ceil(budget * 10 - 1e-9)
    assert isinstance(lists, KeyBlockLists)
    count, index = lists.kv_count, lists.kv_index
    for m in range(13):
        row = index[0, :, m]
        c = count[0, :, m]
        if m < 10:  # video query tiles: keep video tiles + text tiles 10, 11 (tile 12 is all padding)
            assert (c == keep + 2).all()
            for h in range(4):
                chosen = row[h, : c[h]].tolist()
                assert m in chosen and 10 in chosen and 11 in chosen and 12 not in chosen
                assert chosen == sorted(set(chosen))
                assert sum(t < 10 for t in chosen) == keep
        else:  # text rows stay dense (padding tile dropped)
            assert (c == 12).all() and row[:, :12].tolist() == [list(range(12))] * 4


def test_full_budget_returns_dense_and_selection_follows_scores():
    lay, sel = _layout(), TileSelector(B)
    q, k = _qk(2)
    assert sel.select(q, k, lay, 1.0) is None
    # every query is the same vector u; key tile 3 is u scaled up, the rest noise: tile 3 must be chosen
    u = torch.randn(16, generator=torch.Generator().manual_seed(9))
    q = u.expand(1, 4, 104, 16).clone()
    k = 0.01 * k
    k[:, :, 3 * B: 4 * B] = u * 5
    lists = sel.select(q, k, lay, 0.2)  # 2 video tiles per row: the diagonal and the best other
    for m in range(10):
        chosen = lists.kv_index[0, :, m, : lists.kv_count[0, 0, m]]
        assert (chosen == 3).any(dim=-1).all() and (chosen == m).any(dim=-1).all()


def test_the_kernel_consumer_with_a_selection_equals_masked_attention():
    from ditgate.kernels.quant_attention import KernelConfig, quant_attention

    lay, sel = TokenLayout.video_then(96, (("text", 32),)), TileSelector(32)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 128, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    lists = sel.select(q, k, lay, 0.34)
    assert lists is not None
    out = quant_attention(q, k, v, qk="int8", config=KernelConfig(32, 32, 4, 1), kv_index=lists.kv_index,
                          kv_count=lists.kv_count).double()
    mask = lists.token_mask(128, 128)
    s = (q.double() @ k.double().transpose(-1, -2) / 8).masked_fill(~mask, float("-inf"))
    ref = torch.softmax(s, -1) @ v.double()
    dense = torch.softmax(q.double() @ k.double().transpose(-1, -2) / 8, -1) @ v.double()
    err = ((out - ref).norm() / ref.norm()).item()
    assert err < 0.1 and ((out - dense).norm() / dense.norm()).item() > 2 * err


def test_the_flex_consumer_with_a_selection_equals_sdpa_under_the_expanded_mask():
    from ditgate.forms import AttentionInputs, create_forms

    lay, sel = TokenLayout.video_then(384, (("text", 128),)), TileSelector(128)
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 512, 32, generator=g) for _ in range(3))
    lists = sel.select(q, k, lay, 0.34)  # 1 of 3 video tiles (the diagonal) + the text tile
    flex = create_forms(["flex"])["flex"]
    out = flex.run(AttentionInputs(q, k, v, attn_mask=lists))
    mask = lists.token_mask(512, 512)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert (out - ref).abs().max() < 1e-4
    assert (out - dense).abs().max() > 1e-2  # the selection changed the output


def _layouts():
    yield _layout()  # video, text, padding: 13 tiles of 8
    yield TokenLayout.video_then(96, (("text", 32),))  # text last
    yield TokenLayout.video_then(203, ())  # video only, a partial last tile


@pytest.mark.slow  # the kernels interpreted over three layouts: 5-20 s per budget (the tie and pooling tests below
@pytest.mark.parametrize("budget", [0.2, 0.5, 0.8])  # run the same kernels in the default set, at smaller inputs)
def test_the_triton_kernels_give_the_torch_paths_lists(budget):
    """The selector's two Triton kernels (interpreted here) against its torch path, Q stored B, S, H, D."""
    pytest.importorskip("triton")
    for n, lay in enumerate(_layouts()):
        g = torch.Generator().manual_seed(n)
        q = torch.randn(1, lay.length, 4, 16, generator=g).transpose(1, 2)
        k = torch.randn(1, 2, lay.length, 16, generator=g)
        want = TileSelector(B, kernels=False).select(q, k, lay, budget)
        got = TileSelector(B, kernels=True).select(q, k, lay, budget)
        assert torch.equal(got.kv_count, want.kv_count)
        used = torch.arange(got.kv_index.shape[-1]) < got.kv_count[..., None]
        assert torch.equal(torch.where(used, got.kv_index, -1), torch.where(used, want.kv_index, -1)), lay
        assert torch.equal(got.kv_index[~used], torch.zeros_like(got.kv_index[~used]))  # unused slots written


def test_the_kernel_keeps_exactly_the_budget_when_scores_tie():
    pytest.importorskip("triton")
    lay = _layout()
    q = torch.ones(1, 4, lay.length, 16)  # every pooled score equal
    lists = TileSelector(B, kernels=True).select(q, q[:, :2], lay, 0.3)
    for m in range(10):
        chosen = lists.kv_index[0, :, m, : lists.kv_count[0, 0, m]]
        assert ((chosen < 10).sum(-1) == 3).all() and (chosen == m).any(-1).all()  # 3 video tiles, diagonal first


def test_pooling_kernel_means_each_tile_and_the_partial_last():
    pytest.importorskip("triton")
    from ditgate.kernels.tile_select import pool_tiles
    from ditgate.sparse.selector import _pool

    x = torch.randn(2, 37, 3, 16).transpose(1, 2)
    assert torch.allclose(pool_tiles(x, 8), _pool(x, 8, 5), atol=1e-6)


def test_taller_query_tiles_keep_every_overlapping_key_tile_and_the_budget():
    """Query tiles of 12 rows over key tiles of 8 (as 192 over 128): each video query tile overlaps two key
    tiles and keeps both, plus exactly ``keep`` video tiles in all; text rows stay dense."""
    lay, sel = _layout(), TileSelector(B)
    q, k = _qk(5)
    rows = 12
    keep = sel.keep_count(lay, 0.3, rows)
    assert keep == 3
    lists = sel.select(q, k, lay, 0.3, rows)
    assert (lists.block_m, lists.block_n) == (rows, B)
    n_m = -(-lay.length // rows)
    assert lists.kv_count.shape == (1, 4, n_m)
    for m in range(n_m):
        first, last = m * rows, (m + 1) * rows - 1
        video = last < 10 * B
        for h in range(4):
            chosen = lists.kv_index[0, h, m, : lists.kv_count[0, h, m]].tolist()
            assert chosen == sorted(set(chosen)) and 12 not in chosen  # ascending; padding tile dropped
            if video:
                assert first // B in chosen and last // B in chosen  # both overlapped key tiles
                assert sum(t < 10 for t in chosen) == keep and 10 in chosen and 11 in chosen
            else:
                assert chosen == list(range(12))
    # the lists mean what the token mask says: a video query token sees its own tile's keys
    mask = lists.token_mask(lay.length, lay.length)
    assert mask[0, :, torch.arange(80), torch.arange(80)].all()


def test_taller_query_tiles_never_keep_fewer_than_their_overlap():
    lay, sel = TokenLayout.video_then(96), TileSelector(8)  # 12 key tiles, 8 of 12 rows
    assert sel.keep_count(lay, 0.01) == 1 and sel.keep_count(lay, 0.01, 12) == 2


@pytest.mark.slow  # the kernels interpreted over three layouts: 5-15 s per height
@pytest.mark.parametrize("rows", [12, 24])
def test_the_triton_kernels_give_the_torch_paths_lists_for_taller_query_tiles(rows):
    pytest.importorskip("triton")
    for n, lay in enumerate(_layouts()):
        g = torch.Generator().manual_seed(10 + n)
        q = torch.randn(1, lay.length, 4, 16, generator=g).transpose(1, 2)
        k = torch.randn(1, 2, lay.length, 16, generator=g)
        want = TileSelector(B, kernels=False).select(q, k, lay, 0.4, rows)
        got = TileSelector(B, kernels=True).select(q, k, lay, 0.4, rows)
        assert torch.equal(got.kv_count, want.kv_count)
        used = torch.arange(got.kv_index.shape[-1]) < got.kv_count[..., None]
        assert torch.equal(torch.where(used, got.kv_index, -1), torch.where(used, want.kv_index, -1)), lay


def test_pooling_kernel_takes_tiles_of_any_height():
    pytest.importorskip("triton")
    from ditgate.kernels.tile_select import pool_tiles
    from ditgate.sparse.selector import _pool

    x = torch.randn(2, 37, 3, 16).transpose(1, 2)
    assert torch.allclose(pool_tiles(x, 12), _pool(x, 12, 4), atol=1e-6)  # 3 whole tiles and one of 1 row


def test_refined_lists_mean_the_same_tokens():
    lay, sel = _layout(), TileSelector(B)
    q, k = _qk(8)
    lists = sel.select(q, k, lay, 0.3, 24)
    fine = lists.refine_queries(3, lay.length)
    assert (fine.block_m, fine.block_n) == (8, B)
    assert torch.equal(fine.token_mask(lay.length, lay.length), lists.token_mask(lay.length, lay.length))
    with pytest.raises(ValueError, match="split"):
        lists.refine_queries(5, lay.length)


def test_the_sparse_form_serves_taller_lists_as_the_expanded_mask():
    """block_sparse (the Triton kernel, interpreted) on 48 x 32 lists: split into 16 x 32 blocks."""
    from ditgate.forms import AttentionInputs, create_forms

    lay, sel = TokenLayout.video_then(224, (("text", 32),)), TileSelector(32)
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, 256, 64, generator=g).to(torch.float16) for _ in range(3))
    lists = sel.select(q, k, lay, 0.3, 48)
    assert lists.block_m == 48
    form = create_forms(["block_sparse"])["block_sparse"]
    if not form.availability().available:
        pytest.skip(form.availability().reason)
    out = form.run(AttentionInputs(q, k, v, attn_mask=lists)).double()
    mask = lists.token_mask(256, 256)
    s = (q.double() @ k.double().transpose(-1, -2) / 8).masked_fill(~mask, float("-inf"))
    ref = torch.softmax(s, -1) @ v.double()
    dense = torch.softmax(q.double() @ k.double().transpose(-1, -2) / 8, -1) @ v.double()
    err = ((out - ref).norm() / ref.norm()).item()
    assert err < 1e-2 and ((out - dense).norm() / dense.norm()).item() > 10 * err


def test_sparse_forms_keep_square_tiles_off_hopper():
    from ditgate.forms import create_forms
    from ditgate.forms.base import describe_call

    q = torch.randn(1, 2, 256, 64, dtype=torch.float16)
    call = describe_call(q, q, q, None, 0.0, False, False, None)
    for name, form in create_forms(["block_sparse", "fp8_sparse", "flex_sparse"]).items():
        assert form.selection_rows(call, 128) is None, name


def test_counts_per_batch_and_head_are_made_once_per_shape():
    """The per-tile counts come from a cache keyed by shape: a batch of two gets its own [2, H, tiles],
    each batch element's lists the same as its own call's, and a repeat call reuses the tensor."""
    lay, sel = _layout(), TileSelector(B, kernels=False)
    q1, k1 = _qk(21)
    q2, k2 = _qk(22)
    both = sel.select(torch.cat([q1, q2]), torch.cat([k1, k2]), lay, 0.3)
    assert both.kv_count.shape == (2, 4, 13)
    for b, (q, k) in enumerate(((q1, k1), (q2, k2))):
        alone = sel.select(q, k, lay, 0.3)
        assert torch.equal(both.kv_count[b], alone.kv_count[0])
        used = torch.arange(alone.kv_index.shape[-1]) < alone.kv_count[0][..., None]
        assert torch.equal(both.kv_index[b][used], alone.kv_index[0][used])
    assert sel.select(torch.cat([q2, q1]), torch.cat([k2, k1]), lay, 0.3).kv_count is both.kv_count
    assert (both.kv_count[:, :, :10] == sel.keep_count(lay, 0.3) + 2).all()  # video rows: keep + 2 text tiles
