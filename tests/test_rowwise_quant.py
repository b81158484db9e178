"""The fused row-wise quantization of a linear layer's input gives the bits of the torch ops it replaces; with an
activation, the quantization of torch's activation of its input."""

import pytest
import torch
import torch.nn.functional as F

from ditgate.forms.linear import quantize_fp8, quantize_int8
from ditgate.kernels import rowwise_quant
from ditgate.kernels.rowwise_quant import quantize_rows


@pytest.mark.parametrize("one_block", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("fp8", [True, False])
def test_the_kernel_gives_the_torch_paths_bits(dtype, fp8, one_block):
    gen = torch.Generator().manual_seed(int(fp8) * 10 + dtype.itemsize)
    # 13 rows (not a multiple of the row block), K = 700 (not a multiple of the column block), a strided view
    # (every other column of a wider tensor), one row of zeros and one with a large outlier
    wide = torch.randn(13, 1400, generator=gen).to(dtype)
    wide[3] = 0
    wide[5, 10] = 300.0
    x = wide[:, ::2]
    values, scales = quantize_rows(x, fp8=fp8, one_block=one_block)
    ref_values, ref_scales = (quantize_fp8 if fp8 else quantize_int8)(x)
    assert values.dtype == ref_values.dtype and values.shape == (13, 700) and scales.shape == (13, 1)
    assert torch.equal(scales, ref_scales)
    assert torch.equal(values.view(torch.uint8) if fp8 else values, ref_values.view(torch.uint8) if fp8 else ref_values)
    err = (values.float() * scales - x.float()).abs()  # and it is a quantization of x:
    if fp8:  # e4m3 rounds to 3 mantissa bits (half a step: 2^-4 relative), 2^-9 steps below its normal range
        bound = torch.maximum(x.float().abs() / 16, scales * 2.0 ** -10)
    else:  # int8: half a step of the row's scale
        bound = scales / 2
    assert torch.all(err <= bound * (1 + 1e-5))  # x / scale is rounded to float32 before it is rounded again


def test_int8_ties_round_to_even():
    x = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.0]])  # scale 1: the values themselves
    values, scales = quantize_rows(x, fp8=False)
    assert scales.item() == 1.0
    assert values.tolist() == [[127, 0, 2, 2, 0, -2, -2, 3]]


@pytest.mark.parametrize("one_block", [False, True])
@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_an_activation_applied_in_the_kernel_quantizes_torchs_activation(activation, dtype, one_block, monkeypatch):
    monkeypatch.setattr(rowwise_quant, "BLOCK_K", 256)  # three column blocks where the row is read twice
    gen = torch.Generator().manual_seed(7)
    wide = (3 * torch.randn(9, 1200, generator=gen)).to(dtype)
    wide[4, 17] = -40.0  # GELU's far negative side: zero; its positive side: the value
    x = wide[:, ::2]  # strided, K = 600
    values, scales = quantize_rows(x, fp8=True, activation=activation, one_block=one_block,
                                   block_k=rowwise_quant.BLOCK_K)
    act = F.gelu(x, approximate="tanh" if activation == "gelu_tanh" else "none")
    ref_values, ref_scales = quantize_fp8(act)
    assert values.shape == (9, 600) and scales.shape == (9, 1)
    # the interpreter's tanh and erf need not be torch's to the last bit, so an element of the activation may round
    # to the dtype's neighbouring value: the scales (set by the rows' large, positive values) agree, and all but a
    # few values bit for bit
    assert torch.equal(scales, ref_scales)
    same = (values.view(torch.uint8) == ref_values.view(torch.uint8)).float().mean().item()
    assert same > 0.999
    err = (values.float() * scales - act.float()).abs()  # a quantization of torch's activation
    assert torch.all(err <= torch.maximum(act.float().abs() / 16, scales * 2.0 ** -10) * (1 + 2 ** -7))


def test_an_unknown_activation_is_refused():
    with pytest.raises(ValueError, match="no activation 'relu'"):
        quantize_rows(torch.randn(2, 8), fp8=True, activation="relu")


def test_a_row_longer_than_one_block_is_read_twice(monkeypatch):
    monkeypatch.setattr(rowwise_quant, "MAX_ONE_BLOCK", 256)
    x = torch.randn(5, 700, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    values, scales = quantize_rows(x, fp8=True, one_block=True)  # falls back to the two loops
    ref_values, ref_scales = quantize_fp8(x)
    assert torch.equal(scales, ref_scales) and torch.equal(values.view(torch.uint8), ref_values.view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("activation", [None, "gelu_tanh", "gelu"])
def test_on_a_gpu_the_one_read_and_the_activation_give_torchs_quantization(activation):
    """At a down projection's width (K = 8960: one block of 16384, 16 warps), compiled for the GPU: libdevice's tanh
    and erf against torch's CUDA GELU."""
    x = torch.randn(300, 8960, device="cuda", dtype=torch.bfloat16) * 3
    act = x if activation is None else F.gelu(x, approximate="tanh" if activation == "gelu_tanh" else "none")
    ref_values, ref_scales = quantize_fp8(act)
    for one_block in (False, True):
        values, scales = quantize_rows(x, fp8=True, activation=activation, one_block=one_block)
        assert torch.allclose(scales, ref_scales, rtol=2 ** -7, atol=0)
        same = (values.view(torch.uint8) == ref_values.view(torch.uint8)).float().mean().item()
        assert same > (1.0 if activation is None else 0.999) - 1e-9, (one_block, same)
