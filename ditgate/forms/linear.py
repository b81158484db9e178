"""Linear forms: what may serve one ``nn.Linear`` call of a denoiser in place of the host's ``F.linear``.

A linear form is declared like an attention form (an envelope checked by ``linear_spec_reasons``, an availability
probe, ``not_supported_reasons(call)``), and adds two verbs: ``quantize`` turns a site's host weight into what the
form keeps on the device in its place (once per site), and ``run`` computes ``x @ w.T + bias`` from that.

Both forms here are W8A8 with dynamic activation scales: every row of the input gets its own scale on every call
(absmax / the format's largest value), every output channel of the weight its own (once, at ``quantize``). They run
on torch's own 8-bit matrix products, ``torch._scaled_mm`` (FP8) and ``torch._int_mm`` (INT8), with the scaling
written here in a few lines of torch, so that torch.compile fuses the activation's quantization and the INT8
epilogue and the call stays free of host synchronisation (CUDA graphs). torchao's
``Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())`` and ``Int8DynamicActivationInt8WeightConfig``
compute the same functions through tensor subclasses that replace the module's weight; ditgate keeps the host's
weight in its custody instead (exact detach, the host path for calls a form cannot serve), so it calls the two
products directly rather than depend on torchao.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .base import Availability, Precision, Probed
from .rowwise_op import quantize_apart

# The largest finite values of the two 8-bit formats, the ends of the symmetric scales.
FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448
INT8_MAX = 127.0
# A row of zeros gets this scale instead of 0 (its quantized values are then 0, and so is its product).
_MIN_SCALE = 1e-12


@dataclass(frozen=True)
class LinearCall:
    """Everything about one linear call that decides which forms may serve it (no tensors).

    ``rows`` is the number of rows one call multiplies (M: every leading dimension of the input flattened), so
    a batch of two at one resolution is another shape key than a batch of one.
    """

    rows: int
    in_features: int
    out_features: int
    dtype: str
    device_type: str
    capability: tuple[int, int] | None
    needs_grad: bool

    @property
    def shape_key(self) -> str:
        """The key a speed verdict holds for (M, K, N, dtype), shared by every site with the same key."""
        return f"M{self.rows}:K{self.in_features}:N{self.out_features}:{self.dtype}"

    @property
    def flops(self) -> float:
        return 2.0 * self.rows * self.in_features * self.out_features

    def shapes_text(self) -> str:
        return f"x[{self.rows},{self.in_features}] w[{self.out_features},{self.in_features}]"


def describe_linear(x: torch.Tensor, out_features: int, needs_grad: bool,
                    capability: tuple[int, int] | None) -> LinearCall:
    return linear_call(tuple(x.shape), x.dtype, x.device.type, out_features, needs_grad, capability)


def linear_call(shape: tuple[int, ...], dtype: torch.dtype, device_type: str, out_features: int, needs_grad: bool,
                capability: tuple[int, int] | None) -> LinearCall:
    """A call's ``LinearCall`` from its input's shape, dtype and device type (no tensor: what a trace passes)."""
    rows = math.prod(shape[:-1]) if shape else 1
    return LinearCall(rows=rows, in_features=shape[-1] if shape else 0, out_features=out_features,
                      dtype=str(dtype).removeprefix("torch."), device_type=device_type, capability=capability,
                      needs_grad=needs_grad)


@dataclass(frozen=True)
class LinearSpec:
    """The declared envelope of a linear form. Every field is checked by ``linear_spec_reasons``."""

    name: str
    precision: Precision
    description: str
    devices: frozenset[str]
    dtypes: frozenset[str]
    cuda_dtypes: frozenset[str] | None = None  # where CUDA serves fewer input dtypes than ``dtypes``
    min_rows: int = 1
    k_multiple: int = 1
    n_multiple: int = 1
    min_capability: tuple[int, int] | None = None  # CUDA only
    package: str | None = None
    error_bound: str | None = None


def linear_spec_reasons(spec: LinearSpec, call: LinearCall, rows_known: bool = True) -> list[str]:
    """Reasons, from the declaration alone, why ``spec`` cannot serve ``call`` (``rows_known=False``: at attach,
    before any call, when the rows are not known yet)."""
    reasons: list[str] = []
    if call.device_type not in spec.devices:
        reasons.append(f"device {call.device_type} not in {sorted(spec.devices)}")
    dtypes = spec.cuda_dtypes if call.device_type == "cuda" and spec.cuda_dtypes is not None else spec.dtypes
    if call.dtype not in dtypes:
        reasons.append(f"dtype {call.dtype} not in {sorted(dtypes)} on {call.device_type}")
    if rows_known and call.rows < spec.min_rows:
        reasons.append(f"{call.rows} rows per call < {spec.min_rows}")
    if call.in_features % spec.k_multiple:
        reasons.append(f"in features {call.in_features} not a multiple of {spec.k_multiple}")
    if call.out_features % spec.n_multiple:
        reasons.append(f"out features {call.out_features} not a multiple of {spec.n_multiple}")
    if call.needs_grad:
        reasons.append("autograd is on and the form has no backward")
    if call.device_type == "cuda" and spec.min_capability is not None and call.capability is not None \
            and call.capability < spec.min_capability:
        reasons.append(f"compute capability {call.capability} < {spec.min_capability}")
    return reasons


@dataclass(frozen=True)
class QuantizedWeight:
    """What a form keeps on the device in place of a site's host weight."""

    data: torch.Tensor  # [N, K] in the form's 8-bit format, row-major (its transpose is the column-major operand)
    scale: torch.Tensor  # [1, N] float32: one scale per output channel ([1, 1] for a tensor-wise form)
    # what a form keeps per site beyond the weight, updated by its calls (``linear_delayed``: the largest input seen)
    state: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.data, self.scale, self.state) if t is not None)


def rowwise_scale(t: torch.Tensor, largest: float) -> torch.Tensor:
    """[rows, 1] float32: each row's absmax over the format's largest value (zero rows get a tiny scale)."""
    return (t.abs().amax(dim=-1, keepdim=True).float() / largest).clamp(min=_MIN_SCALE)


def quantize_fp8(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise e4m3: (values [rows, K] float8_e4m3fn, scales [rows, 1] float32), ``t ≈ values * scales``."""
    scale = rowwise_scale(t, FP8_MAX)
    return (t.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def quantize_int8(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise symmetric int8 (round to nearest): (values [rows, K] int8, scales [rows, 1] float32)."""
    scale = rowwise_scale(t, INT8_MAX)
    return torch.round(t.float() / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scale


def quantize_fp8_tensor(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tensor-wise e4m3: (values float8_e4m3fn, one scale [1, 1] float32), ``t ≈ values * scale``."""
    scale = (t.abs().amax().float() / FP8_MAX).clamp(min=_MIN_SCALE).reshape(1, 1)
    return (t.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def rowwise_product_dtype(xq: torch.Tensor, dtype: torch.dtype) -> torch.dtype:
    """The dtype ``torch._scaled_mm`` writes for row-wise scales: bf16 on CUDA, whatever the host's dtype."""
    return torch.bfloat16 if xq.device.type == "cuda" and dtype != torch.bfloat16 else dtype


def fp8_product(xq: torch.Tensor, xs: torch.Tensor, dtype: torch.dtype, data: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None, out_dtype: torch.dtype, fast_accumulation: bool) -> torch.Tensor:
    """``torch._scaled_mm`` of e4m3 ``xq`` [M, K] (scales ``xs``) and a site's e4m3 weight ``data`` [N, K] (scales
    ``scale``), written in ``out_dtype``, returned in ``dtype`` with ``bias`` added (fused where the dtypes allow)."""
    fused_bias = bias if bias is not None and bias.dtype == out_dtype else None
    out = torch._scaled_mm(xq, data.t(), scale_a=xs, scale_b=scale, bias=fused_bias, out_dtype=out_dtype,
                           use_fast_accum=fast_accumulation)
    out = out.to(dtype)
    return out + bias if bias is not None and fused_bias is None else out


def int8_product(xq: torch.Tensor, xs: torch.Tensor, dtype: torch.dtype, data: torch.Tensor, scale: torch.Tensor,
                 bias: torch.Tensor | None) -> torch.Tensor:
    """``torch._int_mm`` of int8 ``xq`` and a site's int8 weight, scaled back in float32, in ``dtype``, biased."""
    out = (torch._int_mm(xq, data.t()).float() * xs * scale).to(dtype)
    return out if bias is None else out + bias


def quantize_activation(x: torch.Tensor, fp8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A call's [M, K] input, row-wise: in one Triton launch on a GPU (``kernels.rowwise_quant``: the eager ops
    above move about ten times the bytes), the same numerics through torch ops elsewhere and inside a compiled
    graph (where inductor fuses them into one kernel of its own)."""
    if x.device.type == "cuda" and not torch.compiler.is_compiling():  # a trace never reaches the cached loader
        quantize_rows = rowwise_kernel("quantize_rows")
        if quantize_rows is not None:
            return quantize_rows(x, fp8)
    return quantize_fp8(x) if fp8 else quantize_int8(x)


@functools.cache
def rowwise_kernel(name: str):
    """A launcher of ``kernels.rowwise_quant`` by name (``quantize_rows``, ``quantize_delayed``), or None where Triton
    cannot be imported, so that the torch ops serve (loaded once, read-only)."""
    try:
        from ..kernels import rowwise_quant
    except Exception:  # no Triton
        return None
    return getattr(rowwise_quant, name)


class LinearForm(Probed):
    """One executable implementation of ``F.linear`` for a site's calls, with the weight it keeps in the host's place.

    Instances are made per plan (``create_linear_forms``); a form holds nothing per site itself: the router keeps
    each site's ``QuantizedWeight``. ``quantizer`` turns a [rows, K] tensor into 8-bit values and scales (per row,
    or one per tensor).
    """

    spec: LinearSpec
    quantizer: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    fp8: bool  # the activation's format: e4m3 (True) or int8
    # whether inductor folds the input's quantization into the kernels that make the input (a scale per row needs
    # only that row) and the graph adds nothing else per call, so that a plan for a compiled model may time the
    # product alone
    quantization_fuses: bool = True
    # its input's quantization kernel may compile before its first call (``gate.compile_ahead``): reads nothing back
    compiles_ahead: bool = True
    # its calls read state its site's eager calls start (``QuantizedWeight.state``): a compiled call at a site where
    # none ran goes to the host
    needs_eager_call: bool = False

    def not_supported_reasons(self, call: LinearCall, rows_known: bool = True) -> list[str]:
        avail = self.availability()
        if not avail.available:
            return [f"unavailable: {avail.reason}"]
        return linear_spec_reasons(self.spec, call, rows_known) + self.extra_reasons(call, rows_known)

    def extra_reasons(self, call: LinearCall, rows_known: bool = True) -> list[str]:
        """Reasons peculiar to this form beyond the declared envelope."""
        return []

    def quantize(self, weight: torch.Tensor) -> QuantizedWeight:
        """The weight this form keeps for a site (from the host's [N, K] weight, on the weight's device)."""
        data, scale = self.quantizer(weight.detach())
        return QuantizedWeight(data.contiguous(), scale.reshape(1, -1).contiguous())

    def run(self, x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None) -> torch.Tensor:
        """``x`` [M, K] in the host's dtype -> [M, N] in that dtype, ``bias`` added."""
        xq, xs = self.quantize_input(x, weight)
        return self.product(xq, xs, x.dtype, weight, bias)

    def quantize_input(self, x: torch.Tensor, weights: QuantizedWeight | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """A call's [M, K] input as 8-bit values and their scales (row-wise here: [M, 1]); ``weights``: the site's,
        for a form whose input scale is per site state."""
        return quantize_activation(x, fp8=self.fp8)

    def product(self, xq: torch.Tensor, xs: torch.Tensor, dtype: torch.dtype, weight: QuantizedWeight,
                bias: torch.Tensor | None) -> torch.Tensor:
        """The 8-bit product of a quantized input, scaled back to ``dtype`` with ``bias`` added: the part of ``run``
        a compiled graph keeps apart (inductor fuses the input's quantization into the kernel that makes it)."""
        raise NotImplementedError

    @staticmethod
    def graph_serve(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, state: torch.Tensor | None,
                    bias: torch.Tensor | None, fast_accumulation: bool, apart: bool = False) -> torch.Tensor:
        """``run`` as a compiled graph holds it for a site whose weights are settled: a plain function of tensors (no
        form instance), which every site calls through one constant mapping (``linear_graph.GRAPH_SERVES``), so that
        a graph guards on it once rather than on each site's path to its form's attributes. The instance's
        ``fast_accumulation`` comes in as an argument; a subclass that changes ``run`` (its quantization, its
        product's dtype) changes this too. ``apart``: a row-wise form quantizes the input in a kernel of its own
        (``forms.rowwise_op``) instead of torch ops that inductor fuses into the input's producer (a site after an
        activation); the others ignore it."""
        raise NotImplementedError


def _probe_op(op_name: str) -> Availability:
    if not hasattr(torch, op_name):
        return Availability(False, f"torch {torch.__version__} has no torch.{op_name}", torch.__version__)
    return Availability(True, "", torch.__version__)


class Fp8RowwiseLinear(LinearForm):
    """FP8 e4m3 W8A8: row-wise dynamic activation scales, per-channel weight scales, ``torch._scaled_mm``.

    On CUDA the product needs Ada or Hopper (sm89+), K and N multiples of 16 and a bf16 output for row-wise scales
    (fp16 inputs get a bf16 product cast back). On a CPU torch 2.13 runs ``torch._scaled_mm`` too: its float32 output
    is the emulation exactly (both operands quantized to e4m3 with the same scales, the product in float32).

    The product accumulates with Hopper's fast FP8 accumulation (``use_fast_accum``), as torchao's inference recipe
    does by default: without it cuBLAS promotes the tensor cores' partial sums into float32 every few k-steps, which
    held the row-wise products to about 1.5x bf16 on an H100. The fast accumulator keeps fewer mantissa bits over
    long K, an error the gate's per-site accuracy floors see like any other.
    """

    spec = LinearSpec(
        name="fp8_linear",
        precision=Precision.BOUNDED,
        description="FP8 e4m3 W8A8 linear: dynamic row-wise activation scales, per-channel weight scales "
                    "(torch._scaled_mm)",
        devices=frozenset({"cuda", "cpu"}),
        dtypes=frozenset({"bfloat16", "float16", "float32"}),
        cuda_dtypes=frozenset({"bfloat16", "float16"}),
        k_multiple=16,
        n_multiple=16,
        min_capability=(8, 9),
        package="torch",
        error_bound="each operand element within 2^-4 of its value (relative) or 2^-10 of its row's scale (absolute); "
                    "the product summed in the tensor cores' fast FP8 accumulator on CUDA, in float32 on a CPU",
    )
    quantizer = staticmethod(quantize_fp8)
    fp8 = True
    fast_accumulation = True

    def _probe(self) -> Availability:
        return _probe_op("_scaled_mm")

    def product_dtype(self, xq: torch.Tensor, dtype: torch.dtype) -> torch.dtype:
        return rowwise_product_dtype(xq, dtype)

    def product(self, xq: torch.Tensor, xs: torch.Tensor, dtype: torch.dtype, weight: QuantizedWeight,
                bias: torch.Tensor | None) -> torch.Tensor:
        return fp8_product(xq, xs, dtype, weight.data, weight.scale, bias, self.product_dtype(xq, dtype),
                           self.fast_accumulation)

    @staticmethod
    def graph_serve(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, state: torch.Tensor | None,
                    bias: torch.Tensor | None, fast_accumulation: bool, apart: bool = False) -> torch.Tensor:
        xq, xs = quantize_apart(x, True) if apart else quantize_activation(x, fp8=True)
        return fp8_product(xq, xs, x.dtype, data, scale, bias, rowwise_product_dtype(xq, x.dtype),
                           fast_accumulation)


class Int8DynamicLinear(LinearForm):
    """INT8 W8A8: row-wise dynamic symmetric activation scales, per-channel weight scales, ``torch._int_mm``.

    The int32 product is scaled in float32 (an epilogue torch.compile fuses), cast to the host's dtype and biased.
    On CUDA ``torch._int_mm`` needs more than 16 rows and K, N multiples of 8.
    """

    spec = LinearSpec(
        name="int8_linear",
        precision=Precision.BOUNDED,
        description="INT8 W8A8 linear: dynamic row-wise activation scales, per-channel weight scales (torch._int_mm)",
        devices=frozenset({"cuda", "cpu"}),
        dtypes=frozenset({"bfloat16", "float16", "float32"}),
        cuda_dtypes=frozenset({"bfloat16", "float16"}),
        k_multiple=8,
        n_multiple=8,
        min_capability=(8, 0),
        package="torch",
        error_bound="each operand element within half its row's scale (absmax / 254); the int32 product exact",
    )
    quantizer = staticmethod(quantize_int8)
    fp8 = False

    def _probe(self) -> Availability:
        return _probe_op("_int_mm")

    def extra_reasons(self, call: LinearCall, rows_known: bool = True) -> list[str]:
        if rows_known and call.device_type == "cuda" and call.rows <= 16:
            return [f"{call.rows} rows per call: torch._int_mm on CUDA needs more than 16"]
        return []

    def product(self, xq: torch.Tensor, xs: torch.Tensor, dtype: torch.dtype, weight: QuantizedWeight,
                bias: torch.Tensor | None) -> torch.Tensor:
        return int8_product(xq, xs, dtype, weight.data, weight.scale, bias)

    @staticmethod
    def graph_serve(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, state: torch.Tensor | None,
                    bias: torch.Tensor | None, fast_accumulation: bool, apart: bool = False) -> torch.Tensor:
        xq, xs = quantize_apart(x, False) if apart else quantize_activation(x, fp8=False)
        return int8_product(xq, xs, x.dtype, data, scale, bias)


class Fp8TensorwiseLinear(Fp8RowwiseLinear):
    """FP8 e4m3 W8A8 with one scale per tensor: the activation's absmax on every call, the weight's once.

    The recipe of torchao's ``Float8DynamicActivationFloat8WeightConfig`` at its default granularity (PerTensor).
    A tensor-wise product is cuBLAS's plain FP8 GEMM with two scalars in its epilogue, where row-wise scales take
    its outer-vector-scaled kernels. On an H100 those ran about 1.47x bf16 in compiled Flux, short of the 2x of
    the format. e4m3 is a floating-point format, so one scale keeps each element's relative precision down to 2^-6
    of the absmax / 448 (and subnormals below). Only channels far smaller than the tensor's largest lose digits, which
    the gate's accuracy floors check per site. Its input's quantization is torch ops, a global absmax and then the
    cast: eagerly about six kernels. Inside a graph the absmax must finish over the whole tensor before any element
    is cast, so the cast is a pass of its own (``quantization_fuses`` is False: a plan for a compiled model times
    this form with its quantization). Opt-in (``linear=[...]``), not among the default candidates: on an H100 its
    product ran only 1.10x the row-wise one at Flux's shapes, its quantization by torch ops cost 0.21 ms a call,
    and in compiled Flux it won no site (``benchmarks/results/h100/2026-12-06-round2e``).
    """

    spec = dataclasses.replace(
        Fp8RowwiseLinear.spec,
        name="fp8_tensor_linear",
        description="FP8 e4m3 W8A8 linear, one dynamic scale for the activation and one for the weight "
                    "(torch._scaled_mm, tensor-wise)",
        error_bound="each operand element within 2^-4 of its value (relative) or 2^-10 of its tensor's scale "
                    "(absolute); the product summed in the tensor cores' fast FP8 accumulator on CUDA, in float32 on "
                    "a CPU",
    )
    quantizer = staticmethod(quantize_fp8_tensor)
    quantization_fuses = False
    compiles_ahead = False  # its quantization is torch ops alone: no Triton launch to compile ahead

    def quantize_input(self, x: torch.Tensor, weights: QuantizedWeight | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize_fp8_tensor(x)

    def product_dtype(self, xq: torch.Tensor, dtype: torch.dtype) -> torch.dtype:
        """Tensor-wise scales write the host's dtype itself (fp16 too)."""
        return dtype

    @staticmethod
    def graph_serve(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, state: torch.Tensor | None,
                    bias: torch.Tensor | None, fast_accumulation: bool, apart: bool = False) -> torch.Tensor:
        xq, xs = quantize_fp8_tensor(x)
        return fp8_product(xq, xs, x.dtype, data, scale, bias, x.dtype, fast_accumulation)


# The documented order of linear forms for a plan that does not measure (``attach(..., linear=..., measure=False)``):
# FP8 first where the GPU has it (twice the dense rate on Hopper, and the format torchao's row-wise recipe uses).
LINEAR_PRIORITY: tuple[str, ...] = ("fp8_linear", "int8_linear")
# Forms a plan measures only when named (``linear=[...]``, ``LinearSetting(forms=...)``, ``--linear-forms``).
LINEAR_OPT_IN: tuple[str, ...] = ("fp8_tensor_linear", "fp8_delayed_linear")


@functools.cache
def linear_classes() -> dict[str, type[LinearForm]]:
    """Every linear form class by name (``linear_delayed`` builds on this module, so it is imported here, late)."""
    from .linear_delayed import Fp8DelayedLinear

    return {cls.spec.name: cls for cls in (Fp8RowwiseLinear, Int8DynamicLinear, Fp8TensorwiseLinear, Fp8DelayedLinear)}


class UnknownLinearFormError(ValueError):
    pass


def check_linear_form_names(names) -> tuple[str, ...]:
    names = tuple(names)
    unknown = [n for n in names if n not in linear_classes()]
    if unknown:
        raise UnknownLinearFormError(f"unknown linear form name(s) {unknown}; known linear forms: "
                                     f"{', '.join(LINEAR_PRIORITY + LINEAR_OPT_IN)}")
    return names


def create_linear_forms(names=None) -> dict[str, LinearForm]:
    """Fresh linear form instances, by name, in the documented order (the default candidates, ``LINEAR_PRIORITY``,
    when ``names`` is None)."""
    wanted = check_linear_form_names(names) if names is not None else LINEAR_PRIORITY
    return {name: linear_classes()[name]() for name in wanted}
