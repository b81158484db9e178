"""ditgate's INT8/FP8 Triton attention against a float64 reference (TRITON_INTERPRET=1 on a CPU).

Bounds: the interpreter rounds float32 -> FP8 casts toward zero in places (seen here: a constant V gives
outputs 1-4 % low), so these CPU bounds are looser than the GPU's; on the GPU the benchmark measures
cosine at real shapes. Bounds per variant, relative L2 on random N(0, 1) inputs:
"""

import dataclasses
import zlib

import pytest
import torch

pytest.importorskip("triton")

from ditgate.kernels.quant_attention import KernelConfig, KeyBlockLists, quant_attention  # noqa: E402

REL_L2 = {"fp8": 0.15, "int8": 0.10, "plain": 0.01}
CFG = KernelConfig(32, 32, 4, 1)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# on a GPU the tile sizes the tensor cores take, with pointer and tensor-descriptor loads, are checked too
GPU_VARIANTS = [KernelConfig(64, 64, 4, 2), KernelConfig(64, 64, 4, 2, tma=True), KernelConfig(128, 128, 8, 3, tma=True)]
VARIANTS = [CFG] + (GPU_VARIANTS if DEVICE == "cuda" else [])
MODES = ["fp8", "int8", "plain"]


def _qkv(B, H, HK, SQ, SK, D, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    # q as a B, S, H, D tensor seen through a B, H, S, D view (what diffusers' dispatcher hands over)
    q = torch.randn(B, SQ, H, D, generator=g).to(dtype).transpose(1, 2)
    k = torch.randn(B, HK, SK, D, generator=g).to(dtype)
    v = torch.randn(B, HK, SK, D, generator=g).to(dtype)
    return q.to(DEVICE), k.to(DEVICE), v.to(DEVICE)


def _dtype(qk):
    """Plain mode runs in the inputs' dtype: bf16 on a GPU; fp16 on the CPU interpreter, whose bf16
    ``tl.dot`` multiplies the raw bit patterns as integers (seen with Triton 3.6)."""
    return torch.float16 if qk == "plain" and DEVICE == "cpu" else torch.bfloat16


def _reference(q, k, v, mask=None):
    q, k, v = (t.double().cpu() for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if mask is not None:
        s = s.masked_fill(~mask.cpu(), float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)  # fully masked rows: zeros
    return p @ v


def _rel(out, ref):
    return ((out.double().cpu() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("cfg", VARIANTS, ids=str)
@pytest.mark.parametrize("qk", MODES)
@pytest.mark.parametrize("shape", [(1, 2, 2, 64, 64, 64), (1, 4, 2, 70, 97, 128), (2, 2, 1, 33, 40, 64)],
                         ids=["square", "gqa-cross-odd", "batch-gqa-odd"])
def test_dense_matches_the_reference_within_the_bound(qk, shape, cfg):
    q, k, v = _qkv(*shape, seed=zlib.crc32(f"{qk}{shape}".encode()) % 1000, dtype=_dtype(qk))
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device)  # poison: every element written
    quant_attention(q, k, v, qk=qk, config=cfg, out=out)
    assert torch.isfinite(out).all()
    assert _rel(out, _reference(q, k, v)) < REL_L2[qk]


def _random_lists(B, H, n_m, n_n, keep, seed):
    g = torch.Generator().manual_seed(seed)
    perms = torch.stack([torch.randperm(n_n, generator=g) for _ in range(B * H * n_m)]).view(B, H, n_m, n_n)
    idx = perms[..., :keep].sort(dim=-1).values  # a random choice, ascending as the kernel wants
    count = torch.randint(1, keep + 1, (B, H, n_m), generator=g)
    return idx.to(torch.int32).to(DEVICE), count.to(torch.int32).to(DEVICE)


@pytest.mark.parametrize("qk", MODES)
@pytest.mark.parametrize("SQ, SK", [(96, 130), (130, 90)], ids=["keys-longer", "keys-end-before-queries"])
def test_block_sparse_equals_the_reference_under_the_expanded_mask(qk, SQ, SK):
    """keys-end-before-queries: a call whose key padding the sparse stage dropped (HunyuanVideo's text tail)."""
    B, H, D = 1, 2, 64
    q, k, v = _qkv(B, H, H, SQ, SK, D, seed=7, dtype=_dtype(qk))
    n_m, n_n = -(-SQ // CFG.block_m), -(-SK // CFG.block_n)
    idx, count = _random_lists(B, H, n_m, n_n, keep=3, seed=8)
    lists = KeyBlockLists(idx, count, CFG.block_m, CFG.block_n)
    out = quant_attention(q, k, v, qk=qk, config=CFG, kv_index=idx, kv_count=count)
    masked_ref = _reference(q, k, v, lists.token_mask(SQ, SK))
    dense_ref = _reference(q, k, v)
    assert _rel(out, masked_ref) < REL_L2[qk]
    assert _rel(out, dense_ref) > 3 * _rel(out, masked_ref)  # the selection really changed the result


@pytest.mark.parametrize("cfg", VARIANTS, ids=str)
@pytest.mark.parametrize("qk", MODES)
def test_listing_every_block_in_order_is_bit_identical_to_dense(qk, cfg):
    B, H, SQ, SK, D = 1, 2, 70, 97, 64
    q, k, v = _qkv(B, H, H, SQ, SK, D, seed=3, dtype=_dtype(qk))
    n_m, n_n = -(-SQ // cfg.block_m), -(-SK // cfg.block_n)
    idx = torch.arange(n_n, dtype=torch.int32, device=DEVICE).expand(B, H, n_m, n_n).contiguous()
    count = torch.full((B, H, n_m), n_n, dtype=torch.int32, device=DEVICE)
    dense = quant_attention(q, k, v, qk=qk, config=cfg)
    sparse = quant_attention(q, k, v, qk=qk, config=cfg, kv_index=idx, kv_count=count)
    assert torch.equal(dense, sparse)


def test_an_empty_row_gives_zeros_and_is_fully_written():
    B, H, SQ, SK, D = 1, 1, 64, 64, 64
    q, k, v = _qkv(B, H, H, SQ, SK, D, seed=5)
    idx = torch.zeros(B, H, 2, 2, dtype=torch.int32, device=DEVICE)
    count = torch.tensor([[[0, 2]]], dtype=torch.int32, device=DEVICE)
    idx[0, 0, 1] = torch.tensor([0, 1])
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device)
    quant_attention(q, k, v, qk="fp8", config=CFG, kv_index=idx, kv_count=count, out=out)
    assert torch.all(out[:, :, :32] == 0)
    assert torch.isfinite(out).all() and out[:, :, 32:].abs().sum() > 0


def test_bad_inputs_are_refused_with_reasons():
    q, k, v = _qkv(1, 3, 2, 16, 16, 64, seed=1)
    with pytest.raises(ValueError, match="multiple"):
        quant_attention(q, k, v)
    q, k, v = _qkv(1, 2, 2, 16, 16, 80, seed=1)
    with pytest.raises(ValueError, match="64 or 128"):
        quant_attention(q, k, v)
    q, k, v = _qkv(1, 2, 2, 16, 16, 64, seed=1)
    with pytest.raises(ValueError, match="qk must be"):
        quant_attention(q, k, v, qk="int4")
    with pytest.raises(ValueError, match="go together"):
        quant_attention(q, k, v, kv_index=torch.zeros(1, 2, 1, 1, dtype=torch.int32))


def test_the_forms_route_a_tiny_model_under_a_profile_that_names_them():
    import ditgate
    from ditgate.forms import create_forms
    from ditgate.gate import compare
    from ditgate.models.presets import get_preset
    from ditgate.hosts import model_output

    forms = create_forms(["fp8", "int8", "fp8_sparse"])
    assert all(f.precision.value == "bounded" for f in forms.values())
    base = get_preset("tiny-wan")
    preset = dataclasses.replace(base, config={**base.config, "attention_head_dim": 64})  # the kernel's head dims
    model = preset.build(DEVICE, torch.bfloat16)
    inputs = preset.inputs(model, DEVICE, torch.bfloat16)
    with torch.no_grad():
        host = model_output(model(**inputs)).float()
        plan = ditgate.attach(model, forms=["fp8"], measure=False)
        routed = model_output(model(**inputs)).float()
    report = plan.report()
    assert all(s.serving == "fp8" for s in report.sites if s.role == "self"), plan.explain()
    assert compare(routed, host).cosine > 0.99
    assert plan.forms["fp8"].resident_bytes() > 0  # the quantized copies live in the form's pool
    plan.detach()
    assert plan.forms["fp8"].resident_bytes() == 0


@pytest.mark.parametrize("qk", MODES)
def test_tensor_descriptor_loads_give_the_same_result(qk):
    # plain mode reads the host's strided B, S, H, D storage through 4-D descriptors (odd lengths, GQA)
    q, k, v = _qkv(1, 4, 2, 70, 97, 64, seed=21, dtype=_dtype(qk))
    pointers = quant_attention(q, k, v, qk=qk, config=CFG)
    tma = quant_attention(q, k, v, qk=qk, config=dataclasses.replace(CFG, tma=True))
    assert torch.equal(pointers, tma)


def test_tensor_descriptor_loads_refuse_misaligned_strides():
    q, k, v = _qkv(1, 2, 2, 40, 40, 64, seed=22, dtype=_dtype("plain"))
    odd = torch.randn(1, 2, 40, 65, dtype=q.dtype, device=q.device)[..., :64]  # row stride of 130 bytes
    with pytest.raises(ValueError, match="16-byte"):
        quant_attention(q, k, odd, qk="plain", config=dataclasses.replace(CFG, tma=True))
