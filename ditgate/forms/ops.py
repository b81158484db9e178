"""ditgate's own kernels, and the library kernels dynamo cannot trace, as ``torch.library`` custom ops.

Inside a torch.compile graph a form's call must be something the compiler can hold: dynamo cannot trace a Triton
or Gluon launch with host-side state, nor flash-attn-4's or sageattention's own dispatch. Each becomes an op here,
with a fake implementation that says what it returns (shape, dtype, strides), so the compiler treats it as opaque
and fuses around it. ``Form.in_graph`` calls them; eager calls keep calling the kernels directly.

Signatures hold tensors and plain values only (an op cannot take a Python object): the quantization mode as a
string, the scale as a float, a sparse selection as its two tensors and its block sizes. Nothing of a plan goes in.
Workspaces (the quantized copies) come from torch's caching allocator on every call; under CUDA-graph capture it
allocates from the graph's private pool, so a replay finds every workspace at the address it was captured with
(pointer-stable), and the ops read no device value back (no host synchronisation). Eager calls keep their plan's
pooled workspaces (``WorkspacePool``), which the ops never see.

Every op returns B, H, S, D views of B, S, H, D storage (what the quantized kernels write, and what flash-attn-4's
B, S, H, D output is once transposed); the fake implementations declare exactly that. A kernel that raises inside a
compiled graph cannot hand its call back to the host's code, which is not in the graph: the op computes the same
function with torch SDPA instead (for a sparse selection, over the token mask its lists mean) and warns.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..kernels.lists import KeyBlockLists


def bshd_storage(q: torch.Tensor, dv: int | None = None) -> torch.Tensor:
    """An uninitialised B, H, S, D output shaped like ``q`` (value head dim ``dv``), stored as B, S, H, D."""
    B, H, S, D = q.shape
    return torch.empty((B, S, H, dv or D), dtype=q.dtype, device=q.device).transpose(1, 2)


def _as_bshd_storage(out: torch.Tensor) -> torch.Tensor:
    """``out`` in the layout the fakes declare (a copy only where a kernel returned another)."""
    if out.transpose(1, 2).is_contiguous():
        return out
    fixed = bshd_storage(out, out.shape[3])
    fixed.copy_(out)
    return fixed


def _lists(kv_index: torch.Tensor | None, kv_count: torch.Tensor | None, block_m: int,
           block_n: int) -> KeyBlockLists | None:
    return None if kv_index is None else KeyBlockLists(kv_index, kv_count, block_m, block_n)


def _served(name: str, run: Callable[[], torch.Tensor], q, k, v, scale, causal: bool,
            lists: KeyBlockLists | None = None,
            operands: Callable[[], tuple[torch.Tensor, ...]] | None = None) -> torch.Tensor:
    """``run()``'s output in the layout the fakes declare; where it raises (inside a compiled graph, whose host
    code is not there to take the call), the same function by torch SDPA, with a warning (over ``operands()``
    instead of ``q``, ``k``, ``v`` where given: an op handed quantized copies dequantizes them only then)."""
    try:
        out = run()
    except Exception as exc:
        warnings.warn(f"ditgate: {name} raised inside a compiled graph ({type(exc).__name__}: {exc}); torch SDPA "
                      "served the call", RuntimeWarning, stacklevel=3)
        if operands is not None:
            q, k, v = operands()
        mask = None if lists is None else lists.token_mask(q.shape[2], k.shape[2])
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                             enable_gqa=q.shape[1] != k.shape[1])
    return _as_bshd_storage(out)


# --- ditgate's INT8 / FP8 / plain attention (kernels.quant_attention, kernels.hopper_attention) ----------------
def hopper_module():
    """The warp-specialized Hopper schedule where this GPU is a Hopper and Gluon is installed, else None."""
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9):
        return None
    try:
        from ..kernels import hopper_attention
    except Exception:  # an older Triton without Gluon: the Triton schedule serves every call
        return None
    return hopper_attention


def triton_config(kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qk: str, rows: int, block: int):
    """The Triton schedule's tiles for lists of ``rows`` x ``block`` tiles: query blocks of gcd(rows, block) rows
    (a 192 x 128 selection is served as 64-row blocks, each with its tile's list)."""
    config = kernel.default_config(q.shape[3], q.device.type, qk, block, tensors=(q, k, v))
    return dataclasses.replace(config, block_m=math.gcd(rows, block))


def run_quant(kernel, hopper, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qk: str, scale: float | None,
              lists: KeyBlockLists | None, buffers=None, prepared=None, memo=None, quantizer=None) -> torch.Tensor:
    """One quantized (or plain) attention call: on the Hopper schedule where it serves the call, else on the
    Triton one. ``buffers``, ``prepared``, ``memo`` and ``quantizer`` (what makes the copies where none are
    ``prepared``, with ``quantize``'s arguments) are a plan's (eager calls); the op passes none."""
    shape = (lists.block_m, lists.block_n) if lists is not None else None
    if hopper is not None and hopper.serves(q, k, v, qk, shape):
        kw = {} if lists is None else dict(kv_index=lists.kv_index, kv_count=lists.kv_count,
                                           groups=lists.block_m // hopper.ROWS_HALF)
        return hopper.hopper_attention(q, k, v, qk=qk, scale=scale, buffers=buffers, prepared=prepared, memo=memo,
                                       quantizer=quantizer, **kw)
    kw = {}
    if lists is not None:
        config = triton_config(kernel, q, k, v, qk, lists.block_m, lists.block_n)
        lists = lists.refine_queries(lists.block_m // config.block_m, q.shape[2])
        kw = dict(kv_index=lists.kv_index, kv_count=lists.kv_count, config=config)
    return kernel.quant_attention(q, k, v, qk=qk, scale=scale, buffers=buffers, prepared=prepared,
                                  quantizer=quantizer, **kw)


@torch.library.custom_op("ditgate::quant_attention", mutates_args=())
def quant_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qk: str, scale: float,
                    kv_index: torch.Tensor | None, kv_count: torch.Tensor | None, block_m: int,
                    block_n: int) -> torch.Tensor:
    """ditgate's attention over B, H, S, D tensors: ``qk`` "fp8", "int8" or "plain"; with key-block lists
    (``kv_index`` / ``kv_count`` of ``block_m`` x ``block_n`` tiles) or dense (both None, blocks 0)."""
    lists = _lists(kv_index, kv_count, block_m, block_n)

    def run():
        from ..kernels import quant_attention as kernel

        return run_quant(kernel, hopper_module(), q, k, v, qk, scale, lists)

    return _served(f"ditgate {qk} attention", run, q, k, v, scale, False, lists)


@quant_attention.register_fake
def _(q, k, v, qk, scale, kv_index, kv_count, block_m, block_n):
    return bshd_storage(q)


# --- flash-attn-4 (flash_attn.cute) ---------------------------------------------------------------------------
def fa4_bhsd(fn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """flash-attn-4 on B, H, S, D views: it takes and returns B, S, H, D."""
    out = fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **kwargs)
    if isinstance(out, tuple):
        out = out[0]
    return out.transpose(1, 2)


@torch.library.custom_op("ditgate::fa4", mutates_args=())
def fa4(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, causal: bool) -> torch.Tensor:
    """flash-attn-4's dense attention over B, H, S, D tensors."""
    def run():
        from flash_attn.cute import flash_attn_func

        return fa4_bhsd(flash_attn_func, q, k, v, softmax_scale=scale, causal=causal)

    return _served("flash-attn-4", run, q, k, v, scale, causal)


@fa4.register_fake
def _(q, k, v, scale, causal):
    return bshd_storage(q, v.shape[3])


@torch.library.custom_op("ditgate::fa4_sparse", mutates_args=())
def fa4_sparse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, kv_index: torch.Tensor,
               kv_count: torch.Tensor, block_m: int, block_n: int, factor: int) -> torch.Tensor:
    """flash-attn-4's block-sparse attention over the lists' tiles as full blocks; ``factor``: the query-block merge
    its eager calls found it accepts (0: try them, ``fa4.block_sparse``)."""
    lists = KeyBlockLists(kv_index, kv_count, block_m, block_n)

    def run():
        from flash_attn.cute import flash_attn_func

        from .fa4 import block_sparse

        return block_sparse(flash_attn_func, q, k, v, scale, lists, [factor] if factor else [1, 2, 4])[0]

    return _served("flash-attn-4 (block-sparse)", run, q, k, v, scale, False, lists)


@fa4_sparse.register_fake
def _(q, k, v, scale, kv_index, kv_count, block_m, block_n, factor):
    return bshd_storage(q, v.shape[3])


@torch.library.custom_op("ditgate::fa3_fp8", mutates_args=())
def fa3_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, causal: bool) -> torch.Tensor:
    """FlashAttention-3's FP8 kernel over ditgate's per-head e4m3 copies (``fa3.fp8_attention``), B, H, S, D."""
    def run():
        import fa3_fwd_interface  # noqa: F401  (registers torch.ops.fa3_fwd)

        from ..kernels.fp8_heads import quantize_heads
        from .fa3 import fp8_attention

        def attend(q8, k8, v8, scale, causal, descale):
            return torch.ops.fa3_fwd.fwd(q8, k8, v8, q_descale=descale[0], k_descale=descale[1],
                                         v_descale=descale[2], softmax_scale=scale, is_causal=causal, num_splits=1)[0]

        return fp8_attention(quantize_heads, attend, q, k, v, scale, causal)

    return _served("FlashAttention-3 FP8", run, q, k, v, scale, causal)


@fa3_fp8.register_fake
def _(q, k, v, scale, causal):
    return bshd_storage(q, v.shape[3])


@torch.library.custom_op("ditgate::fa3_fp8_quantized", mutates_args=())
def fa3_fp8_quantized(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, descale: torch.Tensor,
                      scale: float | None, causal: bool) -> torch.Tensor:
    """FlashAttention-3's FP8 kernel alone, over e4m3 B, H, S, D copies made in the graph
    (``fp8_heads_traced.quantize_heads_traced``) with their descales [3, B, Hkv]; the output in bf16, B, H, S, D.
    Where it raises, SDPA serves the dequantized copies."""
    def run():
        import fa3_fwd_interface  # noqa: F401  (registers torch.ops.fa3_fwd)

        q, k, v = (t.transpose(1, 2) for t in (q8, k8, v8))
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        return torch.ops.fa3_fwd.fwd(q, k, v, q_descale=descale[0], k_descale=descale[1], v_descale=descale[2],
                                     softmax_scale=scale, is_causal=causal, num_splits=1)[0].transpose(1, 2)

    def dequantized():
        group = q8.shape[1] // k8.shape[1]
        return tuple((t.float() * d[:, :, None, None]).to(torch.bfloat16)
                     for t, d in ((q8, descale[0].repeat_interleave(group, dim=1)), (k8, descale[1]), (v8, descale[2])))

    return _served("FlashAttention-3 FP8", run, q8, k8, v8, scale, causal, operands=dequantized)


@fa3_fp8_quantized.register_fake
def _(q8, k8, v8, descale, scale, causal):
    B, H, S, _ = q8.shape
    return torch.empty((B, S, H, v8.shape[3]), dtype=torch.bfloat16, device=q8.device).transpose(1, 2)


# --- sageattention ------------------------------------------------------------------------------------------------
def sage_bhsd(fn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None,
              causal: bool) -> torch.Tensor:
    """sageattention on B, H, S, D views, on a private copy of K (it smooths K in place)."""
    k = k.clone()
    if q.stride(-1) != 1 or v.stride(-1) != 1:
        q, v = q.contiguous(), v.contiguous()
    return fn(q, k, v, tensor_layout="HND", is_causal=causal, sm_scale=scale, smooth_k=True)


@torch.library.custom_op("ditgate::sage", mutates_args=())
def sage(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, causal: bool) -> torch.Tensor:
    """sageattention 1.x over B, H, S, D tensors."""
    def run():
        from sageattention import sageattn

        return sage_bhsd(sageattn, q, k, v, scale, causal)

    return _served("sageattention", run, q, k, v, scale, causal)


@sage.register_fake
def _(q, k, v, scale, causal):
    return bshd_storage(q, v.shape[3])
