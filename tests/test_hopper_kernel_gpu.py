"""The warp-specialized Hopper schedule (``ditgate.kernels.hopper_attention``) on a Hopper GPU: outputs against a
float64 reference, the block-sparse lists against the expanded mask, all blocks listed against dense bit for bit, and
a row with an empty list giving zeros (``test_hopper_kernel`` checks what a CPU can: the compiled code)."""


import pytest
import torch

triton = pytest.importorskip("triton")

from ditgate.kernels import hopper_attention as ha  # noqa: E402

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
# sqrt(2 (1 - cosine)) plus margin, of the cosines to exact attention on an H200 at LTX's shape (FP8 0.99840, INT8
# 0.99907: P's bytes from FMAs, ``hopper_softmax._byte_p``)
REL_L2 = {"fp8": 0.07, "int8": 0.055, "plain": 0.01}


gpu = pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")


def _qkv(B, H, HK, SQ, SK, D, seed, layout="bshd"):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def make(heads, s):
        if layout == "bshd":
            return torch.randn(B, s, heads, D, device="cuda", generator=g).bfloat16().transpose(1, 2)
        return torch.randn(B, heads, s, D, device="cuda", generator=g).bfloat16()

    return make(H, SQ), make(HK, SK), make(HK, SK)


def _reference(q, k, v, mask=None):
    q, k, v = (t.double() for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1).nan_to_num(0.0) @ v


def _rel(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def _random_lists(B, H, S, rows, seed, seq_k=None):
    """Random ascending key-block lists (128-key blocks) per ``rows``-row query block, about 40 % of the blocks:
    the partial tail block always visited (last, masked), the second query block of (0, 0) empty (zeros).
    ``seq_k``: keys, by default as many as queries. Returns (index, count, the token-level mask the lists stand
    for)."""
    seq_k = seq_k or S
    n_m, n = -(-S // rows), -(-seq_k // 128)
    keep = torch.rand(B, H, n_m, n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed)) < 0.4
    keep[..., -1] = True
    keep[0, 0, 1] = False
    count = keep.sum(-1).to(torch.int32)
    index = torch.where(keep, torch.arange(n, device="cuda"), n).sort(-1).values.clamp_max(n - 1).to(torch.int32)
    return index, count, keep.repeat_interleave(rows, 2).repeat_interleave(128, 3)[:, :, :S, :seq_k]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("qk", ["plain", "fp8", "int8"])
@pytest.mark.parametrize("shape", [(1, 4, 4, 1000, 1000, 128), (2, 4, 2, 300, 77, 64), (1, 2, 1, 256, 384, 128)],
                         ids=["odd", "gqa-cross", "even"])
def test_matches_reference(shape, qk, layout):
    q, k, v = _qkv(*shape, seed=sum(shape), layout=layout)
    out = torch.full_like(q, float("nan"))
    ha.hopper_attention(q, k, v, qk=qk, out=out)
    assert torch.isfinite(out).all()  # every row written
    assert _rel(out, _reference(q, k, v)) < REL_L2[qk]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("qk", ["plain", "fp8", "int8"])
@pytest.mark.parametrize("shape", [(1, 4, 4, 1000, 1000, 64), (2, 4, 2, 300, 77, 64), (1, 2, 1, 200, 384, 64)],
                         ids=["self", "cross-gqa", "short-q"])
def test_three_warpgroups_match_reference(shape, qk, layout):
    """192 query rows per program: the last program's third (or second and third) warpgroup may hold no
    rows at all (300 = 192 + 108), and its Q scale lies past the last one (read masked)."""
    q, k, v = _qkv(*shape, seed=sum(shape) + 3, layout=layout)
    out = torch.full_like(q, float("nan"))
    ha.hopper_attention(q, k, v, qk=qk, out=out, groups=3)
    assert torch.isfinite(out).all()
    assert _rel(out, _reference(q, k, v)) < REL_L2[qk]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("groups", [2, 3], ids=["128-row-lists", "192-row-lists"])
@pytest.mark.parametrize("qk", ["plain", "fp8", "int8"])
def test_lists_equal_the_expanded_mask_and_all_blocks_equal_dense(qk, groups):
    """Lists per program: 128 query rows with two warpgroups, 192 with three (the selector's tall tiles).
    Every block listed gives dense attention's bits when both rescale the output every block (``lazy`` is on for
    some dense calls and not for their lists, and changes bits; the other options do not)."""
    B, H, S, D = 1, 2, 1000, 64
    rows = 64 * groups
    q, k, v = _qkv(B, H, H, S, S, D, seed=7)
    n_m, n = -(-S // rows), -(-S // 128)
    index, count, tokens = _random_lists(B, H, S, rows, seed=3)
    out = ha.hopper_attention(q, k, v, qk=qk, kv_index=index, kv_count=count, groups=groups)
    ref = _reference(q, k, v, tokens)
    assert _rel(out, ref) < REL_L2[qk]
    assert torch.equal(out[0, 0, rows:2 * rows], torch.zeros_like(out[0, 0, rows:2 * rows]))
    assert _rel(out, _reference(q, k, v)) > 0.05  # the selection changed the result
    every = torch.arange(n, device="cuda", dtype=torch.int32).expand(B, H, n_m, n).contiguous()
    listed = ha.hopper_attention(q, k, v, qk=qk, kv_index=every, kv_count=torch.full_like(count, n), groups=groups,
                                 lazy=False)
    assert torch.equal(listed, ha.hopper_attention(q, k, v, qk=qk, groups=groups, lazy=False))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("groups", [2, 3], ids=["128-row-lists", "192-row-lists"])
@pytest.mark.parametrize("qk", ["plain", "fp8", "int8"])
def test_lists_over_keys_that_end_before_the_queries(qk, groups):
    """What the sparse stage hands over for HunyuanVideo: the text padding's keys dropped, so 870 keys for 1000
    queries: ``serves`` lets such lists run here."""
    B, H, SQ, SK, D = 1, 2, 1000, 870, 64
    q, k, v = _qkv(B, H, H, SQ, SK, D, seed=11)
    index, count, tokens = _random_lists(B, H, SQ, 64 * groups, seed=5, seq_k=SK)
    out = ha.hopper_attention(q, k, v, qk=qk, kv_index=index, kv_count=count, groups=groups)
    assert torch.isfinite(out).all()
    assert _rel(out, _reference(q, k, v, tokens)) < REL_L2[qk]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("qk", ["plain", "fp8", "int8"])
def test_a_tree_of_maxima_changes_no_bit(qk):
    """The max is exact in any order, so ``tree_max`` on and off give the same bits: dense with two and
    three warpgroups, and over lists with an empty one."""
    q, k, v = _qkv(2, 4, 2, 300, 77, 64, seed=23)
    for groups in (2, 3):
        outs = [ha.hopper_attention(q, k, v, qk=qk, groups=groups, tree_max=tree) for tree in (False, True)]
        assert torch.equal(*outs)
    q, k, v = _qkv(1, 2, 2, 1000, 1000, 128, seed=29)
    n_m, n = 8, 8
    keep = torch.rand(1, 2, n_m, n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(6)) < 0.5
    keep[0, 1, 2] = False
    count = keep.sum(-1).to(torch.int32)
    index = torch.where(keep, torch.arange(n, device="cuda"), n).sort(-1).values.clamp_max(n - 1).to(torch.int32)
    outs = [ha.hopper_attention(q, k, v, qk=qk, kv_index=index, kv_count=count, tree_max=tree)
            for tree in (False, True)]
    assert torch.equal(*outs)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("D, groups", [(64, 2), (64, 3), (128, 2)])
def test_int8_row_max_over_the_integers_changes_no_bit(D, groups):
    """The integers' max times the step's scale is the floats' max minus the offset, exactly (both under 2^22), so
    ``int_max`` on and off give the same bits: dense with a masked tail block and with keys a multiple of the
    block, and over lists with an empty one (``_random_lists``)."""
    for sk in (1077, 1024):
        q, k, v = _qkv(2, 4, 2, 300, sk, D, seed=31)
        outs = [ha.hopper_attention(q, k, v, qk="int8", groups=groups, int_max=on) for on in (False, True)]
        assert torch.equal(*outs) and outs[0].isfinite().all()
    q, k, v = _qkv(1, 2, 2, 1000, 1000, D, seed=37)
    index, count, _ = _random_lists(1, 2, 1000, 64 * groups, seed=7)
    outs = [ha.hopper_attention(q, k, v, qk="int8", kv_index=index, kv_count=count, groups=groups, int_max=on)
            for on in (False, True)]
    assert torch.equal(*outs)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("qk", ["fp8", "int8"])
@pytest.mark.parametrize("D, groups", [(64, 2), (64, 3), (128, 2)],
                         ids=["d64-128-rows", "d64-192-rows", "d128-128-rows"])
def test_8bit_lists_at_both_head_dims_equal_the_expanded_mask_and_all_blocks_equal_dense(qk, D, groups):
    """The 8-bit modes (P's bytes from FMAs, their row sums from the tensor cores) over block lists: the expanded
    mask's attention, zeros for an empty list, and every block listed giving dense's bits."""
    B, H, S = 1, 2, 1000
    rows = 64 * groups
    q, k, v = _qkv(B, H, H, S, S, D, seed=41)
    n_m, n = -(-S // rows), -(-S // 128)
    index, count, tokens = _random_lists(B, H, S, rows, seed=8)
    out = ha.hopper_attention(q, k, v, qk=qk, kv_index=index, kv_count=count, groups=groups)
    assert _rel(out, _reference(q, k, v, tokens)) < REL_L2[qk]
    assert torch.equal(out[0, 0, rows:2 * rows], torch.zeros_like(out[0, 0, rows:2 * rows]))
    every = torch.arange(n, device="cuda", dtype=torch.int32).expand(B, H, n_m, n).contiguous()
    listed = ha.hopper_attention(q, k, v, qk=qk, kv_index=every, kv_count=torch.full_like(count, n), groups=groups,
                                 lazy=False)
    assert torch.equal(listed, ha.hopper_attention(q, k, v, qk=qk, groups=groups, lazy=False))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("qk", ["fp8", "int8"])
@pytest.mark.parametrize("D, groups", [(64, 3), (128, 2)], ids=["d64-192-rows", "d128-128-rows"])
def test_copies_made_with_the_selectors_sums_give_the_same_bits(qk, D, groups):
    """The copies a sparse form makes while pooling for the selector (``quantize_for_schedule(sums=True)``)
    are the ones the schedule would make: the same output bits over lists; copies for another launch refused."""
    B, H, S = 1, 2, 1000
    q, k, v = _qkv(B, H, H, S, S, D, seed=43)
    index, count, _ = _random_lists(B, H, S, 64 * groups, seed=9)
    kw = dict(qk=qk, kv_index=index, kv_count=count, groups=groups)
    made = ha.quantize_for_schedule(q, k, v, qk, D ** -0.5, sums=True)
    assert made.q_sums is not None
    assert torch.equal(ha.hopper_attention(q, k, v, prepared=made, **kw), ha.hopper_attention(q, k, v, **kw))
    with pytest.raises(ValueError, match="prepared copies"):
        ha.hopper_attention(q, k, v, prepared=ha.quantize_for_schedule(q, k, v, qk, 0.5), **kw)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("qk", ["plain", "fp8"])
@pytest.mark.parametrize("groups", [2, 3], ids=["128-row-lists", "192-row-lists"])
def test_lists_of_one_slot_and_junk_past_the_count(qk, groups):
    """Each partition reads its list's count, first and second slot at once (``_list_start``): lists one slot
    wide (no second slot to read) and slots past the count holding indices out of range must still give the
    expanded mask's attention, and zeros where the count is 0."""
    B, H, S, D = 1, 2, 1000, 64
    rows = 64 * groups
    q, k, v = _qkv(B, H, H, S, S, D, seed=47)
    n_m, n = -(-S // rows), -(-S // 128)
    g = torch.Generator(device="cuda").manual_seed(5)
    one = torch.randint(0, n, (B, H, n_m, 1), device="cuda", generator=g, dtype=torch.int32)
    count = (torch.rand(B, H, n_m, device="cuda", generator=g) < 0.7).to(torch.int32)
    count[0, 0, 0] = 0
    keep = torch.zeros(B, H, n_m, n, dtype=torch.bool, device="cuda").scatter_(3, one.long(), count[..., None] > 0)
    tokens = keep.repeat_interleave(rows, 2).repeat_interleave(128, 3)[:, :, :S, :S]
    out = ha.hopper_attention(q, k, v, qk=qk, kv_index=one, kv_count=count, groups=groups)
    assert _rel(out, _reference(q, k, v, tokens)) < REL_L2[qk]
    assert torch.equal(out[0, 0, :rows], torch.zeros_like(out[0, 0, :rows]))
    index, count, tokens = _random_lists(B, H, S, rows, seed=11)
    past = torch.arange(n, device="cuda") >= count[..., None]
    junk = torch.where(past, torch.full_like(index, 1 << 30), index)  # out of range wherever it is past the count
    out = ha.hopper_attention(q, k, v, qk=qk, kv_index=junk, kv_count=count, groups=groups)
    assert torch.equal(out, ha.hopper_attention(q, k, v, qk=qk, kv_index=index, kv_count=count, groups=groups))


def test_a_memo_without_its_workspace_is_refused():
    """Kept descriptors are keyed by address: over copies allocated afresh each call, every call would keep
    one more (and the memory under it), so ``memo`` comes only with the workspace's ``buffers``."""
    from ditgate.forms.workspace import WorkspacePool

    q = torch.randn(1, 2, 256, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="buffers"):
        ha.hopper_attention(q, q, q, qk="fp8", memo=WorkspacePool().memo)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("qk", ["fp8", "int8"])
def test_kept_descriptors_give_the_bits_of_fresh_ones(qk):
    """A form's workspace keeps the launch's descriptors and tile of ones between calls (``memo``). Calls at two
    shapes in turn, on fresh inputs each time, dense and with lists, must give what a launch that remakes them
    gives: a descriptor kept for one shape or buffer must never serve another."""
    from ditgate.forms.workspace import WorkspacePool

    pool = WorkspacePool()

    def buffers(shape, dtype, name):
        return pool.get(shape, dtype, torch.device("cuda"), name)

    for seed, S in enumerate((1000, 700, 1000, 700)):
        q, k, v = _qkv(1, 2, 2, S, S, 64, seed=60 + seed)
        fresh = ha.hopper_attention(q, k, v, qk=qk)
        assert torch.equal(ha.hopper_attention(q, k, v, qk=qk, buffers=buffers, memo=pool.memo), fresh)
        index, count, _ = _random_lists(1, 2, S, 128, seed=seed)
        fresh = ha.hopper_attention(q, k, v, qk=qk, kv_index=index, kv_count=count)
        kept = ha.hopper_attention(q, k, v, qk=qk, kv_index=index, kv_count=count, buffers=buffers, memo=pool.memo)
        assert torch.equal(kept, fresh)
    pool.release()
    q, k, v = _qkv(1, 2, 2, 1000, 1000, 64, seed=70)
    assert torch.equal(ha.hopper_attention(q, k, v, qk=qk, buffers=buffers, memo=pool.memo),
                       ha.hopper_attention(q, k, v, qk=qk))


@gpu
@pytest.mark.gpu
def test_refuses_what_it_cannot_read():
    q = torch.randn(1, 2, 256, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="storage"):
        ha.hopper_attention(q, q.transpose(2, 3).contiguous().transpose(2, 3), q, qk="plain")
    with pytest.raises(ValueError, match="head dim"):
        ha.hopper_attention(q[..., :32], q[..., :32], q[..., :32], qk="fp8")
    q = torch.randn(1, 2, 1000, 64, device="cuda", dtype=torch.bfloat16)
    lists = (torch.zeros(1, 2, 8, 8, dtype=torch.int32, device="cuda"),
             torch.ones(1, 2, 8, dtype=torch.int32, device="cuda"))  # per 128 query rows
    with pytest.raises(ValueError, match="192-row"):
        ha.hopper_attention(q, q, q, qk="plain", kv_index=lists[0], kv_count=lists[1], groups=3)
    with pytest.raises(ValueError, match="groups"):
        ha.hopper_attention(*(torch.randn(1, 2, 256, 128, device="cuda", dtype=torch.bfloat16),) * 3, groups=3)
    with pytest.raises(ValueError, match="plain mode only"):
        ha.hopper_attention(q, q, q, qk="fp8", kv_index=lists[0], kv_count=lists[1], pin=True)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("qk", ["fp8", "int8", "plain"])
@pytest.mark.parametrize("shape, groups", [((1, 4, 4, 1000, 1000, 128), 2), ((1, 4, 2, 1000, 1000, 64), 3),
                                           ((2, 4, 2, 300, 77, 64), 3)], ids=["d128", "d64-gqa-3", "cross-one-block"])
def test_lazy_rescale_matches_reference_while_the_max_keeps_rising(shape, groups, qk):
    """The output rescaled only where a row's max rose past ``LAZY_TAU`` (``lazy``; ``LAZY_TAU_PLAIN`` in plain
    mode), on keys whose scale grows along the sequence, so that the rows' maxima rise block after block, by more
    than the threshold or less (in plain mode the keys grow six-fold, so that some rows pass its 8 octaves):
    as near exact attention as the eager rescale, overall and row by row (the growing keys sharpen the softmax, and
    FP8's error with it: on the H200 0.0727 against eager's 0.0726 at head dim 128, 0.0766 against 0.0764 at 64).
    Over several key blocks not its bits (some rows kept an older reference); over one block within rounding of
    them (the first block always sets the max; INT8's shift may round apart). A warp that skipped a row needing
    its rescale would be off by 2^0.75 (2^8 in plain mode) or more on that row. In plain mode the lazy error may
    be a fifth larger than the eager one (0.0020 against 0.0017 on the H200): under the eager rescale each row's
    largest P is exactly 1, under the lazy one it is a power of two off its max, rounded to bf16 like the rest, and
    keys grown that much make the softmax sharp enough for that one value to show."""
    q, k, v = _qkv(*shape, seed=sum(shape) + 53)
    growth = 6.0 if qk == "plain" else 2.0
    k = k * torch.linspace(1.0, growth, k.shape[2], device="cuda", dtype=torch.bfloat16)[:, None]
    out = torch.full_like(q, float("nan"))
    ha.hopper_attention(q, k, v, qk=qk, out=out, groups=groups, lazy=True)
    assert torch.isfinite(out).all()
    ref = _reference(q, k, v)
    eager = ha.hopper_attention(q, k, v, qk=qk, groups=groups, lazy=False)
    assert _rel(eager, ref) < 1.5 * REL_L2[qk]
    assert _rel(out, ref) < (1.3 if qk == "plain" else 1.02) * _rel(eager, ref), (_rel(out, ref), _rel(eager, ref))
    row_err = ((out.double() - ref).norm(dim=-1) / ref.norm(dim=-1)).max().item()
    eager_row_err = ((eager.double() - ref).norm(dim=-1) / ref.norm(dim=-1)).max().item()
    assert row_err < 1.5 * eager_row_err + 0.01, (row_err, eager_row_err)
    if k.shape[2] <= ha.ROWS_K:
        assert _rel(out, eager.double()) < 1e-2
    else:
        assert not torch.equal(out, eager)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("qk", ["fp8", "plain"])
@pytest.mark.parametrize("D, groups", [(64, 3), (128, 2)], ids=["d64-192-rows", "d128-128-rows"])
def test_lazy_rescale_over_lists_equals_the_expanded_mask_and_all_blocks_equal_dense(D, groups, qk):
    B, H, S = 1, 2, 1000
    rows = 64 * groups
    q, k, v = _qkv(B, H, H, S, S, D, seed=59)
    n_m, n = -(-S // rows), -(-S // 128)
    index, count, tokens = _random_lists(B, H, S, rows, seed=9)
    out = ha.hopper_attention(q, k, v, qk=qk, kv_index=index, kv_count=count, groups=groups, lazy=True)
    assert _rel(out, _reference(q, k, v, tokens)) < REL_L2[qk]
    assert torch.equal(out[0, 0, rows:2 * rows], torch.zeros_like(out[0, 0, rows:2 * rows]))
    every = torch.arange(n, device="cuda", dtype=torch.int32).expand(B, H, n_m, n).contiguous()
    listed = ha.hopper_attention(q, k, v, qk=qk, kv_index=every, kv_count=torch.full_like(count, n), groups=groups,
                                 lazy=True)
    assert torch.equal(listed, ha.hopper_attention(q, k, v, qk=qk, groups=groups, lazy=True))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("groups", [2, 3])
def test_plain_outputs_gathered_for_wide_stores_change_no_bit(groups):
    """Plain mode's output channels gathered per thread before the store (``gather_out``: one 16-byte store of
    eight neighbouring channels where the accumulator's order allows four bytes) give the same bits, dense with a
    masked tail block and a short last query block, and over lists with an empty one; an output whose rows are
    off 16 bytes is refused."""
    q, k, v = _qkv(1, 2, 2, 1000, 1000, 64, seed=61)
    outs = [ha.hopper_attention(q, k, v, qk="plain", groups=groups, gather_out=on) for on in (False, True)]
    assert torch.isfinite(outs[1]).all() and torch.equal(outs[0], outs[1])
    index, count, _ = _random_lists(1, 2, 1000, 64 * groups, seed=13)
    outs = [ha.hopper_attention(q, k, v, qk="plain", kv_index=index, kv_count=count, groups=groups, gather_out=on)
            for on in (False, True)]
    assert torch.equal(outs[0], outs[1])
    off = torch.empty(1, 1000, 2, 68, dtype=q.dtype, device="cuda")[..., 4:].transpose(1, 2)
    with pytest.raises(ValueError, match="16 bytes"):
        ha.hopper_attention(q, k, v, qk="plain", groups=groups, gather_out=True, out=off)
