"""The same attention as ``quant_attention`` (FP8, INT8 or plain Q·Kᵀ; block-sparse lists), scheduled by
hand for Hopper in Gluon, Triton's explicit-layout dialect: the launch, and which calls it serves.

Why a second schedule: Triton's compiler runs the loads, both products and the softmax of a key block in
one instruction stream, so the tensor cores wait while the softmax runs. Here, as in FlashAttention-3,
the work is split across warps (``gl.warp_specialize``, ``hopper_kernel``): one producer partition issues every
load through the bulk tensor copy engine (TMA), and two or three consumer warpgroups, 64 query rows each, run the
products and the softmax on the same key blocks. While one warpgroup is in its softmax another's products keep the
tensor cores busy. Which calls it serves, and with which options, is ``hopper_config``'s.

Numerics are those of ``quant_attention``: the same quantized copies (``quantize``), the same score
scale folded into one FMA with the row max, INT8 products turned into floats by the magic-number add. One
difference in the 8-bit modes: P's FP8 bytes are computed from the scores by two FMAs instead of cast from exp2s
(``hopper_softmax._byte_p``: the mantissa linear between powers of two, about 1e-4 of cosine), and P's row sums
are the tensor cores'. The tail block (keys past the end) is masked only where it is visited, last (the lists
ascend).

Layouts: the host tensors are read in place through 2-D descriptors when they are either contiguous
[B, H, S, D] or [B, S, H, D] storage seen as [B, H, S, D] (diffusers' ``view(...).transpose(1, 2)``);
``host_layout`` says which, or None. Rows past a head's end belong to the next head or batch, so the
scores of keys past S_K are masked and query rows past S_Q are never stored.

Only for Hopper (sm_90): ``ready`` says whether a call can run here, and why not.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .hopper_config import (  # noqa: F401  (the tables are this module's public names too)
    DEFAULT_GROUPS, FASTER_THAN_TRITON, GATHERED, GROUPS, INT_MAXED, LAZY_RESCALED, PINNED, ROWS_HALF, ROWS_K,
    ROWS_Q, TREE_MAXED, default_stages, list_rows)
from .hopper_kernel import _hopper_attn_kernel
from .hopper_softmax import BYTE_TOP, LAZY_TAU, LAZY_TAU_PLAIN  # noqa: F401
from .quant_attention import LOG2E, QK_MODES, KernelConfig, Quantized, checked_prepared, quantize


@dataclass(frozen=True)
class RowView:
    """A [B, H, S, D] tensor as the 2-D [rows, columns] matrix a descriptor reads: row b·rb + h·rh + s,
    first column h·ch."""

    matrix: torch.Tensor
    rb: int
    rh: int
    ch: int


def host_layout(t: torch.Tensor) -> RowView | None:
    """The 2-D view of a [B, H, S, D] tensor stored [B, H, S, D] or [B, S, H, D], or None."""
    B, H, S, D = t.shape
    sb, sh, ss, sd = t.stride()
    size = t.element_size()
    if sd != 1 or t.data_ptr() % 16 or (ss * size) % 16:
        return None
    if H == 1 or sh == S * ss:  # heads apart: [B, H, S, D] (any row stride, heads S rows apart)
        if B == 1 or sb == H * S * ss:
            return RowView(t.as_strided((B * H * S, D), (ss, 1)), H * S, S, 0)
    if sh == D and ss >= H * D and (B == 1 or sb == S * ss):  # heads side by side: [B, S, H, D] storage
        return RowView(t.as_strided((B * S, H * D), (ss, 1)), S, 0, D)
    return None


def rows_aligned(t: torch.Tensor) -> bool:
    """Whether every row of ``t`` ([B, H, S, D], D innermost) starts on 16 bytes, so that stores of 16 bytes can
    write it (``_consume``'s ``O_ALIGNED``)."""
    size = t.element_size()
    return t.stride(3) == 1 and t.data_ptr() % 16 == 0 and all((st * size) % 16 == 0 for st in t.stride()[:3])


def serves(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qk: str,
           lists: tuple[int, int] | None = None) -> bool:
    """Whether ditgate's forms should run this call here rather than through the Triton schedule: on
    Hopper, where it measured faster (``FASTER_THAN_TRITON``: mode, head dim, and the query rows per
    block of the block lists that come with the call, ``lists`` being their (query rows, key rows) per
    block), and in plain mode from storage a descriptor can read (the quantized modes read their own
    copies)."""
    if ready(q, k, v):
        return False
    if lists is not None and lists[1] != ROWS_K:
        return False
    if (qk, q.shape[3], None if lists is None else lists[0]) not in FASTER_THAN_TRITON:
        return False
    return qk != "plain" or all(host_layout(t) is not None for t in (q, k, v))


def ready(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """None where this schedule can take the call; otherwise why not."""
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device)[0] != 9:
        return "the warp-specialized schedule is written for Hopper (sm_90)"
    if q.shape[3] not in (64, 128):
        return f"head dim {q.shape[3]} (64 or 128)"
    return None


def _descriptor(view: torch.Tensor, block: list[int]) -> TensorDescriptor:
    dtype = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float8_e4m3fn: gl.float8e4nv,
             torch.int8: gl.int8}[view.dtype]
    layout = gl.NVMMASharedLayout.get_default_for(block, dtype)
    return TensorDescriptor(view, list(view.shape), list(view.stride()), block, layout)


Memo = Callable[[Hashable, Callable[[], Any]], Any]


def _kept_descriptor(view: torch.Tensor, block: list[int], memo: Memo | None) -> TensorDescriptor:
    """``_descriptor``, made once per address, shape, strides and block where ``memo`` keeps it (a form's
    workspace, whose buffers hold the quantized copies at the same addresses call after call). Building the
    four descriptors took about three quarters of ``plan_launch``'s host time (96 us on a CI core)."""
    if memo is None:
        return _descriptor(view, block)
    key = ("descriptor", view.data_ptr(), tuple(view.shape), tuple(view.stride()), view.dtype, tuple(block))
    return memo(key, lambda: _descriptor(view, block))


def _ones_descriptor(dtype: torch.dtype, device: torch.device, memo: Memo | None) -> TensorDescriptor:
    """The tile of ones P is multiplied by for its row sums (the quantized modes), read by TMA with Q; kept in ``memo``
    where given, so that a call neither allocates nor fills it."""
    def make():
        return _descriptor(torch.ones(8, ROWS_K, dtype=dtype, device=device), [8, ROWS_K])

    return make() if memo is None else memo(("ones", dtype, str(device)), make)


@dataclass(frozen=True)
class Launch:
    """Everything one call of the kernel takes: grid, positional arguments, compile-time flags."""

    grid: tuple[int, int]
    args: tuple
    flags: dict

    def run(self) -> None:
        """Issue the kernel (one warpgroup's four warps per partition, as every partition is written for)."""
        _hopper_attn_kernel[self.grid](*self.args, **self.flags, num_warps=4)


def plan_launch(q, k, v, qk: str, scale: float, out: torch.Tensor, qz=None, kv_index=None, kv_count=None,
                stages: int | None = None, groups: int = 2, pin: bool | None = None, tree_max: bool | None = None,
                lazy: bool | None = None, int_max: bool | None = None, gather_out: bool | None = None,
                memo: Memo | None = None) -> Launch:
    """The kernel's arguments for validated inputs; ``qz`` the quantized copies (``quantize``, Q scales per
    64 rows) unless plain; ``groups`` consumer warpgroups of 64 query rows per program. Each option left as None is
    on where ``hopper_config`` says the call gains from it: ``pin``, plain mode only, keeps the exp2s above the P·V
    wait (``PINNED``); ``tree_max`` takes each row's max as a tree (``TREE_MAXED``), the same bits; ``lazy`` rescales
    the output only where a row's max rose past ``LAZY_TAU`` (``LAZY_TAU_PLAIN`` in plain mode; ``LAZY_RESCALED``);
    ``int_max``, INT8 only, takes the row max over the integer products (``INT_MAXED``), the same bits;
    ``gather_out``, plain mode at head dim 64 only, gathers each thread's eight neighbouring output channels before
    the store, so that they leave in one 16-byte store (``GATHERED``), the same bits (the quantized modes order V's
    channels for that instead). ``memo``: where the descriptors of ``qz``'s copies and the tile of ones are kept
    between calls (the workspace that ``qz``'s buffers came from; the host's own tensors, read in plain mode, are
    never kept)."""
    B, H, SQ, D = q.shape
    HK, SK = k.shape[1], k.shape[2]
    rows_q = ROWS_HALF * groups
    n_m, n_n = -(-SQ // rows_q), -(-SK // ROWS_K)
    quant = qz is not None
    if quant:
        q_desc = _kept_descriptor(qz.q.view(-1, D), [ROWS_HALF, D], memo)
        k_desc = _kept_descriptor(qz.k.view(-1, D), [ROWS_K, D], memo)
        v_desc = _kept_descriptor(qz.vt.view(-1, qz.sk_pad), [D, ROWS_K], memo)
        rows = (H * qz.sq_pad, qz.sq_pad, 0, HK * qz.sk_pad, qz.sk_pad, 0, HK * D, D, 0)
        scales = (qz.q_scale, qz.k_scale, qz.v_scale)
        ones_desc = _ones_descriptor(v_desc.base.dtype, q.device, memo)
    else:
        views = [host_layout(t) for t in (q, k, v)]
        if any(view is None for view in views):
            raise ValueError("plain mode reads [B, H, S, D] or [B, S, H, D] storage with 16-byte aligned rows")
        q_desc = _descriptor(views[0].matrix, [ROWS_HALF, D])
        k_desc = _descriptor(views[1].matrix, [ROWS_K, D])
        v_desc = _descriptor(views[2].matrix, [ROWS_K, D])
        rows = tuple(x for view in views for x in (view.rb, view.rh, view.ch))
        scales = (out, out, out)  # unused placeholders
        ones_desc = v_desc  # never read: plain mode's row sums are the softmax's
    sparse = kv_index is not None
    where = (qk, D, rows_q if sparse else None)
    pin = where in PINNED if pin is None else pin
    if pin and quant:
        raise ValueError("pin stores the softmax's row sums, which the 8-bit modes leave to the tensor cores: "
                         "plain mode only")
    int_max = where in INT_MAXED if int_max is None else int_max
    if int_max and qk != "int8":
        raise ValueError("int_max takes each row's max over INT8's integer products: INT8 mode only")
    aligned = rows_aligned(out)
    gather_out = where in GATHERED if gather_out is None else gather_out
    if gather_out and (quant or not aligned or D != 64):
        raise ValueError("gather_out is for plain mode's output at head dim 64 (at 128 its shared memory does not fit "
                         "beside three stages), with every row on 16 bytes")
    if sparse:
        lists = (kv_index, kv_count, kv_index.shape[3])
    else:
        lists = (out, out, 0)
    args = (q_desc, k_desc, v_desc, ones_desc, out, *scales, lists[0], lists[1], *out.stride(), *rows,
            H, HK, SQ, SK, n_m, n_n, 0 if qz is None else qz.q_scale.shape[1], lists[2], scale * LOG2E)
    flags = dict(D=D, STAGES=stages or default_stages(D, qk, groups), SPARSE=sparse, EVEN_K=SK % ROWS_K == 0,
                 QUANT=quant, INT_QK=qk == "int8", GROUPS=groups, PIN=bool(pin),
                 TREE_MAX=where in TREE_MAXED if tree_max is None else bool(tree_max),
                 LAZY=where in LAZY_RESCALED if lazy is None else bool(lazy), INT_MAX=bool(int_max),
                 O_ALIGNED=aligned, GATHER_O=bool(gather_out))
    return Launch((n_m, B * H), args, flags)


def quantize_for_schedule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qk: str, scale: float, buffers=None,
                          sums: bool = False, quantizer=None) -> Quantized:
    """The quantized copies this schedule reads: Q scales per 64 rows (one per consumer warpgroup), K per
    128 keys, V in P's key order; ``sums``: Q's column sums too (``quantize``, or ``quantizer`` with its
    arguments)."""
    return (quantizer or quantize)(q, k, v, qk, scale, KernelConfig(ROWS_HALF, ROWS_K), buffers, permute_v=True,
                                   sums=sums)


def hopper_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, qk: str = "fp8",
                     scale: float | None = None, kv_index: torch.Tensor | None = None,
                     kv_count: torch.Tensor | None = None, stages: int | None = None, groups: int | None = None,
                     buffers=None, out: torch.Tensor | None = None, prepared: Quantized | None = None,
                     memo: Memo | None = None, pin: bool | None = None, tree_max: bool | None = None,
                     lazy: bool | None = None, int_max: bool | None = None,
                     gather_out: bool | None = None, quantizer=None) -> torch.Tensor:
    """``quant_attention``'s contract (B, H, S, D inputs; key blocks of 128 rows in the lists) on Hopper.
    ``prepared``: the quantized copies made already (``quantize_for_schedule``), checked, not remade; else
    ``quantizer`` makes them (``quantize_for_schedule``'s).
    ``memo``: keeps host-side launch objects between calls (``plan_launch``); give it only with ``buffers`` of
    the same workspace, so that the copies it describes stay where it saw them.
    ``groups``: consumer warpgroups per program, 2 (128 query rows) or 3 (192; head dim 64 only); by
    default ``DEFAULT_GROUPS`` for the head dim. With block lists, their query blocks are the program's
    rows: lists per 128 query rows take 2 (the default with lists), per 192 rows 3. ``stages``: key/value stages in
    shared memory (by default as many as fit, ``default_stages``). ``pin``, ``tree_max``, ``lazy``, ``int_max``,
    ``gather_out``: the options of ``plan_launch``, each by default where it pays."""
    if qk not in QK_MODES:
        raise ValueError(f"qk must be one of {QK_MODES}, not {qk!r}")
    if (kv_index is None) != (kv_count is None):
        raise ValueError("kv_index and kv_count go together")
    if memo is not None and buffers is None:  # fresh copies at fresh addresses: every call would keep one more
        raise ValueError("memo keeps descriptors of a workspace's buffers: give that workspace's buffers too")
    why = ready(q, k, v)
    if why:
        raise ValueError(why)
    B, H, SQ, D = q.shape
    HK = k.shape[1]
    if H % HK:
        raise ValueError(f"{H} query heads are not a multiple of {HK} key/value heads")
    if groups is None:
        groups = 2 if kv_index is not None else DEFAULT_GROUPS[D]
    if groups not in GROUPS or (groups != 2 and D != 64):
        raise ValueError(f"groups must be one of {GROUPS} (3 only at head dim 64), not {groups!r}")
    scale = D ** -0.5 if scale is None else float(scale)
    if out is None:
        out = torch.empty((B, SQ, H, D), dtype=q.dtype, device=q.device).transpose(1, 2)
    if kv_index is not None:
        rows = ROWS_HALF * groups
        n_m = -(-SQ // rows)
        if kv_index.shape[:3] != (B, H, n_m) or kv_count.shape != (B, H, n_m):
            raise ValueError(f"kv_index must be [B, H, {n_m}, L] and kv_count [B, H, {n_m}] for {rows}-row query "
                             f"blocks ({groups} warpgroups)")
        kv_index = kv_index.to(torch.int32).contiguous()
        kv_count = kv_count.to(torch.int32).contiguous()
    qz = None
    if qk != "plain":
        qz = checked_prepared(prepared, qk, scale, ROWS_HALF, ROWS_K, True) or quantize_for_schedule(
            q, k, v, qk, scale, buffers, quantizer=quantizer)
    launch = plan_launch(q, k, v, qk, scale, out, qz, kv_index, kv_count, stages=stages, groups=groups, pin=pin,
                         tree_max=tree_max, lazy=lazy, int_max=int_max, gather_out=gather_out, memo=memo)
    launch.run()
    return out
