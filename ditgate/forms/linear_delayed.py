"""FP8 W8A8 with a delayed activation scale: what lets a compiled graph quantize a linear's input in the kernel that
makes it, with no reduction in the way.

The row-wise form (``fp8_linear``) needs each row's absmax before it may cast any element of that row, so inside a
compiled graph inductor makes the input's producer (a GELU, a norm and its modulation) a reduction kernel that reads
the row twice; on an H100 in compiled Flux those kernels took about twice what the producers alone took. The
tensor-wise form (``fp8_tensor_linear``) waits on a whole tensor's absmax, a pass of its own.

This form takes its one activation scale from the largest input absmax its site has seen so far instead, as
Transformer Engine's delayed-scaling recipe takes FP8 scales from an amax history: the cast is then a pointwise op on
a scale already known, which inductor folds into the producer, and the product is cuBLAS's plain tensor-wise FP8
GEMM. The input's absmax is still taken on every call, but nothing waits on it: it only updates the site's history
for the next call.

Per site the form keeps three float32 numbers on the device (``QuantizedWeight.state``): the largest input absmax
seen, how many calls had an input beyond the scale they used, and a scratch flag of the eager call in flight. The
scale is that absmax times ``MARGIN`` over e4m3's largest value:

- an eager call takes its own absmax into the history first, so it is never clamped (its scale is at least its own
  absmax times the margin). An input holding an inf or a NaN gives the history the absmax of its finite elements
  and is counted (``_finite_absmax``), so one bad call cannot set its site's scale to inf or NaN. On CUDA that is two
  Triton launches (``kernels.rowwise_quant.quantize_delayed``: the absmax into the state, then the cast), where
  torch ops take about a dozen launches: an image model's linears are short enough that an eager forward is bound
  by the host's launches, and the whole-model check times eager forwards;
- a compiled call uses the history as it stood before the call, so an input that grew past ``MARGIN`` times every
  earlier input of its site is clamped at e4m3's largest value, and the call is counted
  (``delayed_clamped_calls``, in the report). Its absmax still enters the history, so the next call's scale covers it.

A site's history starts at its first eager call (the gate's calibrating calls are eager), or at the history a receipt
carried (``Receipt.linear_histories``); a compiled call at a site where neither happened goes to the host
(``LinearRouter``; a plan made without measuring says so once at attach). Opt-in (``linear=[...]``), like every
tensor-wise form.
"""

from __future__ import annotations

import dataclasses

import torch

from .linear import _MIN_SCALE, FP8_MAX, Fp8TensorwiseLinear, QuantizedWeight, fp8_product, rowwise_kernel

# Headroom over the largest input absmax a site has seen: a compiled call's input may grow to this many times every
# earlier one before any element clamps. One binade of e4m3's range (about 2^15 between its smallest normal value and
# its largest) is the price: the smallest elements of a tensor go subnormal one binade sooner.
MARGIN = 2.0


def new_state(device: torch.device) -> torch.Tensor:
    """A site's delayed-scaling state: [largest input absmax seen, calls clamped, the eager call's inf-or-NaN flag],
    all 0. Made outside inference mode even when asked inside it (a plan calibrated under ``torch.inference_mode()``):
    every later call, inside it or not, updates it in place."""
    with torch.inference_mode(False):
        return torch.zeros(3, dtype=torch.float32, device=device)


class Fp8DelayedLinear(Fp8TensorwiseLinear):
    """FP8 e4m3 W8A8, one activation scale per site from the largest input absmax seen (module docstring), one weight
    scale per tensor; cuBLAS's tensor-wise FP8 product (``torch._scaled_mm``) with fast accumulation."""

    spec = dataclasses.replace(
        Fp8TensorwiseLinear.spec,
        name="fp8_delayed_linear",
        description="FP8 e4m3 W8A8 linear, the activation's scale delayed (the largest input absmax the site has "
                    f"seen, times {MARGIN:g}), one weight scale (torch._scaled_mm, tensor-wise)",
        error_bound=f"each operand element within 2^-4 of its value (relative) or 2^-10 of its tensor's scale "
                    f"(absolute, the activation's scale {MARGIN:g}x its largest input seen); a compiled call whose "
                    f"input exceeds {MARGIN:g}x every earlier input of its site is clamped there, and counted",
    )
    # its cast folds into the input's producer, but each compiled call also updates the site's history: about three
    # small kernels a site that the product alone does not show, and that a launch-bound graph pays for. So a plan
    # for a compiled model times this form whole, by its eager path (two launches besides the product)
    quantization_fuses = False
    compiles_ahead = True  # its eager cast is a Triton launch that reads nothing back
    needs_eager_call = True

    def quantize(self, weight: torch.Tensor) -> QuantizedWeight:
        quantized = super().quantize(weight)
        return dataclasses.replace(quantized, state=new_state(quantized.data.device))

    @staticmethod
    def graph_serve(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, state: torch.Tensor | None,
                    bias: torch.Tensor | None, fast_accumulation: bool, apart: bool = False) -> torch.Tensor:
        xq, xs = quantize_at_history(x, state)
        return fp8_product(xq, xs, x.dtype, data, scale, bias, x.dtype, fast_accumulation)

    def quantize_input(self, x: torch.Tensor, weights: QuantizedWeight | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        if weights is None or weights.state is None:
            raise ValueError("fp8_delayed_linear quantizes an input at its site's scale: give the site's weights "
                             "(their state holds the largest input seen)")
        state = weights.state
        if torch.compiler.is_compiling():  # torch ops, which inductor fuses into the input's producer
            return quantize_at_history(x, state)
        # eager: this call's absmax into the history before the cast
        fused = rowwise_kernel("quantize_delayed") if x.device.type == "cuda" else None
        if fused is not None:
            values, scale = fused(x.detach(), state, MARGIN)
            return values, scale.reshape(1, 1)
        current, spoiled = _finite_absmax(x.detach())
        largest = torch.maximum(state[0], current)
        state[:2].copy_(torch.stack((largest, state[1] + spoiled.float())))
        scale = (largest * MARGIN / FP8_MAX).clamp(min=_MIN_SCALE)
        return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale.reshape(1, 1)


def quantize_at_history(x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A compiled call's input cast at the scale its site's history gives (the history as it stood), and the
    history updated with this call's absmax and, where it went past the scale or held an inf or a NaN, a clamped
    call counted: torch ops, which inductor fuses into the input's producer."""
    current, spoiled = _finite_absmax(x)
    seen = state[0].clone()
    scale = (seen * MARGIN / FP8_MAX).clamp(min=_MIN_SCALE)
    clamped = ((current > seen * MARGIN) | spoiled).float()
    state[:2].copy_(torch.stack((torch.maximum(seen, current), state[1] + clamped)))
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale.reshape(1, 1)


def _finite_absmax(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An input's absmax as the history may take it, over its finite elements only, and whether it held an inf or a
    NaN (such a call is counted as clamped): one bad call must not set every later scale at its site to inf or NaN.
    The CUDA kernel (``quantize_delayed``) takes the same maximum; inside a graph this is one fused reduction. An empty
    input gives 0."""
    if x.numel() == 0:
        zero = torch.zeros((), dtype=torch.float32, device=x.device)
        return zero, zero.bool()
    a = x.abs()
    finite = a < float("inf")  # False for an inf and for a NaN, as in the kernel
    return torch.where(finite, a, torch.zeros_like(a)).amax().float(), ~finite.all()


def delayed_clamped_calls(*weights: QuantizedWeight | None) -> int:
    """Calls at a site (over every set of its weights given) whose input exceeded the scale they used or held an inf
    or a NaN (reads the device: synchronises)."""
    return sum(int(w.state[1].item()) for w in weights if w is not None and w.state is not None)
