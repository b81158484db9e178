"""torch SDPA with one backend pinned per form (cuDNN, flash, memory-efficient, math).

Pinning matters: torch's own choice among its backends is the host path, so a form is only worth
measuring if it is a *different* kernel than the one torch would pick.

The cuDNN, flash and memory-efficient kernels compute each query row's log-sum-exp in the same pass; their
``run_lse`` calls the kernel's aten op, which hands it back (what diffusers' ring attention merges chunks by).
The math kernel keeps no log-sum-exp.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .base import Availability, AttentionCall, AttentionInputs, Form, FormSpec, MaskKind, Precision

_HALF = frozenset({"float16", "bfloat16"})
_ALL_FLOAT = frozenset({"float16", "bfloat16", "float32"})
_ALL_MASKS = frozenset({MaskKind.NONE, MaskKind.BOOLEAN, MaskKind.ADDITIVE})


class _PinnedSdpa(Form):
    backend: SDPBackend

    def _probe(self) -> Availability:
        if "cuda" in self.spec.devices and "cpu" not in self.spec.devices:
            if not torch.cuda.is_available():
                return Availability(False, "no CUDA device", torch.__version__)
        if self.backend == SDPBackend.CUDNN_ATTENTION and not torch.backends.cudnn.is_available():
            return Availability(False, "cuDNN not available in this torch build", torch.__version__)
        return Availability(True, "", torch.__version__)

    def run(self, inputs: AttentionInputs) -> torch.Tensor:
        with sdpa_kernel([self.backend]):
            return F.scaled_dot_product_attention(
                inputs.query,
                inputs.key,
                inputs.value,
                attn_mask=inputs.attn_mask,
                dropout_p=inputs.dropout_p,
                is_causal=inputs.is_causal,
                scale=inputs.scale,
                enable_gqa=inputs.enable_gqa,
            )


def _maskless(inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q, K, V of a call the log-sum-exp ops take: no mask, equal head counts (the ring path sends no other)."""
    if inputs.attn_mask is not None or inputs.query.shape[1] != inputs.key.shape[1]:
        raise ValueError("run_lse serves calls without a mask and with equal query and key/value heads only")
    return inputs.query, inputs.key, inputs.value


class SdpaCudnn(_PinnedSdpa):
    backend = SDPBackend.CUDNN_ATTENTION
    spec = FormSpec(
        name="sdpa_cudnn",
        precision=Precision.EXACT,
        description="torch SDPA pinned to cuDNN fused attention",
        devices=frozenset({"cuda"}),
        dtypes=_HALF,
        mask_kinds=frozenset({MaskKind.NONE, MaskKind.ADDITIVE}),
        max_head_dim=128,
        min_capability=(8, 0),
        gqa=False,
        dropout=True,
        backward=True,
        package="torch",
    )

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        return [] if call.head_dim % 8 == 0 else [f"head dim {call.head_dim} not a multiple of 8"]

    def run_lse(self, inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor]:
        # the cuDNN op reads strided inputs wrongly (diffusers' own cuDNN path makes them contiguous too)
        q, k, v = (t.contiguous() for t in _maskless(inputs))
        out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, inputs.dropout_p, inputs.is_causal, False, scale=inputs.scale)[:2]
        return out, lse.reshape(lse.shape[:3])  # [B, H, S, 1] from torch 2.9 on, [B, H, S] before


class SdpaFlash(_PinnedSdpa):
    backend = SDPBackend.FLASH_ATTENTION
    spec = FormSpec(
        name="sdpa_flash",
        precision=Precision.EXACT,
        description="torch SDPA pinned to its FlashAttention-2 kernel",
        devices=frozenset({"cuda"}),
        dtypes=_HALF,
        max_head_dim=256,
        min_capability=(8, 0),
        dropout=True,
        backward=True,
        package="torch",
    )

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        return [] if call.head_dim % 8 == 0 else [f"head dim {call.head_dim} not a multiple of 8"]

    def run_lse(self, inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = _maskless(inputs)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, inputs.dropout_p, inputs.is_causal, return_debug_mask=False, scale=inputs.scale)[:2]
        return out, lse


class SdpaEfficient(_PinnedSdpa):
    backend = SDPBackend.EFFICIENT_ATTENTION
    spec = FormSpec(
        name="sdpa_efficient",
        precision=Precision.EXACT,
        description="torch SDPA pinned to the memory-efficient (xformers-derived) kernel",
        devices=frozenset({"cuda"}),
        dtypes=_ALL_FLOAT,
        mask_kinds=_ALL_MASKS,
        max_head_dim=256,
        min_capability=(5, 0),
        dropout=True,
        backward=True,
        equal_head_dims=False,
        package="torch",
    )

    def run_lse(self, inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = _maskless(inputs)
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, None, True, inputs.dropout_p, inputs.is_causal, scale=inputs.scale)[:2]
        return out, lse[..., : q.shape[2]]  # the kernel pads its rows to a multiple of 32


class SdpaMath(_PinnedSdpa):
    backend = SDPBackend.MATH
    spec = FormSpec(
        name="sdpa_math",
        precision=Precision.EXACT,
        description="torch SDPA pinned to the unfused math reference (any device; slow)",
        devices=frozenset({"cpu", "cuda"}),
        dtypes=_ALL_FLOAT,
        mask_kinds=_ALL_MASKS,
        max_head_dim=1 << 16,
        dropout=True,
        backward=True,
        equal_head_dims=False,
        package="torch",
    )

    # The math path materialises the float32 score matrix; past this it is refused, not attempted.
    max_score_bytes = 4 << 30

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        score_bytes = 4 * call.batch * call.heads_q * call.seq_q * call.seq_kv
        if score_bytes > self.max_score_bytes:
            return [f"would materialise a {score_bytes / 2**30:.1f} GiB score matrix (limit "
                    f"{self.max_score_bytes / 2**30:.0f} GiB)"]
        return []
