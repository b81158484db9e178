"""flash-attn-4 (``flash_attn.cute``), the CuTe-DSL FlashAttention for Hopper and Blackwell.

It takes B, S, H, D tensors; the host's B, H, S, D views are transposed back, which is free when
the host's tensors were B, S, H, D to begin with (diffusers' dispatch convention).
"""

from __future__ import annotations

import importlib.metadata

import torch

from .base import Availability, AttentionCall, AttentionInputs, Form, FormSpec, Precision


class FlashAttn4(Form):
    spec = FormSpec(
        name="fa4",
        precision=Precision.EXACT,
        description="flash-attn-4 (flash_attn.cute.flash_attn_func), Hopper/Blackwell",
        devices=frozenset({"cuda"}),
        dtypes=frozenset({"float16", "bfloat16"}),
        max_head_dim=256,
        min_capability=(9, 0),
        max_capability=(11, 0),
        backward=True,
        equal_head_dims=False,
        package="flash-attn-4",
    )

    def __init__(self) -> None:
        super().__init__()
        self._fn = None

    def _probe(self) -> Availability:
        try:
            version = importlib.metadata.version("flash-attn-4")
        except importlib.metadata.PackageNotFoundError:
            version = None
        if not torch.cuda.is_available():
            return Availability(False, "no CUDA device", version)
        try:
            from flash_attn.cute import flash_attn_func
        except Exception as exc:  # ImportError, or the CuTe DSL failing to load its libraries
            hint = "pip install 'ditgate[fa4]'" if version is None else "installed but failed to import"
            return Availability(False, f"flash_attn.cute not importable ({hint}): {type(exc).__name__}: {exc}", version)
        major, minor = torch.cuda.get_device_capability()
        if major not in (9, 10, 11):
            return Availability(False, f"needs compute capability 9.x/10.x/11.x, this GPU is {major}.{minor}", version)
        self._fn = flash_attn_func
        return Availability(True, "", version)

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        reasons = []
        if call.head_dim % 8 or call.head_dim_v % 8:
            reasons.append("head dims must be multiples of 8")
        if call.capability is not None and call.capability >= (10, 0) and max(call.head_dim, call.head_dim_v) > 128:
            if not (call.head_dim == call.head_dim_v == 256 or (call.head_dim, call.head_dim_v) == (192, 128)):
                reasons.append(f"head dims ({call.head_dim}, {call.head_dim_v}) not supported on SM100+")
        return reasons

    def run(self, inputs: AttentionInputs) -> torch.Tensor:
        q, k, v = (t.transpose(1, 2) for t in (inputs.query, inputs.key, inputs.value))
        out = self._fn(q, k, v, softmax_scale=inputs.scale, causal=inputs.is_causal)
        if isinstance(out, tuple):
            out = out[0]
        return out.transpose(1, 2)
