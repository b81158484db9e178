"""The fused row-wise quantization of a linear layer's input gives the bits of the torch ops it replaces."""

import pytest
import torch

from ditgate.forms.linear import quantize_fp8, quantize_int8
from ditgate.kernels.rowwise_quant import quantize_rows


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("fp8", [True, False])
def test_the_kernel_gives_the_torch_paths_bits(dtype, fp8):
    gen = torch.Generator().manual_seed(int(fp8) * 10 + dtype.itemsize)
    # 13 rows (not a multiple of the row block), K = 700 (not a multiple of the column block), a strided view
    # (every other column of a wider tensor), one row of zeros and one with a large outlier
    wide = torch.randn(13, 1400, generator=gen).to(dtype)
    wide[3] = 0
    wide[5, 10] = 300.0
    x = wide[:, ::2]
    values, scales = quantize_rows(x, fp8=fp8)
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


@pytest.mark.parametrize("fp8", [True, False])
def test_a_column_major_input_gives_the_same_bits(fp8):
    """A transposed input (column stride = rows): the kernel's column offsets are 64-bit, as its row offsets are."""
    x = torch.randn(300, 24, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16).t()
    assert x.stride() == (1, 24)
    values, scales = quantize_rows(x, fp8=fp8)
    ref_values, ref_scales = (quantize_fp8 if fp8 else quantize_int8)(x)
    assert torch.equal(scales, ref_scales)
    assert torch.equal(values.view(torch.uint8) if fp8 else values, ref_values.view(torch.uint8) if fp8 else ref_values)
