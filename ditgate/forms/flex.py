"""torch flex_attention, compiled. Never the eager path.

An eager flex_attention call materialises the whole score matrix (diffusers' own ``flex`` backend
does this, 13x slower than native on LTX-Video). This form compiles once per plan with
``fullgraph=True`` and turns a hit recompile limit into an error, so a call can only run compiled
or raise (and a raise hands the call back to the host path, counted).
"""

from __future__ import annotations

import dataclasses

import torch

from ..kernels.lists import KeyBlockLists
from .base import Availability, AttentionCall, AttentionInputs, Form, FormSpec, MaskKind, Precision


class FlexCompiled(Form):
    spec = FormSpec(
        name="flex",
        precision=Precision.EXACT,
        description="torch flex_attention compiled with inductor (fullgraph, no eager fallback)",
        devices=frozenset({"cuda", "cpu"}),
        dtypes=frozenset({"float16", "bfloat16", "float32"}),
        mask_kinds=frozenset({MaskKind.NONE, MaskKind.BLOCK}),
        head_dims=frozenset({16, 32, 64, 128, 256}),
        causal=False,
        package="torch",
        compiles_per_shape=True,
    )

    max_shapes = 64

    def __init__(self) -> None:
        super().__init__()
        self._compiled = None

    def _probe(self) -> Availability:
        try:
            from torch.nn.attention import flex_attention  # noqa: F401
        except ImportError as exc:
            return Availability(False, f"torch {torch.__version__} has no flex_attention ({exc})")
        return Availability(True, "", torch.__version__)

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        if call.device_type == "cpu" and call.dtype != "float32":
            return [f"compiled flex on CPU serves float32 only, not {call.dtype}"]
        if call.device_type == "cpu" and call.mask is MaskKind.NONE and call.head_dim < 32 and call.seq_kv % 16:
            # torch's CPU kernel returns NaN or wrong rows at head dim 16 for key lengths of 8 mod 16 (no mask)
            return [f"compiled flex on CPU at head dim {call.head_dim} needs a key length that is a multiple of 16, "
                    f"not {call.seq_kv}"]
        return []

    def _fn(self):
        if self._compiled is None:
            from torch.nn.attention.flex_attention import flex_attention

            self._compiled = torch.compile(flex_attention, fullgraph=True, dynamic=False)
        return self._compiled

    def run(self, inputs: AttentionInputs) -> torch.Tensor:
        block_mask = inputs.attn_mask
        if isinstance(block_mask, KeyBlockLists):  # the sparse stage's selection
            block_mask = block_mask.to_flex_block_mask(inputs.query.shape[2], inputs.key.shape[2])
        # One compiled graph per shape; a pipeline meets a handful (self / cross, a few resolutions), a
        # process that serves many may meet more than dynamo's default of 8 per code object.
        limit = max(torch._dynamo.config.recompile_limit, self.max_shapes)
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True, recompile_limit=limit):
            return self._fn()(
                inputs.query,
                inputs.key,
                inputs.value,
                block_mask=block_mask,
                scale=inputs.scale,
                enable_gqa=inputs.query.shape[1] != inputs.key.shape[1],
            )

    def in_graph(self, inputs: AttentionInputs) -> torch.Tensor:
        """flex_attention itself: inside a graph the compiler that traces the model compiles it (no nested
        compiled callable, no recompile limit of our own)."""
        from torch.nn.attention.flex_attention import flex_attention

        block_mask = inputs.attn_mask
        if isinstance(block_mask, KeyBlockLists):
            block_mask = block_mask.to_flex_block_mask(inputs.query.shape[2], inputs.key.shape[2])
        return flex_attention(inputs.query, inputs.key, inputs.value, block_mask=block_mask, scale=inputs.scale,
                              enable_gqa=inputs.query.shape[1] != inputs.key.shape[1])

    def release(self) -> None:
        self._compiled = None


class FlexSparse(FlexCompiled):
    """The same compiled flex, as the sparse stage's consumer: key-block lists only, turned into a
    ``BlockMask`` of full blocks (no per-token mask_mod). Bounded, because the selection is."""

    spec = dataclasses.replace(
        FlexCompiled.spec, name="flex_sparse", precision=Precision.BOUNDED, mask_kinds=frozenset({MaskKind.BLOCK}),
        description="compiled flex_attention over the sparse stage's full-block BlockMask",
        error_bound="the attention mass of the key tiles not visited")
