"""The warp-specialized Hopper schedule (``ditgate.kernels.hopper_attention``).

On any machine: every mode and head dim compiles for sm_90 through Triton's own ptxas, with no register
spills and within Hopper's shared memory (Gluon has no CPU interpreter, so this is what a CPU can check), and the
host-side layouts and launch options. Its outputs on a Hopper GPU: ``test_hopper_kernel_gpu``.
"""

import functools
import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch

triton = pytest.importorskip("triton")

from ditgate.kernels import hopper_attention as ha  # noqa: E402
from ditgate.kernels.hopper_compile import HOPPER_SMEM  # noqa: E402



@functools.lru_cache(maxsize=1)  # one compile of every variant serves the tests that read the reports
def _compile_reports():
    """Compiled in a child process without TRITON_INTERPRET (which conftest sets for the Triton tests),
    with a fresh cache, so each run really compiles."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory() as cache:
        env["TRITON_CACHE_DIR"] = cache
        run = subprocess.run([sys.executable, "-m", "ditgate.kernels.hopper_compile"], capture_output=True, text=True,
                             env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_every_variant_compiles_for_hopper_without_spills():
    reports = _compile_reports()
    assert {(r["qk"], r["head_dim"], r["sparse"], r["groups"]) for r in reports if r["aligned_out"]} == {
        (qk, d, s, 2) for qk in ("plain", "fp8", "int8") for d in (64, 128) for s in (False, True)} | {
        (qk, 64, s, 3) for qk in ("plain", "fp8", "int8") for s in (False, True)}
    assert [(r["qk"], r["head_dim"], r["groups"]) for r in reports if not r["aligned_out"]] == [("fp8", 64, 3)]
    for r in reports:
        assert r["wgmma"] > 0 and r["setmaxnreg"] > 0, r  # tensor-core products; per-partition registers
        assert r["shared_bytes"] <= HOPPER_SMEM and r["spill_bytes"] == 0, r
        assert not r["wgmma_serialized"], r  # ptxas keeps the products asynchronous


@pytest.mark.slow
def test_the_output_leaves_sixteen_bytes_at_a_time():
    """With V's channels in the accumulator's order, each consumer thread stores its 8 neighbouring channels of a row
    in one instruction: D / 16 per thread, one pair of rows per 16-byte store. Plain mode reads the host's V,
    whose channels stay as they are: where its output is gathered (``GATHERED``) the same, otherwise two channels
    (four bytes) at a time. Before, every channel was a store of its own (2 bytes: the partition's arguments carry
    no divisibility, so nothing told the compiler that the rows start on 16 bytes)."""
    rows_per_thread = 2  # Hopper's accumulator layout: rows r and r + 8 of each warp's 16
    assert ("plain", 64, 192) in ha.GATHERED
    for r in _compile_reports():  # each consumer warpgroup's stores are in its own copy of the epilogue
        where = (r["qk"], r["head_dim"], 64 * r["groups"] if r["sparse"] else None)
        if not r["aligned_out"]:  # rows off 16 bytes: nothing wider than one value may be assumed
            assert r["wide_stores"] == 0 and r["narrow_stores"] == r["head_dim"] // 2 * r["groups"], r
        elif r["qk"] == "plain" and where not in ha.GATHERED:
            assert r["wide_stores"] == 0 and r["narrow_stores"] == rows_per_thread * r["head_dim"] // 8 * r["groups"], r
        else:
            assert r["narrow_stores"] == 0 and r["wide_stores"] == rows_per_thread * r["head_dim"] // 32 * r["groups"], r


def _loop_shapes(mode: str) -> list[dict]:
    """``python -m ditgate.kernels.hopper_compile MODE``'s steady-state steps (``LoopShape``), compiled in a
    child process without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "ditgate.kernels.hopper_compile", mode], capture_output=True,
                         text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_pin_keeps_the_exp2s_above_the_pv_wait():
    """Where ptxas puts the wait for P·V in plain mode over 192-row lists (pinned by default, ``PINNED``):
    unpinned, before the first exp2 (ptxas fills a shuffle's latency with it); pinned, after the last, so
    the softmax runs while P·V is on the tensor cores. If ptxas stops hoisting the wait, the first
    assertion says the pin is no longer needed."""
    shapes = {shape["pin"]: shape for shape in _loop_shapes("--pin")}
    last_wait = {pin: max(pos for pos, left in shape["waits"] if left == 0) for pin, shape in shapes.items()}
    assert last_wait[False] < shapes[False]["first_exp2"], shapes[False]
    assert last_wait[True] > shapes[True]["last_exp2"], shapes[True]
    assert ("plain", 64, 192) in ha.PINNED


@pytest.mark.slow
def test_a_tree_of_maxima_shortens_the_chain_before_the_exp2s():
    """Each row's max as a tree (``tree_max``, on by default for plain mode at head dim 64, ``TREE_MAXED``):
    the longest chain of dependent maxima in the step drops from one per column a thread holds (32, plus
    the shuffles' step) to the tree's depth, in the same number of instructions."""
    shapes = _loop_shapes("--tree-max")
    for chain, tree in zip(shapes[::2], shapes[1::2]):
        assert not chain["tree_max"] and tree["tree_max"] and chain["qk"] == tree["qk"]
        assert chain["max_chain"] >= 31 and tree["max_chain"] <= 8, (chain, tree)
        assert abs(chain["instructions"] - tree["instructions"]) <= 8 and tree["spill_bytes"] == 0, (chain, tree)
    assert ("plain", 64, None) in ha.TREE_MAXED


def test_an_e4m3_byte_read_as_a_number_is_eight_times_its_log2_plus_seven():
    """What P's bytes rest on (``hopper_softmax._byte_p``): every normal e4m3 byte X (8 to 126, 0x7F is NaN)
    holds 2^(X / 8 - 7) times a factor in [1, 1.0617] (the mantissa linear between powers of two instead of
    exponential), so X = round(8 (x + 15)) stands for 2^(x + 8) within that factor; the byte at the row max,
    ``BYTE_TOP``, is finite with room below e4m3's largest value."""
    bytes_ = torch.arange(8, 127, dtype=torch.uint8)
    value = bytes_.view(torch.float8_e4m3fn).double()
    ratio = value / 2.0 ** (bytes_.double() / 8 - 7)
    assert ratio.min().item() == 1.0 and ratio.max().item() < 1.0617
    top = torch.tensor([int(ha.BYTE_TOP.value)], dtype=torch.uint8).view(torch.float8_e4m3fn).double().item()
    assert top == 256.0 and top < 448.0


@pytest.mark.slow
def test_the_lazy_rescale_puts_the_outputs_multiplies_behind_one_vote():
    """With ``lazy``, each consumer's step holds the output's rescale (one multiply per accumulator value: 32 at
    head dim 64, 64 at 128) behind a warp vote and a branch it can jump, with one vote per 32 values; the body
    grows by at most a few instructions per row (the threshold's compare and select) and spills nothing; in the 8-bit
    modes and in plain mode. In the 8-bit modes, eager or lazy, the body keeps two exp2s per thread (alpha, one per
    row it holds): P's bytes come from FMAs (``hopper_softmax._byte_p``); plain mode's P takes 64 more."""
    shapes = _loop_shapes("--lazy")
    assert {s["qk"] for s in shapes} == {"fp8", "int8", "plain"}
    for eager, lazy in zip(shapes[::2], shapes[1::2]):
        assert not eager["lazy"] and lazy["lazy"] and eager["qk"] == lazy["qk"]
        assert eager["skippable_multiplies"] == 0, eager
        assert lazy["skippable_multiplies"] == lazy["head_dim"] // 2, lazy
        assert lazy["spill_bytes"] == 0, lazy
        for shape in (eager, lazy):
            assert shape["exp2s"] == (66 if shape["qk"] == "plain" else 2), shape
        assert lazy["loop_instructions"] <= eager["loop_instructions"] + 16, (eager, lazy)


@pytest.mark.slow
def test_int8_row_max_over_the_integers_takes_the_float_chain_out_of_the_step():
    """INT8's row max over the integer products (``int_max``, on by default for dense INT8, ``INT_MAXED``): ptxas
    makes it three-input integer maxima, so the chain of float maxima leaves the step, the loop's body shrinks by at
    least 20 instructions at both head dims, and nothing spills."""
    shapes = _loop_shapes("--int-max")
    for floats, ints in zip(shapes[::2], shapes[1::2]):
        assert not floats["int_max"] and ints["int_max"] and floats["head_dim"] == ints["head_dim"]
        assert floats["max_chain"] >= 31 and ints["max_chain"] <= 2 and ints["integer_maxima"] >= 30, (floats, ints)
        assert ints["spill_bytes"] == 0 and ints["loop_instructions"] <= floats["loop_instructions"] - 20, (floats, ints)
    assert ("int8", 64, None) in ha.INT_MAXED and ("int8", 128, None) in ha.INT_MAXED


def test_launch_options_default_per_mode_and_are_checked():
    """What ``plan_launch`` decides when the call leaves the schedule's options alone, on CPU tensors: each option
    on exactly where ``hopper_config`` says the call gains from it; the tile of ones exists only in the 8-bit modes,
    whose row sums are the tensor cores' (V's descriptor stands in, never read, so no call allocates it for
    nothing); an option the call's mode cannot take is refused."""
    from ditgate.kernels.hopper_compile import host_launch

    tables = {"PIN": ha.PINNED, "TREE_MAX": ha.TREE_MAXED, "LAZY": ha.LAZY_RESCALED, "INT_MAX": ha.INT_MAXED,
              "GATHER_O": ha.GATHERED}
    for qk in ("plain", "fp8", "int8"):
        for d, groups, sparse in ((64, 3, False), (64, 3, True), (64, 2, True), (128, 2, False), (128, 2, True)):
            launch = host_launch(qk, d, sparse, groups)
            where = (qk, d, 64 * groups if sparse else None)
            assert {flag for flag, table in tables.items() if launch.flags[flag]} == {
                flag for flag, table in tables.items() if where in table}, where
            assert launch.flags["QUANT"] == (qk != "plain")
            ones, v = launch.args[3], launch.args[2]
            assert (ones is not v and ones.base.shape == (8, ha.ROWS_K)) if qk != "plain" else ones is v
    assert host_launch("plain", 64, True, 3, lazy=True).flags["LAZY"]  # plain P has 8 octaves of headroom
    assert host_launch("int8", 128, False, 2, lazy=True).flags["LAZY"]
    assert host_launch("plain", 64, False, 3, gather_out=True).flags["GATHER_O"]
    assert not host_launch("plain", 64, True, 3, pin=False).flags["PIN"]
    with pytest.raises(ValueError, match="plain mode only"):  # the 8-bit modes' row sums are the tensor cores'
        host_launch("fp8", 64, True, 3, pin=True)
    with pytest.raises(ValueError, match="INT8"):  # the integer max needs integer products
        host_launch("fp8", 64, False, 3, int_max=True)
    for qk, d in (("plain", 128), ("fp8", 64)):  # no room beside three stages; V's own order serves the 8-bit modes
        with pytest.raises(ValueError, match="gather_out"):
            host_launch(qk, d, False, 2, gather_out=True)
    with pytest.raises(ValueError, match="16 bytes"):
        host_launch("plain", 64, False, 3, gather_out=True, aligned_out=False)


@pytest.mark.slow
def test_fp8_p_reaches_its_product_without_moving_between_threads():
    """The FP8 P·V operand is built in each thread's own registers (keys reordered, V stored to match):
    no more warp shuffles than the bf16 mode, where the accumulator layout already is the operand's."""
    reports = {(r["qk"], r["head_dim"], r["sparse"]): r["shuffles"] for r in _compile_reports()}
    for (qk, d, sparse), shuffles in reports.items():
        assert shuffles <= reports[("plain", d, sparse)], (qk, d, sparse, shuffles)


def _stored_order(n):
    """The key at each position of P after the kernel's reorder (``_as_operand``: reshape to
    [n/32, 2, 2, 4, 2], swap the two middle axes of four and two, flatten), worked out on indices."""
    return torch.arange(n).reshape(n // 32, 2, 2, 4, 2).permute(0, 1, 3, 2, 4).reshape(n)


def test_the_reordered_p_times_the_reordered_v_is_the_product():
    """P reordered as the kernel does it, against V stored in the same order, in float64: the same P·V,
    and a different one if only P moved."""
    g = torch.Generator().manual_seed(5)
    p, v = torch.rand(64, 128, generator=g, dtype=torch.float64), torch.randn(128, 32, generator=g, dtype=torch.float64)
    p_reordered = p.reshape(64, 4, 2, 2, 4, 2).permute(0, 1, 2, 4, 3, 5).reshape(64, 128)
    assert torch.equal(p_reordered, p[:, _stored_order(128)])
    assert torch.allclose(p_reordered @ v[_stored_order(128)], p @ v)
    assert not torch.allclose(p_reordered @ v, p @ v)


def _output_channels(d):
    """The channel each column of the P·V accumulator holds where V's channels are ordered for the output
    (``_ordered_output``: reshape to [d/32, 4, 4, 2], swap the two axes of four, flatten), worked out on indices."""
    return torch.arange(d).reshape(d // 32, 4, 4, 2).permute(0, 2, 1, 3).reshape(d)


def test_the_ordered_channels_put_eight_neighbours_in_each_thread():
    """Column 32a + 8b + 2c + e of the accumulator belongs to thread c of its row's quad (Hopper's layout: columns
    2c, 2c + 1 of every group of eight); with V's channels ordered, thread c's columns hold channels 32a + 8c to
    32a + 8c + 7, and the order is its own inverse."""
    for d in (64, 128):
        order = _output_channels(d)
        assert torch.equal(order[order], torch.arange(d))
        for c in range(4):
            mine = torch.tensor([j for j in range(d) if (j % 8) // 2 == c])
            held = order[mine].sort().values.reshape(-1, 8)
            assert torch.equal(held, held[:, :1] + torch.arange(8)) and torch.equal(held[:, 0] % 32, torch.full(
                (d // 32,), 8 * c)), (d, c, held)


@pytest.mark.parametrize("d", [64, 128])
def test_quantize_stores_v_in_the_p_order(d):
    """The Hopper schedule's copy of V: its keys in P's order, its channels in the output's."""
    from ditgate.kernels.quant_attention import KernelConfig, quantize

    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("checked under the interpreter; the GPU tests check the whole kernel")
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 2, 200, d, generator=g, dtype=torch.float16) for _ in range(3))
    cfg = KernelConfig(128, 128, 4, 1)
    plain = quantize(q, k, v, "fp8", 0.125, cfg)
    reordered = quantize(q, k, v, "fp8", 0.125, cfg, permute_v=True)
    assert reordered.sk_pad == plain.sk_pad == 256
    in_p_order = plain.vt.view(torch.uint8)[..., _stored_order(256)]
    assert torch.equal(reordered.vt.view(torch.uint8), in_p_order[:, _output_channels(d)])
    assert not torch.equal(reordered.vt.view(torch.uint8), in_p_order)
    assert torch.equal(reordered.v_scale, plain.v_scale) and torch.equal(reordered.k.view(torch.uint8),
                                                                          plain.k.view(torch.uint8))


@pytest.mark.parametrize("groups", [2, 3])
def test_launch_geometry_per_warpgroup_count(groups):
    """Host side of 64-row Q slots: programs of 64·groups rows, Q read as 64-row boxes, one Q scale per 64
    rows (the kernel masks the scales past the last: 300 rows have 5, three warpgroups ask for up to 6)."""
    B, H, S, D = 1, 2, 300, 64
    q, k, v = (torch.randn(B, S, H, D, dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    qz = ha.quantize(q, k, v, "fp8", D ** -0.5, ha.KernelConfig(ha.ROWS_HALF, ha.ROWS_K), permute_v=True)
    launch = ha.plan_launch(q, k, v, "fp8", D ** -0.5, torch.empty_like(q), qz, groups=groups)
    args = dict(zip(ha._hopper_attn_kernel.arg_names, launch.args))
    assert launch.grid == (-(-S // (64 * groups)), B * H) and args["n_m"] == launch.grid[0]
    assert args["n_qs"] == qz.q_scale.shape[1] == 5
    assert list(args["q_desc"].block_shape) == [64, D]
    assert launch.flags["GROUPS"] == groups and launch.flags["STAGES"] == ha.default_stages(D, "fp8", groups)


def test_host_layouts():
    bshd = torch.empty(2, 50, 3, 64, dtype=torch.bfloat16).transpose(1, 2)
    view = ha.host_layout(bshd)
    assert (view.rb, view.rh, view.ch) == (50, 0, 64) and view.matrix.shape == (100, 192)
    bhsd = torch.empty(2, 3, 50, 64, dtype=torch.bfloat16)
    view = ha.host_layout(bhsd)
    assert (view.rb, view.rh, view.ch) == (150, 50, 0) and view.matrix.shape == (300, 64)
    assert ha.host_layout(bhsd.transpose(2, 3)) is None  # head dim not innermost
    assert ha.host_layout(torch.empty(2, 3, 50, 68, dtype=torch.bfloat16)[..., :64]) is None  # 136-byte rows
    # a fused projection's chunk: rows 3·H·D apart, each head D wide
    qkv = torch.empty(2, 50, 3 * 3 * 64, dtype=torch.bfloat16)
    v = qkv[..., 2 * 192:].view(2, 50, 3, 64).transpose(1, 2)
    view = ha.host_layout(v)
    assert (view.rb, view.rh, view.ch) == (50, 0, 64) and view.matrix.stride() == (576, 1)
    assert view.matrix.data_ptr() == v.data_ptr()


def test_rows_aligned_says_whether_16_byte_stores_may_write_the_output():
    """The forms' outputs ([B, S, H, D] storage, D innermost) may take 16 bytes at a time (``O_ALIGNED``); an output
    whose rows start 8 bytes into 16, or whose head dim is not innermost, may not (the compile report's unaligned
    launch then stores one value at a time: ``test_the_output_leaves_sixteen_bytes_at_a_time``)."""
    q = torch.empty(1, 300, 2, 64, dtype=torch.bfloat16).transpose(1, 2)
    assert ha.rows_aligned(q) and ha.rows_aligned(torch.empty(1, 2, 300, 64, dtype=torch.bfloat16))
    offset = torch.empty(1, 300, 2, 68, dtype=torch.bfloat16)[..., 4:].transpose(1, 2)  # rows 8 bytes into 16
    assert not ha.rows_aligned(offset)
    assert not ha.rows_aligned(torch.empty(1, 2, 64, 300, dtype=torch.bfloat16).transpose(2, 3))


def test_stages_fit_beside_q():
    for D, qk, groups in [(64, "plain", 2), (128, "plain", 2), (64, "fp8", 2), (128, "fp8", 2), (64, "plain", 3),
                          (64, "fp8", 3)]:
        elem = 2 if qk == "plain" else 1
        stages = ha.default_stages(D, qk, groups)
        q_rows = 64 * (4 if groups == 3 else 2)  # Q's slots: a power of two of 64-row slots
        assert stages >= 2 and (stages * 2 * 128 + q_rows) * D * elem <= HOPPER_SMEM
