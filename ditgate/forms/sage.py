"""sageattention 1.x: INT8 Q·Kᵀ with FP16 P·V (bounded error).

sageattention subtracts the key mean *in place* when smoothing; this form hands it a private copy
of K so that the host's tensors are never changed (the copy's cost is part of what the gate times).
"""

from __future__ import annotations

import importlib.metadata

import torch

from .base import Availability, AttentionInputs, Form, FormSpec, Precision
from .ops import sage_bhsd


class SageAttention(Form):
    spec = FormSpec(
        name="sage",
        precision=Precision.BOUNDED,
        description="sageattention (INT8 QK, FP16 PV), smoothed K",
        devices=frozenset({"cuda"}),
        dtypes=frozenset({"float16", "bfloat16"}),
        head_dims=frozenset({64, 96, 128}),
        min_capability=(8, 0),
        causal=True,
        package="sageattention",
        error_bound="per-call cosine typically >= 0.999 (INT8 per-block QK quantisation)",
    )
    warms_in_thread = True  # its first call is Triton compiles, no global state
    compiles_ahead = True  # reads nothing its kernels write

    def __init__(self) -> None:
        super().__init__()
        self._fn = None

    def _probe(self) -> Availability:
        try:
            version = importlib.metadata.version("sageattention")
        except importlib.metadata.PackageNotFoundError:
            return Availability(False, "sageattention not installed (pip install 'ditgate[sage]')")
        if not torch.cuda.is_available():
            return Availability(False, "no CUDA device", version)
        try:
            from sageattention import sageattn
        except Exception as exc:
            return Availability(False, f"sageattention failed to import: {type(exc).__name__}: {exc}", version)
        self._fn = sageattn
        return Availability(True, "", version)

    def run(self, inputs: AttentionInputs) -> torch.Tensor:
        return sage_bhsd(self._fn, inputs.query, inputs.key, inputs.value, inputs.scale, inputs.is_causal)

    def in_graph(self, inputs: AttentionInputs) -> torch.Tensor:
        return torch.ops.ditgate.sage(inputs.query, inputs.key, inputs.value, inputs.scale, inputs.is_causal)
