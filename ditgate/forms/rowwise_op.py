"""A linear input's row-wise 8-bit quantization as one opaque operator of a compiled graph (``ditgate::rowwise_quant``).

Inside a graph a linear form quantizes its input with torch ops, and inductor fuses them into the kernel that makes
the input: one reduction kernel that computes the producer for each row's absmax, then computes it again to cast.
Where the producer is a norm or a modulation that costs little. Where it is the feed-forward's activation it does not:
at Wan 2.1 1.3B's down projection (32760 x 8960) on an H100 the fused GELU and quantization took 1.024 ms against
GELU's 0.394 alone, where GELU then ditgate's one-launch Triton quantization took 0.737 (round 2l). A site whose input
is an activation's output (``hosts.linears.LinearSite.after_activation``) therefore quantizes through this op: the
graph keeps the activation's own kernel and calls the Triton kernel after it, what an eager call of the form runs.

On CUDA with Triton: ``kernels.rowwise_quant.quantize_rows``; elsewhere the torch ops of ``forms.linear`` (the same
numerics). Nothing synchronises with the host, so CUDA graphs capture it.
"""

from __future__ import annotations

import torch


@torch.library.custom_op("ditgate::rowwise_quant", mutates_args=())
def rowwise_quant(x: torch.Tensor, fp8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [M, K] (any strides) -> (values [M, K] row-major, e4m3 for ``fp8`` else int8; scales [M, 1] float32)."""
    from .linear import quantize_activation  # the eager path: Triton on CUDA, torch ops elsewhere

    values, scales = quantize_activation(x, fp8)
    return values.contiguous(), scales.reshape(-1, 1).contiguous()


@rowwise_quant.register_fake
def _(x, fp8):
    m, k = x.shape
    values = torch.empty((m, k), dtype=torch.float8_e4m3fn if fp8 else torch.int8, device=x.device)
    return values, torch.empty((m, 1), dtype=torch.float32, device=x.device)


def quantize_apart(x: torch.Tensor, fp8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The row-wise quantization as its own kernel in a compiled graph (eagerly: the same call)."""
    return torch.ops.ditgate.rowwise_quant(x, fp8)
