"""Linear forms against a float64 reference, within the error bound each declares, and their envelopes."""

import pytest
import torch

from ditgate.forms.linear import (
    FP8_MAX,
    INT8_MAX,
    LINEAR_OPT_IN,
    LINEAR_PRIORITY,
    LinearCall,
    UnknownLinearFormError,
    create_linear_forms,
    describe_linear,
    quantize_fp8,
    quantize_fp8_tensor,
)

FP8_RELATIVE = 2.0 ** -4  # half the spacing of e4m3's three mantissa bits, relative to a normal value
FP8_ABSOLUTE = 2.0 ** -10  # half the spacing of its subnormals (2^-9), in units of the row's scale
F32_EPS = 2.0 ** -24


def _operands(rows: int, k: int, n: int, seed: int, outliers: bool):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen)
    if outliers:  # a few large channels, as real activations have: the row scale is set by them
        x[:, :3] *= 40
    w = torch.randn(n, k, generator=gen) / k ** 0.5
    b = torch.randn(n, generator=gen)
    return x, w, b


def _element_bound(t: torch.Tensor, form: str) -> torch.Tensor:
    """Per element, what the form's declared quantization may move it by (float64)."""
    t = t.double()
    if form == "fp8_linear":
        scale = t.abs().amax(-1, keepdim=True) / FP8_MAX
        return FP8_RELATIVE * t.abs() + FP8_ABSOLUTE * scale
    if form == "fp8_tensor_linear":  # one scale for the whole tensor
        return FP8_RELATIVE * t.abs() + FP8_ABSOLUTE * t.abs().amax() / FP8_MAX
    return (t.abs().amax(-1, keepdim=True) / INT8_MAX / 2).expand_as(t)


@pytest.mark.parametrize("form", ["fp8_linear", "int8_linear", "fp8_tensor_linear"])
@pytest.mark.parametrize("rows,k,n,outliers", [(64, 96, 48, False), (33, 256, 80, True), (1, 32, 16, False)])
def test_linear_forms_stay_within_their_bound_of_a_float64_reference(form, rows, k, n, outliers):
    x, w, b = _operands(rows, k, n, seed=rows + k, outliers=outliers)
    impl = create_linear_forms([form])[form]
    out = impl.run(x, impl.quantize(w), b)
    assert out.shape == (rows, n) and out.dtype == x.dtype
    ref = x.double() @ w.double().t() + b.double()
    ex, ew = _element_bound(x, form), _element_bound(w, form)
    # |x̂ŵ - xw| <= e_x (|w| + e_w) + |x| e_w, summed over K; then float32 accumulation and the final rounding
    quant = ex @ (w.double().abs() + ew).t() + x.double().abs() @ ew.t()
    accumulate = (k + 2) * F32_EPS * ((x.double().abs() + ex) @ (w.double().abs() + ew).t() + b.double().abs())
    err = (out.double() - ref).abs()
    assert (err <= quant * 1.001 + accumulate + 1e-30).all(), (err / (quant + accumulate)).max()
    assert err.max() > 0  # it is quantized: not the host's product


def test_fp8_on_a_cpu_is_the_emulation_exactly():
    """Both operands quantized to e4m3 with the same scales, the product in float32: what torch._scaled_mm computes."""
    x, w, b = _operands(48, 64, 32, seed=3, outliers=True)
    form = create_linear_forms(["fp8_linear"])["fp8_linear"]
    weights = form.quantize(w)
    xq, xs = quantize_fp8(x)
    emulated = (xq.float() * xs) @ (weights.data.float() * weights.scale.t()).t() + b
    assert torch.allclose(form.run(x, weights, b), emulated, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["fp8_linear", "fp8_tensor_linear"])
def test_fp8_products_ask_for_fast_accumulation(name, monkeypatch):
    """Both FP8 forms call torch._scaled_mm with use_fast_accum=True (Hopper's fast accumulator, torchao's inference
    default), and the form's flag turns it off."""
    asked = []
    real = torch._scaled_mm

    def recording(*args, **kwargs):
        asked.append(kwargs.get("use_fast_accum", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", recording)
    x, w, b = _operands(16, 32, 16, seed=5, outliers=False)
    form = create_linear_forms([name])[name]
    weights = form.quantize(w)
    form.run(x, weights, b)
    form.fast_accumulation = False
    form.run(x, weights, b)
    assert asked == [True, False]


def test_fp8_tensorwise_on_a_cpu_is_its_emulation_exactly_and_loses_small_rows_first():
    x, w, b = _operands(48, 64, 32, seed=3, outliers=True)
    x[7] *= 1e-4  # a row far below the tensor's absmax: row-wise scales keep its digits, one scale does not
    forms = create_linear_forms(["fp8_tensor_linear", "fp8_linear"])
    tensorwise = forms["fp8_tensor_linear"]
    weights = tensorwise.quantize(w)
    assert weights.scale.shape == (1, 1)
    xq, xs = quantize_fp8_tensor(x)
    emulated = (xq.float() * xs) @ (weights.data.float() * weights.scale).t() + b
    out = tensorwise.run(x, weights, b)
    assert torch.allclose(out, emulated, rtol=0, atol=1e-5)
    ref = x.double() @ w.double().t()
    rowwise = forms["fp8_linear"].run(x, forms["fp8_linear"].quantize(w), None)
    row_err = lambda y: ((y[7].double() - ref[7]).norm() / ref[7].norm()).item()  # noqa: E731
    assert row_err(tensorwise.run(x, weights, None)) > 2 * row_err(rowwise)


def test_a_zero_row_stays_zero_and_finite():
    x, w, _ = _operands(20, 32, 16, seed=5, outliers=False)
    x[3] = 0
    for name, form in create_linear_forms(LINEAR_PRIORITY + LINEAR_OPT_IN).items():
        out = form.run(x, form.quantize(w), None)
        assert torch.isfinite(out).all() and torch.equal(out[3], torch.zeros(16)), name
        zeros = form.run(torch.zeros_like(x), form.quantize(w), None)
        assert torch.equal(zeros, torch.zeros_like(zeros)), name


def _call(**changes) -> LinearCall:
    base = dict(rows=4096, in_features=3072, out_features=3072, dtype="bfloat16", device_type="cuda",
                capability=(9, 0), needs_grad=False)
    return LinearCall(**{**base, **changes})


def test_envelopes_say_why_a_call_is_not_served():
    forms = create_linear_forms()
    fp8, int8 = forms["fp8_linear"], forms["int8_linear"]
    assert fp8.not_supported_reasons(_call()) == [] and int8.not_supported_reasons(_call()) == []
    assert any("float32" in r for r in fp8.not_supported_reasons(_call(dtype="float32")))
    assert any("multiple of 16" in r for r in fp8.not_supported_reasons(_call(in_features=3080)))
    assert any("(8, 6) < (8, 9)" in r for r in fp8.not_supported_reasons(_call(capability=(8, 6))))
    assert any("autograd" in r for r in int8.not_supported_reasons(_call(needs_grad=True)))
    assert any("more than 16" in r for r in int8.not_supported_reasons(_call(rows=16)))
    assert int8.not_supported_reasons(_call(rows=16), rows_known=False) == []  # at attach the rows are not known
    assert int8.not_supported_reasons(_call(rows=1, device_type="cpu", dtype="float32")) == []


def test_the_shape_key_is_rows_k_n_and_dtype():
    x = torch.zeros(2, 77, 64, dtype=torch.bfloat16)
    call = describe_linear(x, out_features=128, needs_grad=False, capability=None)
    assert call.shape_key == "M154:K64:N128:bfloat16" and call.flops == 2 * 154 * 64 * 128


def test_unknown_linear_forms_are_named():
    with pytest.raises(UnknownLinearFormError, match="fp8_linear, int8_linear, fp8_tensor_linear"):
        create_linear_forms(["fp16_linear"])
    assert tuple(create_linear_forms()) == LINEAR_PRIORITY  # an opt-in form only when named
