"""Static tile patterns: the window keeps the selector's count, the radial pattern thins with frame distance."""

import pytest
import torch

from ditgate.kernels.lists import KeyBlockLists
from ditgate.sparse.layout import TokenLayout
from ditgate.sparse.patterns import pattern_density, radial_pattern, static_pattern, window_pattern
from ditgate.sparse.selector import TileSelector

BLOCK = 16
VIDEO = TokenLayout.of(("video", 8 * 8 * 8), grid=(8, 8, 8))  # 8 frames of 8x8: 4 tiles per frame
JOINT = TokenLayout.of(("text", 32), ("image", 16 * 16), ("padding", 32), grid=(1, 16, 16))


@pytest.mark.parametrize("budget", [0.5, 0.3, 0.15])
def test_the_window_keeps_the_selectors_count_nearest_first(budget):
    keep = TileSelector(BLOCK).keep_count(VIDEO, budget)
    tiles = window_pattern(VIDEO, BLOCK, keep)
    assert torch.all(tiles.sum(1) == keep) and torch.all(tiles.diagonal())
    # per query tile, nothing dropped is nearer (box metric over tile centres, time and space by the grid)
    f, y = torch.arange(32) // 4 / 8, (torch.arange(32) % 4 * 2 + 0.5) / 8
    dist = torch.maximum((f[:, None] - f[None, :]).abs(), (y[:, None] - y[None, :]).abs())
    for row in (0, 13, 31):
        assert dist[row][tiles[row]].max() <= dist[row][~tiles[row]].min() + 1e-9


def test_the_radial_pattern_meets_the_budget_and_thins_with_frame_distance():
    tiles = radial_pattern(VIDEO, BLOCK, 0.3)
    assert pattern_density(tiles, VIDEO, BLOCK) <= 0.3 + 1e-9
    frames = torch.arange(32) // 4
    per_distance = [tiles[frames == 0][:, frames == d].float().mean().item() for d in range(8)]
    assert per_distance[0] >= per_distance[1] >= per_distance[3] >= per_distance[7]
    assert per_distance[0] > per_distance[7]


@pytest.mark.parametrize("name", ["window", "radial"])
def test_static_patterns_keep_text_dense_and_drop_padding(name):
    tiles = static_pattern(name, JOINT, BLOCK, 0.3, TileSelector(BLOCK).keep_count(JOINT, 0.3))
    text_tiles, pad_tiles = slice(0, 2), slice(18, 20)
    assert tiles[text_tiles, :18].all()  # text rows attend every non-padding tile
    assert tiles[:, text_tiles].all()  # every query visits the text columns
    assert not tiles[:, pad_tiles].any()
    assert pattern_density(tiles, JOINT, BLOCK) < 0.6


def test_lists_from_a_tile_mask_mean_the_same_tiles():
    tiles = window_pattern(VIDEO, BLOCK, 5)
    lists = KeyBlockLists.from_tile_mask(tiles, 2, 3, BLOCK)
    mask = lists.token_mask(VIDEO.length, VIDEO.length)
    assert mask.shape == (2, 3, 512, 512)
    assert torch.equal(mask[1, 2, ::BLOCK, ::BLOCK], tiles)
    rows = lists.kv_index[0, 0]
    for r, c in zip(rows, lists.kv_count[0, 0]):
        assert torch.all(r[:c][1:] > r[:c][:-1])  # ascending, as the kernel wants


def test_a_pattern_without_a_grid_is_refused():
    with pytest.raises(ValueError, match="grid"):
        window_pattern(TokenLayout.of(("video", 64)), BLOCK, 2)


def test_merging_query_blocks_visits_the_union_of_their_keys():
    g = torch.Generator().manual_seed(0)
    blocks = torch.rand(1, 2, 5, 6, generator=g) < 0.4
    fine = KeyBlockLists.from_block_mask(blocks, 16, 16)
    coarse = fine.coarsen_queries(2, seq_q=80, seq_k=96)
    assert coarse.block_m == 32 and coarse.kv_count.shape == (1, 2, 3)
    want = torch.nn.functional.pad(blocks, (0, 0, 0, 1)).view(1, 2, 3, 2, 6).any(3)
    assert torch.equal(coarse.tile_mask(96), want)
    assert torch.all(coarse.token_mask(80, 96) >= fine.token_mask(80, 96))  # a superset, token by token


@pytest.mark.parametrize("name", ["window", "radial"])
def test_static_patterns_over_taller_query_tiles(name):
    """24-row query tiles over 16-row key tiles: every video query tile keeps the key tiles it overlaps;
    the window keeps the selector's count, the radial pattern stays within the budget."""
    rows = 24
    keep = TileSelector(BLOCK).keep_count(VIDEO, 0.3, rows)
    tiles = static_pattern(name, VIDEO, BLOCK, 0.3, keep, rows)
    n_m, n = -(-VIDEO.length // rows), VIDEO.length // BLOCK
    assert tiles.shape == (n_m, n)
    for m in range(n_m):
        first, last = m * rows, min((m + 1) * rows, VIDEO.length) - 1
        assert tiles[m, first // BLOCK] and tiles[m, last // BLOCK]
    if name == "window":
        assert torch.all(tiles.sum(1) == keep)
    else:
        assert pattern_density(tiles, VIDEO, BLOCK, rows) <= 0.3 + 1e-9
    lists = KeyBlockLists.from_tile_mask(tiles, 1, 2, rows, BLOCK)
    assert (lists.block_m, lists.block_n) == (rows, BLOCK)
    assert torch.equal(lists.tile_mask(VIDEO.length)[0, 1], tiles)
