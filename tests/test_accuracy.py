"""``gate.accuracy.compare``: cosine, relative L2 and PSNR over every element, with float64 sums, against the same
measures computed on whole float64 copies. Both paths: the torch operations a float64 slice at a time, and the
one-read kernel (``kernels.accuracy_sums``, under Triton's interpreter here)."""

import math
import os

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


def _kernel_on_cpu_or_skip():
    """The kernel on CPU tensors runs under Triton's interpreter only (conftest sets it where there is no GPU)."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the kernel reads CPU tensors under TRITON_INTERPRET=1 only; the GPU test covers CUDA")


@pytest.fixture(params=[False, True], ids=["torch", "kernel"])
def kernel(request):
    if request.param:
        _kernel_on_cpu_or_skip()
    return request.param


@pytest.mark.parametrize("n", [999, 1000, 4567])
def test_sliced_measures_equal_the_whole_ones(small_slices, n, kernel):
    gen = torch.Generator().manual_seed(n)
    ref = torch.randn(n, generator=gen).to(torch.bfloat16).reshape(-1, 1)
    out = (ref.float() + 0.02 * torch.randn(ref.shape, generator=gen)).to(torch.bfloat16)
    got = accuracy.compare(out, ref, kernel=kernel)
    cosine, rel, psnr = whole_float64(out, ref)
    assert got.finite
    assert got.cosine == pytest.approx(cosine, rel=1e-12, abs=1e-12)
    assert got.rel_l2 == pytest.approx(rel, rel=1e-9)
    assert got.psnr_db == pytest.approx(psnr, rel=1e-9)
    assert got.cosine < 1 and got.rel_l2 > 0  # the noise is seen


def test_a_nan_in_the_last_slice_is_not_finite(small_slices, kernel):
    ref = torch.randn(4500)
    out = ref.clone()
    out[-3] = float("nan")
    got = accuracy.compare(out, ref, kernel=kernel)
    assert not got.finite and math.isnan(got.cosine) and got.rel_l2 == math.inf


def test_identical_outputs_and_a_zero_reference(small_slices, kernel):
    ref = torch.randn(2500)
    same = accuracy.compare(ref.clone(), ref, kernel=kernel)
    assert same.cosine == pytest.approx(1.0, abs=1e-15) and same.rel_l2 == 0 and same.psnr_db == math.inf
    zeros = accuracy.compare(torch.zeros(2500), torch.zeros(2500), kernel=kernel)
    assert zeros.cosine == 1.0 and zeros.rel_l2 == 0.0
    apart = accuracy.compare(torch.ones(2500), torch.zeros(2500), kernel=kernel)
    assert apart.cosine == 0.0 and apart.rel_l2 == 1.0


def test_shapes_must_match():
    with pytest.raises(ValueError, match="differs from the host's"):
        accuracy.compare(torch.zeros(2, 3), torch.zeros(3, 2))


def test_a_host_output_that_is_not_finite_passes_no_form(small_slices, kernel):
    ref = torch.randn(3000)
    ref[2500] = float("inf")
    got = accuracy.compare(torch.randn(3000), ref, kernel=kernel)
    assert not got.finite


def test_empty_outputs_are_an_error():
    with pytest.raises(ValueError, match="empty"):
        accuracy.compare(torch.zeros(0, 4), torch.zeros(0, 4))


@pytest.mark.parametrize("dtypes", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
                                    (torch.float32, torch.bfloat16)], ids=["bf16", "fp16", "fp32-vs-bf16"])
def test_the_one_read_kernel_gives_the_torch_figures(dtypes):
    """Lengths across the kernel's blocks (the last one partial), a non-contiguous output, each dtype it reads: the
    same measures as the float64 slices, to the last few bits (only the order of the float64 additions differs)."""
    _kernel_on_cpu_or_skip()
    from ditgate.kernels.accuracy_sums import BLOCK

    gen = torch.Generator().manual_seed(5)
    ref = (3 * torch.randn(2 * BLOCK + 77, 3, generator=gen)).to(dtypes[1])
    out = (ref.float() + 0.05 * torch.randn(ref.shape, generator=gen)).to(dtypes[0]).t().contiguous().t()
    assert not out.is_contiguous()
    fast, slow = accuracy.compare(out, ref, kernel=True), accuracy.compare(out, ref, kernel=False)
    cosine, rel, psnr = whole_float64(out, ref)
    for got in (fast, slow):
        assert got.finite
        assert got.cosine == pytest.approx(cosine, rel=1e-12)
        assert got.rel_l2 == pytest.approx(rel, rel=1e-9) and got.psnr_db == pytest.approx(psnr, rel=1e-9)
    assert 0 < 1 - fast.cosine < 1e-2  # the noise is seen


def test_the_kernel_refuses_what_it_cannot_read():
    _kernel_on_cpu_or_skip()
    from ditgate.kernels.accuracy_sums import accuracy_sums

    with pytest.raises(ValueError, match="dtypes"):
        accuracy_sums(torch.zeros(8, dtype=torch.float64), torch.zeros(8, dtype=torch.float64))
    with pytest.raises(ValueError, match="flat contiguous"):
        accuracy_sums(torch.zeros(8), torch.zeros(9))
    # compare() keeps the torch path for a dtype the kernel does not read, unless told to use the kernel
    got = accuracy.compare(torch.ones(8, dtype=torch.float64), torch.ones(8, dtype=torch.float64))
    assert got.cosine == pytest.approx(1.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_compare_takes_the_kernel_and_agrees_with_the_torch_path():
    gen = torch.Generator(device="cuda").manual_seed(0)
    ref = torch.randn(32760 * 12 * 128 + 3, device="cuda", generator=gen).to(torch.bfloat16)
    out = (ref.float() + 0.03 * torch.randn(ref.shape, device="cuda", generator=gen)).to(torch.bfloat16)
    assert accuracy.accuracy_kernel() is not None
    assert accuracy.kernel_ready(out, ref, wait=True), accuracy._KERNEL_FAILED
    from ditgate.kernels.accuracy_sums import _sums_kernel
    compiled = len(_sums_kernel.device_caches[ref.device.index][0])
    fast, slow = accuracy.compare(out, ref), accuracy.compare(out, ref, kernel=False)
    assert len(_sums_kernel.device_caches[ref.device.index][0]) == compiled, "the launch found the thread's kernel"
    assert fast.cosine == pytest.approx(slow.cosine, rel=1e-12)
    assert fast.rel_l2 == pytest.approx(slow.rel_l2, rel=1e-9) and fast.psnr_db == pytest.approx(slow.psnr_db, rel=1e-9)


def test_a_kernel_that_fails_leaves_the_check_to_the_torch_path(monkeypatch, caplog):
    calls = []

    def broken(a, b):
        calls.append(a.numel())
        raise RuntimeError("no float64 here")

    monkeypatch.setattr(accuracy, "accuracy_kernel", lambda: broken)
    monkeypatch.setattr(accuracy, "_KERNEL_FAILED", [])
    monkeypatch.setattr(accuracy, "_on_gpu", lambda t: True)  # as a GPU's tensors would pick the kernel
    monkeypatch.setattr(accuracy, "kernel_ready", lambda a, b: True)  # compiled (the next tests see it compile)
    ref = torch.randn(3000)
    with pytest.raises(RuntimeError, match="no float64"):  # forced, it raises
        accuracy.compare(ref, ref, kernel=True)
    with caplog.at_level("WARNING", logger="ditgate"):
        first = accuracy.compare(ref + 1e-3, ref)
        second = accuracy.compare(ref + 1e-3, ref)
    assert first == second and first.finite and 0 < 1 - first.cosine < 1e-6
    assert accuracy._KERNEL_FAILED == ["RuntimeError: no float64 here"] and "kernel failed" in caplog.text
    assert len(calls) == 2  # the forced call and the first automatic one: not tried again after it failed


@pytest.fixture
def fresh_preparation(monkeypatch):
    """No kernel compiled or failed in this process, as a GPU's tensors would pick the kernel."""
    monkeypatch.setattr(accuracy, "_PREPARING", {})
    monkeypatch.setattr(accuracy, "_PREPARER", [])
    monkeypatch.setattr(accuracy, "_KERNEL_FAILED", [])
    monkeypatch.setattr(accuracy, "_on_gpu", lambda t: True)


def test_the_first_check_does_not_wait_for_the_kernels_compile(monkeypatch, fresh_preparation):
    _kernel_on_cpu_or_skip()
    from ditgate.kernels import accuracy_sums as module
    real, used, started = module.accuracy_sums, [], []
    monkeypatch.setattr(accuracy, "accuracy_kernel", lambda: lambda a, b: used.append(a.numel()) or real(a, b))
    compiled = module.compile_sums

    def slow_compile(*args):  # a compile that has not ended when the first checks come
        started.append(args)
        gate.wait(120)
        compiled(*args)

    import threading
    gate = threading.Event()
    monkeypatch.setattr(module, "compile_sums", slow_compile)
    ref = torch.randn(3000)
    out = ref + 0.01 * torch.randn(3000)
    try:
        first = accuracy.compare(out, ref)
        second = accuracy.compare(out, ref)
    finally:
        gate.set()
    assert used == [] and len(started) == 1, "the torch path served while the one compile ran"
    assert started[0] == (torch.float32, torch.float32, ref.device)
    assert accuracy.kernel_ready(out, ref, wait=True)
    third = accuracy.compare(out, ref)
    assert used == [3000], "once compiled, the kernel serves"
    assert first == second and third.cosine == pytest.approx(first.cosine, rel=1e-12)
    assert third.rel_l2 == pytest.approx(first.rel_l2, rel=1e-9)
    assert len(accuracy._PREPARING) == 1  # one compile per pair of dtypes, started once


def test_the_first_check_can_wait_for_the_kernel(monkeypatch, fresh_preparation):
    """``DITGATE_ACCURACY_KERNEL_THREAD=0``: the first check waits for the compile and takes the kernel."""
    _kernel_on_cpu_or_skip()
    from ditgate.kernels import accuracy_sums as module
    real, used = module.accuracy_sums, []
    monkeypatch.setattr(accuracy, "accuracy_kernel", lambda: lambda a, b: used.append(a.numel()) or real(a, b))
    monkeypatch.setenv("DITGATE_ACCURACY_KERNEL_THREAD", "0")
    ref = torch.randn(700)
    assert accuracy.compare(ref, ref).cosine == pytest.approx(1.0) and used == [700]


def test_a_compile_that_fails_leaves_the_checks_to_the_torch_path(monkeypatch, fresh_preparation, caplog):
    def failing(*args):
        raise RuntimeError("ptxas died")

    monkeypatch.setattr(accuracy, "_prepare_kernel", failing)
    ref = torch.randn(500)
    with caplog.at_level("WARNING", logger="ditgate"):
        assert not accuracy.kernel_ready(ref, ref, wait=True)
        got = accuracy.compare(ref, ref)
        again = accuracy.compare(ref, ref)
    assert got == again and got.cosine == pytest.approx(1.0)
    assert accuracy._KERNEL_FAILED == ["RuntimeError: ptxas died"]
    assert caplog.text.count("kernel failed") == 1


def test_a_kernel_that_loads_serves_the_first_check(monkeypatch, fresh_preparation):
    """A load (from Triton's cache, or from memory after a compile-ahead step) ends within the first check's short
    wait, so that check already takes the kernel."""
    _kernel_on_cpu_or_skip()
    from ditgate.kernels import accuracy_sums as module
    real, used = module.accuracy_sums, []
    monkeypatch.setattr(accuracy, "accuracy_kernel", lambda: lambda a, b: used.append(a.numel()) or real(a, b))
    monkeypatch.setattr(module, "compile_sums", lambda *args: None)  # already compiled: nothing to do
    monkeypatch.setattr(accuracy, "FIRST_WAIT_S", 30.0)  # a loaded CI machine may schedule the thread late
    ref = torch.randn(900)
    assert accuracy.compare(ref, ref).cosine == pytest.approx(1.0) and used == [900]


def test_without_triton_a_gpu_check_takes_the_torch_path_quietly(monkeypatch, fresh_preparation, caplog):
    monkeypatch.setattr(accuracy, "accuracy_kernel", lambda: None)
    ref = torch.randn(400)
    with caplog.at_level("WARNING", logger="ditgate"):
        assert accuracy.compare(ref, ref).cosine == pytest.approx(1.0)
    assert accuracy._PREPARING == {} and accuracy._KERNEL_FAILED == [] and caplog.text == ""
