"""ditgate's own INT8/FP8 attention (``ditgate.kernels.quant_attention``) as forms, dense and block-sparse.

On Hopper, every form here runs the warp-specialized schedule (``kernels.hopper_attention``) where it
measured faster than the Triton one and can take the call (see its ``serves``).

``fp8``: FP8 Q·Kᵀ and FP8 P·V; ``int8``: INT8 Q·Kᵀ and FP8 P·V. Both bounded error (per-block
quantization, see the kernel's docstring). ``fp8_sparse`` / ``int8_sparse`` / ``block_sparse`` (the
same kernel unquantized, in the host's bf16/fp16) serve calls whose mask is a ``KeyBlockLists``
selection (what the sparse stage produces) and nothing else; they are bounded because the selection is.
The quantized copies of Q, K, V are the form's workspace, pooled per (shape, dtype, device, variant)
across all sites of a plan.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import torch

from ..kernels.launches import recording
from .base import Availability, AttentionCall, AttentionInputs, Form, FormSpec, MaskKind, PooledTiles, Precision
from .carried import CarriedStatistics
from .ops import hopper_module, run_quant, triton_config
from .workspace import WorkspacePool

# What the forms declare of their error: measured on an H200, bf16 N(0, 1) inputs at the Wan-14B and LTX long shapes,
# cosine to a float32 reference (benchmarks/fp8_error_budget.py says where FP8's error comes from); the gate measures
# every call's cosine anyway.
_ERROR_BOUND = {
    "fp8": "per-block FP8 Q·K and FP8 P·V: cosine 0.9985 on random inputs, 0.9984 on the Hopper schedule (H200, "
           "Wan-14B/LTX shapes)",
    "int8": "per-block INT8 Q·K and FP8 P·V: cosine 0.9992 on random inputs, 0.9991 on the Hopper schedule (H200, "
            "Wan-14B/LTX shapes)",
    "plain": "dense: bf16 P·V as any flash kernel; sparse: the mass of the tiles not visited",
}


class _QuantForm(Form):
    qk: str
    sparse: bool
    warms_in_thread = True  # first calls are Triton compiles (seconds each in a fresh process), no global state
    compiles_ahead = True  # reads nothing its kernels write (the selection's counts come from the layout)

    def __init__(self) -> None:
        super().__init__()
        self._kernel = None
        self._hopper = None  # the warp-specialized schedule (kernels.hopper_attention), where it serves
        self._pool = None
        self._carried = None  # kernels.quant_passes_carried, loaded with the kernel
        self._statistics = CarriedStatistics(self.name, lambda q, k: self._carried.statistics_size(k), torch.float32)
        # dense 8-bit calls at a site quantize in one read at the K mean and V scales the site's previous call left
        # (``kernels.quant_passes_carried``); DITGATE_CARRY_STATISTICS=0 keeps every call on ``quantize``'s passes
        self.carry_statistics = os.environ.get("DITGATE_CARRY_STATISTICS") != "0"

    def _probe(self) -> Availability:
        if importlib.util.find_spec("triton") is None:
            return Availability(False, "triton not installed (pip install 'ditgate[triton]')")
        import triton

        interpret = os.environ.get("TRITON_INTERPRET") == "1"
        if not torch.cuda.is_available() and not interpret:
            return Availability(False, "no CUDA device (set TRITON_INTERPRET=1 to run it, slowly, on a CPU)",
                                triton.__version__)
        try:
            from ..kernels import quant_attention, quant_passes_carried
        except Exception as exc:
            return Availability(False, f"kernel failed to load: {type(exc).__name__}: {exc}", triton.__version__)
        self._kernel, self._carried = quant_attention, quant_passes_carried
        self._hopper = hopper_module()
        return Availability(True, "", triton.__version__)

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        if self.sparse and call.mask is not MaskKind.BLOCK:
            return ["sparse variant: needs key-block lists as the mask"]
        return []

    def selection_rows(self, call: AttentionCall, block: int) -> int | None:
        """On Hopper at head dim 64 the plain and FP8 sparse forms ask for 192-row query tiles: the
        schedule's three warpgroups then serve the lists as they do dense calls, where that measured
        faster (``hopper_attention.list_rows``, ``FASTER_THAN_TRITON``)."""
        if not self.sparse or call.device_type != "cuda" or not self.availability().available:
            return None
        hopper = self._hopper
        if hopper is None or block != hopper.ROWS_K:
            return None
        rows = hopper.list_rows(call.head_dim)
        if rows == block or (self.qk, call.head_dim, rows) not in hopper.FASTER_THAN_TRITON:
            return None
        return rows

    def _buffers(self, device: torch.device):
        """The workspace for this form's quantized copies, pooled across the plan's sites."""
        if self._pool is None:
            self._pool = WorkspacePool()
        pool, variant = self._pool, self.name

        def buffers(shape, dtype, name):
            return pool.get(shape, dtype, device, f"{variant}:{name}")

        return buffers

    def _on_hopper(self, q, k, v, shape: tuple[int, int] | None) -> bool:
        return self._hopper is not None and self._hopper.serves(q, k, v, self.qk, shape)

    def pool_for_selection(self, call: AttentionCall, inputs: AttentionInputs, rows: int,
                           block: int) -> PooledTiles | None:
        """The quantized sparse forms quantize Q and K for their kernel anyway: that pass also sums each
        block's rows (``quantize(sums=True)``), so the selector's tile means cost no read of their own: the
        selector's own pooling was most of its time, the sums add little to a pass that reads Q and K anyway.
        The copies ride to ``run``. Plain mode reads the host's tensors in place, with nothing to share: None."""
        if not self.sparse or self.qk == "plain" or self.not_supported_reasons(
                dataclasses.replace(call, mask=MaskKind.BLOCK)):
            return None  # nothing to share, or a call this form will refuse (it must not fail here)
        q, k, v = inputs.query, inputs.key, inputs.value
        scale = q.shape[3] ** -0.5 if inputs.scale is None else float(inputs.scale)
        buffers = self._buffers(q.device)
        if self._on_hopper(q, k, v, (rows, block)):
            qz = self._hopper.quantize_for_schedule(q, k, v, self.qk, scale, buffers, sums=True)
        else:
            config = triton_config(self._kernel, q, k, v, self.qk, rows, block)
            qz = self._kernel.quantize(q, k, v, self.qk, scale, config, buffers, sums=True)
        query, key = qz.tile_means(rows, q.shape[2], k.shape[2])
        return PooledTiles(query, key, qz)

    def run(self, inputs: AttentionInputs) -> torch.Tensor:
        lists = None
        if self.sparse:
            lists = inputs.attn_mask
            if not isinstance(lists, self._kernel.KeyBlockLists):
                raise TypeError(f"{self.name} needs KeyBlockLists as the mask, got {type(lists).__name__}")
        buffers = self._buffers(inputs.query.device)
        prepared = inputs.prepared if isinstance(inputs.prepared, self._kernel.Quantized) else None
        return run_quant(self._kernel, self._hopper, inputs.query, inputs.key, inputs.value, self.qk, inputs.scale,
                         lists, buffers, prepared, self._pool.memo, self._quantizer(inputs, prepared))

    def _quantizer(self, inputs: AttentionInputs, prepared):
        """What makes a dense 8-bit call's copies: at a site, in one read at its previous call's statistics
        (``forms.carried``, ``kernels.quant_passes_carried``); elsewhere, or where the copies came ``prepared``,
        ``quantize`` as before (None)."""
        if self.sparse or self.qk == "plain" or prepared is not None or inputs.site is None \
                or not self.carry_statistics:
            return None
        two_passes, one_pass = self._kernel.quantize, self._carried.quantize_carried

        def first(into):
            return lambda *args, **kwargs: two_passes(*args, **kwargs, statistics=into)

        def carried(last, into, repaired):
            def quantize(q, k, v, qk, scale, cfg, buffers=None, permute_v=False, sums=False):
                return one_pass(q, k, v, qk, scale, cfg, last, into, repaired, buffers, permute_v, sums)
            return quantize

        return self._statistics.quantizer(self._pool, inputs, first, carried, recording())

    def repaired_heads(self) -> int:
        """V heads the one-read quantization quantized again since this form was made or released, because the
        scales carried from the site's previous call did not hold (reads the device's counters: synchronises)."""
        return self._statistics.repaired_heads()

    def in_graph(self, inputs: AttentionInputs) -> torch.Tensor:
        """The kernels as one custom op (``ops.quant_attention``): its workspaces from torch's allocator, not this
        plan's pool; the selector's pooling not shared with the quantization pass."""
        q = inputs.query
        scale = q.shape[3] ** -0.5 if inputs.scale is None else float(inputs.scale)
        lists = inputs.attn_mask if self.sparse else None
        if lists is None:
            return torch.ops.ditgate.quant_attention(q, inputs.key, inputs.value, self.qk, scale, None, None, 0, 0)
        return torch.ops.ditgate.quant_attention(q, inputs.key, inputs.value, self.qk, scale, lists.kv_index,
                                                 lists.kv_count, lists.block_m, lists.block_n)

    def resident_bytes(self) -> int:
        return self._pool.bytes() if self._pool is not None else 0

    def release(self) -> None:
        self._statistics.clear()
        if self._pool is not None:
            self._pool.release()


def _spec(name: str, qk: str, sparse: bool) -> FormSpec:
    kind = "bf16/fp16 QK and PV" if qk == "plain" else f"{qk.upper()} QK / FP8 PV"
    return FormSpec(
        name=name,
        precision=Precision.BOUNDED,
        description=f"ditgate Triton attention, {kind}" + (", key-block lists" if sparse else ""),
        devices=frozenset({"cuda", "cpu"}),
        dtypes=frozenset({"float16", "bfloat16"}),
        mask_kinds=frozenset({MaskKind.BLOCK}) if sparse else frozenset({MaskKind.NONE}),
        head_dims=frozenset({64, 128}),
        # FP8 matrix instructions arrived with Ada / Hopper; the plain mode needs bf16 tensor cores
        min_capability=(8, 0) if qk == "plain" else (8, 9),
        causal=False,
        package="triton",
        error_bound=_ERROR_BOUND[qk],
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


class BlockSparseAttention(_QuantForm):
    qk, sparse = "plain", True
    spec = _spec("block_sparse", "plain", True)
