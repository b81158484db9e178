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


# --- the CUDA path's one-pass sums (kernels.agreement_sums), under Triton's interpreter on CPU tensors -------------

agreement_sums = pytest.importorskip("ditgate.kernels.agreement_sums")


def float64_sums(a, b):
    a, b = a.double(), b.double()
    return [(a @ b).item(), (a @ a).item(), (b @ b).item(), ((a - b) @ (a - b)).item(), b.max().item(),
            b.min().item()]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("n", [1, 4096, 4096 * 3 + 17])
def test_one_pass_sums_equal_float64_ones(dtype, n):
    gen = torch.Generator().manual_seed(n)
    b = (3 * torch.randn(n, generator=gen)).to(dtype)
    a = (b.float() + 0.05 * torch.randn(n, generator=gen)).to(dtype)
    *got, finite = agreement_sums.sums(a, b)
    want = float64_sums(a, b)
    assert finite
    for g, w in zip(got[:4], want[:4]):
        assert g == pytest.approx(w, rel=2e-6, abs=1e-6)
    assert got[4:] == want[4:]  # the extremes exactly: they are elements


def test_one_pass_sums_give_the_same_cosine_as_the_float64_slices_at_a_quality_floor():
    gen = torch.Generator().manual_seed(7)
    b = torch.randn(4096 * 5, generator=gen).to(torch.bfloat16)
    a = (b.float() + 3e-3 * torch.randn(b.shape, generator=gen)).to(torch.bfloat16)  # cosine about 0.99999
    dot, na2, nb2, d2, *_ = agreement_sums.sums(a, b)
    cosine, rel, _ = whole_float64(a, b)
    assert dot / math.sqrt(na2 * nb2) == pytest.approx(cosine, abs=1e-6)
    assert math.sqrt(d2 / nb2) == pytest.approx(rel, rel=1e-5)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("in_ref", [False, True])
def test_one_pass_sums_flag_what_is_not_finite_and_leave_it_out(bad, in_ref):
    a = torch.ones(5000, dtype=torch.bfloat16)
    b = torch.ones(5000, dtype=torch.bfloat16)
    (b if in_ref else a)[4500] = bad
    dot, na2, nb2, d2, bmax, bmin, finite = agreement_sums.sums(a, b)
    assert not finite
    assert (dot, na2, nb2, d2) == (4999.0, 4999.0, 4999.0, 0.0)


def test_one_pass_sums_refuse_what_they_do_not_serve():
    a = torch.randn(64, 64)
    with pytest.raises(ValueError, match="flat contiguous"):
        agreement_sums.sums(a, a)  # not flat
    with pytest.raises(ValueError, match="flat contiguous"):
        agreement_sums.sums(a.reshape(-1), a.reshape(-1).double())  # dtypes differ
    assert not agreement_sums.serves(a.t().reshape(-1)[::2], a.reshape(-1)[::2])
