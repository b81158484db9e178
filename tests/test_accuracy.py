"""``gate.accuracy.compare``: cosine, relative L2 and PSNR over every element, a float64 slice at a time, against the
same measures computed on whole float64 copies."""

import math

import pytest
import torch

from ditgate.gate import accuracy


def whole_float64(out, ref):
    a, b = out.reshape(-1).double(), ref.reshape(-1).double()
    diff = a - b
    cosine = (a @ b).item() / (torch.linalg.vector_norm(a) * torch.linalg.vector_norm(b)).item()
    rel = (torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(b)).item()
    span = (b.max() - b.min()).item()
    return cosine, rel, 10 * math.log10(span * span / (diff * diff).mean().item())


@pytest.fixture
def small_slices(monkeypatch):
    monkeypatch.setattr(accuracy, "CHUNK", 1000)  # many slices, the last one partial


@pytest.mark.parametrize("n", [999, 1000, 4567])
def test_sliced_measures_equal_the_whole_ones(small_slices, n):
    gen = torch.Generator().manual_seed(n)
    ref = torch.randn(n, generator=gen).to(torch.bfloat16).reshape(-1, 1)
    out = (ref.float() + 0.02 * torch.randn(ref.shape, generator=gen)).to(torch.bfloat16)
    got = accuracy.compare(out, ref)
    cosine, rel, psnr = whole_float64(out, ref)
    assert got.finite
    assert got.cosine == pytest.approx(cosine, rel=1e-12, abs=1e-12)
    assert got.rel_l2 == pytest.approx(rel, rel=1e-9)
    assert got.psnr_db == pytest.approx(psnr, rel=1e-9)
    assert got.cosine < 1 and got.rel_l2 > 0  # the noise is seen


def test_a_nan_in_the_last_slice_is_not_finite(small_slices):
    ref = torch.randn(4500)
    out = ref.clone()
    out[-3] = float("nan")
    got = accuracy.compare(out, ref)
    assert not got.finite and math.isnan(got.cosine) and got.rel_l2 == math.inf


def test_identical_outputs_and_a_zero_reference(small_slices):
    ref = torch.randn(2500)
    same = accuracy.compare(ref.clone(), ref)
    assert same.cosine == pytest.approx(1.0, abs=1e-15) and same.rel_l2 == 0 and same.psnr_db == math.inf
    zeros = accuracy.compare(torch.zeros(2500), torch.zeros(2500))
    assert zeros.cosine == 1.0 and zeros.rel_l2 == 0.0
    apart = accuracy.compare(torch.ones(2500), torch.zeros(2500))
    assert apart.cosine == 0.0 and apart.rel_l2 == 1.0


def test_shapes_must_match():
    with pytest.raises(ValueError, match="differs from the host's"):
        accuracy.compare(torch.zeros(2, 3), torch.zeros(3, 2))


def test_a_host_output_that_is_not_finite_passes_no_form(small_slices):
    ref = torch.randn(3000)
    ref[2500] = float("inf")
    got = accuracy.compare(torch.randn(3000), ref)
    assert not got.finite


def test_empty_outputs_are_an_error():
    with pytest.raises(ValueError, match="empty"):
        accuracy.compare(torch.zeros(0, 4), torch.zeros(0, 4))
