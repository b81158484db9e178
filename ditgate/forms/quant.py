"""ditgate's own INT8/FP8 attention (``ditgate.kernels.quant_attention``) as forms, dense and block-sparse.

``fp8``: FP8 Q·Kᵀ and FP8 P·V; ``int8``: INT8 Q·Kᵀ and FP8 P·V. Both bounded error (per-block
quantization, see the kernel's docstring). ``fp8_sparse`` / ``int8_sparse`` serve calls whose mask is a
``KeyBlockLists`` selection (what the sparse stage produces) and nothing else. The quantized copies of
Q, K, V are the form's workspace, pooled per (shape, dtype, device, variant) across all sites of a plan.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import torch

from .base import Availability, AttentionCall, AttentionInputs, Form, FormSpec, MaskKind, Precision
from .workspace import WorkspacePool

# What is established so far: CPU interpreter runs against float64 on random inputs (tests/test_quant_kernel.py).
# GPU accuracy at real shapes is not measured yet; the gate measures every call's cosine regardless.
_ERROR_BOUND = "per-block INT8/FP8 quantisation; rel. L2 <= 0.15 (fp8) / 0.10 (int8) on random inputs (CPU)"


class _QuantForm(Form):
    qk: str
    sparse: bool

    def __init__(self) -> None:
        super().__init__()
        self._kernel = None
        self._pool = None

    def _probe(self) -> Availability:
        if importlib.util.find_spec("triton") is None:
            return Availability(False, "triton not installed (pip install 'ditgate[triton]')")
        import triton

        interpret = os.environ.get("TRITON_INTERPRET") == "1"
        if not torch.cuda.is_available() and not interpret:
            return Availability(False, "no CUDA device (set TRITON_INTERPRET=1 to run it, slowly, on a CPU)",
                                triton.__version__)
        try:
            from ..kernels import quant_attention
        except Exception as exc:
            return Availability(False, f"kernel failed to load: {type(exc).__name__}: {exc}", triton.__version__)
        self._kernel = quant_attention
        return Availability(True, "", triton.__version__)

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        if self.sparse and call.mask is not MaskKind.BLOCK:
            return ["sparse variant: needs key-block lists as the mask"]
        return []

    def run(self, inputs: AttentionInputs) -> torch.Tensor:
        q = inputs.query
        if self._pool is None:
            self._pool = WorkspacePool()
        pool, variant = self._pool, self.name

        def buffers(shape, dtype, name):
            return pool.get(shape, dtype, q.device, f"{variant}:{name}")

        kw = {}
        if self.sparse:
            lists = inputs.attn_mask
            if not isinstance(lists, self._kernel.KeyBlockLists):
                raise TypeError(f"{self.name} needs KeyBlockLists as the mask, got {type(lists).__name__}")
            base = self._kernel.default_config(q.shape[3], q.device.type)
            kw = dict(kv_index=lists.kv_index, kv_count=lists.kv_count,
                      config=dataclasses.replace(base, block_m=lists.block_m, block_n=lists.block_n))
        return self._kernel.quant_attention(q, inputs.key, inputs.value, qk=self.qk, scale=inputs.scale,
                                            buffers=buffers, **kw)

    def resident_bytes(self) -> int:
        return self._pool.bytes() if self._pool is not None else 0

    def release(self) -> None:
        if self._pool is not None:
            self._pool.release()


def _spec(name: str, qk: str, sparse: bool) -> FormSpec:
    return FormSpec(
        name=name,
        precision=Precision.BOUNDED,
        description=f"ditgate Triton attention, {qk.upper()} QK / FP8 PV" + (", key-block lists" if sparse else ""),
        devices=frozenset({"cuda", "cpu"}),
        dtypes=frozenset({"float16", "bfloat16"}),
        mask_kinds=frozenset({MaskKind.BLOCK}) if sparse else frozenset({MaskKind.NONE}),
        head_dims=frozenset({64, 128}),
        min_capability=(8, 9),  # FP8 matrix instructions (Ada, Hopper and later)
        causal=False,
        package="triton",
        error_bound=_ERROR_BOUND,
    )


class Fp8Attention(_QuantForm):
    qk, sparse = "fp8", False
    spec = _spec("fp8", "fp8", False)


class Int8Attention(_QuantForm):
    qk, sparse = "int8", False
    spec = _spec("int8", "int8", False)


class Fp8SparseAttention(_QuantForm):
    qk, sparse = "fp8", True
    spec = _spec("fp8_sparse", "fp8", True)


class Int8SparseAttention(_QuantForm):
    qk, sparse = "int8", True
    spec = _spec("int8_sparse", "int8", True)
