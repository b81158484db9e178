"""flash-attn-4 (``flash_attn.cute``), the CuTe-DSL FlashAttention for Hopper and Blackwell.

It takes B, S, H, D tensors; the host's B, H, S, D views are transposed back, which is free when
the host's tensors were B, S, H, D to begin with (diffusers' dispatch convention).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import re
import sys

import torch

from ..cache_dir import cache_root
from ..kernels.lists import KeyBlockLists
from .base import Availability, AttentionCall, AttentionInputs, Form, FormSpec, MaskKind, Precision
from .ops import fa4_bhsd


FA4_CACHE_SWITCH = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"  # flash-attn-4's own switches, read at its import
FA4_CACHE_DIR = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"


def use_fa4_disk_cache() -> str:
    """Turn on flash-attn-4's disk cache of compiled kernels, in ditgate's cache folder, unless the user decided.

    flash-attn-4 compiles each kernel configuration on its first call (seconds each: the largest part of a first
    calibration) and by default keeps it in the process only, so every start of a server would pay it again. Its own
    disk cache (off by default) makes a later process load what an earlier one compiled. It is read when
    ``flash_attn.cute`` is first imported, so this runs before that; a variable the user set, or
    ``DITGATE_FA4_DISK_CACHE=0``, is left alone. Returns what holds, for ``ditgate doctor``."""
    if os.environ.get("DITGATE_FA4_DISK_CACHE", "1") == "0":
        return "off (DITGATE_FA4_DISK_CACHE=0)"
    if "flash_attn.cute" in sys.modules:
        return f"as the process imported flash_attn.cute before ditgate ({FA4_CACHE_SWITCH}=" \
               f"{os.environ.get(FA4_CACHE_SWITCH, '0')})"
    os.environ.setdefault(FA4_CACHE_SWITCH, "1")
    os.environ.setdefault(FA4_CACHE_DIR, str(cache_root() / "fa4-kernels"))
    if os.environ[FA4_CACHE_SWITCH] != "1":
        return f"off ({FA4_CACHE_SWITCH}={os.environ[FA4_CACHE_SWITCH]})"
    return f"on, in {os.environ[FA4_CACHE_DIR]}"


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
        use_fa4_disk_cache()
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
        return fa4_bhsd(self._fn, inputs.query, inputs.key, inputs.value, softmax_scale=inputs.scale,
                        causal=inputs.is_causal)

    def in_graph(self, inputs: AttentionInputs) -> torch.Tensor:
        return torch.ops.ditgate.fa4(inputs.query, inputs.key, inputs.value, inputs.scale, inputs.is_causal)


class FlashAttn4Sparse(FlashAttn4):
    """flash-attn-4's block-sparse path as the sparse stage's consumer: the selection's tiles become
    "full" blocks (computed without a mask_mod). Where fa4's query tile is taller than the selection's
    (it asks for a multiple of its own tile), query blocks are merged and visit the union of their keys."""

    spec = dataclasses.replace(
        FlashAttn4.spec, name="fa4_sparse", precision=Precision.BOUNDED, mask_kinds=frozenset({MaskKind.BLOCK}),
        description="flash-attn-4 over the sparse stage's key-block lists (full blocks only)", backward=False,
        error_bound="the attention mass of the key tiles not visited")

    def __init__(self) -> None:
        super().__init__()
        self._q_factor: dict[tuple, int] = {}  # query-block merge factor fa4 accepted, per shape

    def run(self, inputs: AttentionInputs) -> torch.Tensor:
        lists = inputs.attn_mask
        if not isinstance(lists, KeyBlockLists):
            raise TypeError(f"fa4_sparse needs KeyBlockLists as the mask, got {type(lists).__name__}")
        key = self._factor_key(inputs)
        factors = [self._q_factor[key]] if key in self._q_factor else [1, 2, 4]
        out, self._q_factor[key] = block_sparse(self._fn, inputs.query, inputs.key, inputs.value, inputs.scale, lists,
                                                factors)
        return out

    def in_graph(self, inputs: AttentionInputs) -> torch.Tensor:
        lists = inputs.attn_mask
        factor = self._q_factor.get(self._factor_key(inputs), 0)  # what the eager calls found fa4 accepts
        return torch.ops.ditgate.fa4_sparse(inputs.query, inputs.key, inputs.value, inputs.scale, lists.kv_index,
                                            lists.kv_count, lists.block_m, lists.block_n, factor)

    @staticmethod
    def _factor_key(inputs: AttentionInputs) -> tuple:
        lists = inputs.attn_mask
        return tuple(inputs.query.shape), tuple(inputs.key.shape), lists.block_m, lists.block_n


def block_sparse(fn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, lists: KeyBlockLists,
                 factors: list[int]) -> tuple[torch.Tensor, int]:
    """flash-attn-4 over B, H, S, D views and the lists' tiles as full blocks, merging query blocks by the first of
    ``factors`` it accepts (it names the query block size it wants); the output and that factor."""
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch

    seq_q, seq_k = q.shape[2], k.shape[2]
    for i, factor in enumerate(factors):
        sel = lists.coarsen_queries(factor, seq_q, seq_k)
        index = sel.index_per_key_block(seq_k)
        tensors = BlockSparseTensorsTorch(
            mask_block_cnt=torch.zeros_like(sel.kv_count), mask_block_idx=torch.zeros_like(index),
            full_block_cnt=sel.kv_count, full_block_idx=index, block_size=(sel.block_m, sel.block_n))
        try:
            return fa4_bhsd(fn, q, k, v, softmax_scale=scale, block_sparse_tensors=tensors), factor
        except ValueError as exc:  # fa4 names the query block size it wants; try the next multiple
            if i + 1 < len(factors) and re.search(r"sparse_block_size", str(exc)):
                continue
            raise
    raise AssertionError("unreachable")
