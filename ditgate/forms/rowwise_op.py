"""A linear input's row-wise 8-bit quantization as an operator of a compiled graph of its own (``ditgate::rowwise_quant``).

Inside a graph a linear form quantizes its input with torch ops, and inductor fuses them into the kernel that makes
the input: one reduction kernel that computes the producer for each row's absmax, then computes it again to cast.
Where the producer is a norm or a modulation that costs little. Where it is the feed-forward's activation it does not:
at Wan 2.1 1.3B's down projection (32760 x 8960) on an H100 the fused GELU and quantization took 1.024 ms against
GELU's 0.394 alone, where GELU then ditgate's one-launch Triton quantization took 0.737 (round 2l). A site whose input
is an activation's output (``hosts.linears.LinearSite.after_activation``) therefore quantizes through this op: the
graph keeps the activation's own kernel and runs the Triton kernel after it, what an eager call of the form runs.

The op is a ``torch.library.triton_op``: a compiled graph sees its Triton launch and launches the kernel from its own
generated code, as it launches its own kernels. An opaque ``custom_op`` (until this) ran its Python body at every
call, and in a profiled compiled Flux forward on an H100 the device waited up to 203 µs before its launches (round
2m's gaps profile).
On CUDA with Triton the kernel is ``kernels.rowwise_quant.quantize_rows``; elsewhere the torch ops of
``forms.linear`` (the same numerics; a compiled graph on a CPU breaks them up and fuses them like any torch ops).
Without Triton the op is a plain opaque ``custom_op``. Nothing synchronises with the host, so CUDA graphs capture
it.
"""

from __future__ import annotations

import torch

from . import linear as _linear  # a partly made module while forms.linear imports this one: read at call time

try:  # a module-level name, so that torch, reading the op's source, finds the kernel behind it
    from ..kernels.rowwise_quant import INTERPRETED, quantize_rows
except ImportError:  # no Triton: the torch ops serve, in an opaque op
    INTERPRETED, quantize_rows = False, None

NAME = "ditgate::rowwise_quant"


def _rowwise_quant(x: torch.Tensor, fp8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [M, K] (any strides) -> (values [M, K] row-major, e4m3 for ``fp8`` else int8; scales [M, 1] float32).
    The kernel on CUDA; the torch ops elsewhere and under Triton's interpreter (a traced launch cannot run there)."""
    if x.device.type == "cuda" and quantize_rows is not None and not INTERPRETED:
        return quantize_rows(x, fp8, traceable=True)
    values, scales = _linear.quantize_fp8(x) if fp8 else _linear.quantize_int8(x)
    return values.contiguous(), scales.reshape(-1, 1).contiguous()


if quantize_rows is not None:
    rowwise_quant = torch.library.triton_op(NAME, _rowwise_quant, mutates_args=())
else:  # triton_op looks for Triton when it is made (and logs a warning without it)
    rowwise_quant = torch.library.custom_op(NAME, _rowwise_quant, mutates_args=())
    rowwise_quant.register_fake(_rowwise_quant)


def quantize_apart(x: torch.Tensor, fp8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The row-wise quantization as its own kernel in a compiled graph (eagerly: the same call)."""
    return torch.ops.ditgate.rowwise_quant(x, fp8)
