"""INT8/FP8 attention with block-sparse key lists, in Triton (and plain bf16/fp16 through the same loop).

Why our own kernel: no library on the package index does FP8 Q·Kᵀ *and* FP8 P·V with per-query-block
key lists (sageattention 1.0.6 is INT8 Q·Kᵀ with FP16 P·V and no sparsity; flash-attn-4 is exact).

Numerics (SageAttention-style): Q, K and V are quantized by ``quant_passes.quantize`` (K smoothed by its mean,
per-block INT8 or FP8 Q and K with ``sm_scale · log2(e)`` folded into Q's scale, per-channel FP8 V). P is computed
as 448 · exp2(s - max) (e4m3's largest finite value; the factor rides in the exponent and cancels against the row
sum) and cast to FP8; both products accumulate in FP32.

Sparsity: ``kv_index[b, h, m, :kv_count[b, h, m]]`` lists the key blocks query block ``m`` visits, in
ascending order (so a partial tail block can only come last, the one block the kernel masks). The dense
kernel is the same code with the list implied (``j = i``), so listing every block in order gives the
dense result bit for bit; an empty list gives zeros.

On Hopper the forms run the hand-scheduled ``hopper_attention`` wherever it is faster; this kernel serves the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .lists import KeyBlockLists  # noqa: F401  (the sparse input, re-exported)
from .quant_passes import (  # noqa: F401  (the passes' names are this module's public names too)
    FP8_MAX, INT8_MAX, LOG2E, Quantized, _cdiv, checked_prepared, quantize)


@triton.jit
def _attend_block(acc, l_i, m_i, q, c_q, K, V, KS, j, b, hk, k_base, v_base, ks_base, sks, skd, svs, svd, S_K,
                  offs_n, offs_d, D: tl.constexpr,
                  BLOCK_N: tl.constexpr, LOG2_P_SCALE: tl.constexpr, TMA: tl.constexpr, MASK: tl.constexpr,
                  QUANT: tl.constexpr, INT_QK: tl.constexpr):
    """One key block into the running softmax (m_i is the row max in log2 units).

    Quantized: K and V come from the padded INT8/FP8 copies (V transposed), the score scale is the
    product of the blocks' scales, and exp2 is shifted by log2 of P's FP8 scale so that P lands directly
    in [0, 448] (l_i carries the same factor). Plain (bf16/fp16): K and V are read through the host's
    strides and P is cast to their dtype. The scale is folded into one FMA with the row max; the tail
    mask (and, plain, the masked loads) only where ``MASK`` says the block may reach past the keys.
    Plain with TMA, K and V are 4-D descriptors over the host's [B, H, S, D] strides (rows past S come
    back as zeros, so no masked loads at all).
    INT8 products become float by the magic-number trick (one integer add: the exact value |i| < 2**22
    sits in the mantissa of 1.5 * 2**23) instead of a slower int-to-float conversion."""
    cols = j * BLOCK_N + offs_n
    if TMA and QUANT:
        k = K.load([k_base + j * BLOCK_N, 0])
    elif TMA:
        k = K.load([b, hk, j * BLOCK_N, 0]).reshape([BLOCK_N, D])
    elif QUANT or not MASK:
        k = tl.load(K + k_base + cols[:, None] * sks + offs_d[None, :] * skd)
    else:
        k = tl.load(K + k_base + cols[:, None] * sks + offs_d[None, :] * skd, mask=cols[:, None] < S_K, other=0.0)
    if QUANT:
        c = c_q * tl.load(KS + ks_base + j)  # > 0, so max(raw · c) = max(raw) · c
    else:
        c = c_q
    if INT_QK:
        raw = (tl.dot(q, tl.trans(k)) + 0x4B400000).to(tl.float32, bitcast=True)  # 12582912 + product
        offset = 12582912.0
    else:
        raw = tl.dot(q, tl.trans(k))
        offset = 0.0
    if MASK:
        raw = tl.where(cols[None, :] < S_K, raw, float("-inf"))
    m_new = tl.maximum(m_i, (tl.max(raw, axis=1) - offset) * c)
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(raw * c - (m_new + offset * c - LOG2_P_SCALE)[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if TMA and QUANT:
        v = tl.trans(V.load([v_base, j * BLOCK_N]))
    elif TMA:
        v = V.load([b, hk, j * BLOCK_N, 0]).reshape([BLOCK_N, D])
    elif QUANT or not MASK:
        v = tl.trans(tl.load(V + v_base + offs_d[:, None] * svd + cols[None, :] * svs))
    else:
        v = tl.trans(tl.load(V + v_base + offs_d[:, None] * svd + cols[None, :] * svs, mask=cols[None, :] < S_K,
                             other=0.0))
    if QUANT:
        pc = p.to(tl.float8e4nv, fp_downcast_rounding="rtne")
    elif TMA:
        pc = p.to(V.dtype)
    else:
        pc = p.to(V.dtype.element_ty)
    acc = tl.dot(pc, v, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def _attn_kernel(Q, K, V, QS, KS, VS, O, KV_INDEX, KV_COUNT, sqb, sqh, sqs, sqd, skb, skh, sks, skd,
                 svb, svh, svs, svd, sob, soh, sos, sod, H, H_KV, S_Q, S_K, SQ_PAD, SK_PAD, n_m, n_n, max_list,
                 c_plain, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPARSE: tl.constexpr,
                 TMA: tl.constexpr, EVEN_K: tl.constexpr, QUANT: tl.constexpr, INT_QK: tl.constexpr):
    # Quantized, Q / K / V are the padded copies ([B·H, S_PAD, D], V as [B·H, D, S_PAD]) as pointers or,
    # with TMA, 2-D tensor descriptors loaded by Hopper's bulk tensor copy engine. Plain, they are the
    # host's tensors, read through their strides.
    # Every visited block but the last is a whole block of real keys (lists ascend, so the partial tail
    # block can only come last): the loop runs unmasked and the last block is attended apart, masked.
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // (H // H_KV)
    bhk = b * H_KV + hk
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    if QUANT:
        LOG2_P_SCALE: tl.constexpr = 8.807354922057604  # log2(448): P in [0, 448] for the FP8 cast
        c_q = tl.load(QS + bh * n_m + pid_m)
        ks_base = bhk * n_n
        if TMA:
            q = Q.load([bh * SQ_PAD + pid_m * BLOCK_M, 0])
            k_base = bhk * SK_PAD
            v_base = bhk * D
        else:
            q = tl.load(Q + (bh * SQ_PAD + offs_m[:, None]) * D + offs_d[None, :])
            k_base = bhk * SK_PAD * D
            v_base = k_base
    else:
        LOG2_P_SCALE: tl.constexpr = 0.0
        c_q = c_plain
        ks_base = 0
        if TMA:
            q = Q.load([b, h, pid_m * BLOCK_M, 0]).reshape([BLOCK_M, D])
        else:
            q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :] * sqd,
                        mask=offs_m[:, None] < S_Q, other=0.0)
        k_base = b * skb + hk * skh
        v_base = b * svb + hk * svh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    if SPARSE:
        count = tl.load(KV_COUNT + bh * n_m + pid_m)
        row = KV_INDEX + (bh * n_m + pid_m) * max_list
    else:
        count = n_n
        row = KV_INDEX
    if SPARSE:
        j = tl.load(row)  # every row has at least one slot; an empty row never uses it
    else:
        j = 0
    for i in tl.range(0, count - 1):
        if SPARSE:
            j_next = tl.load(row + i + 1)  # fetched one block ahead, so its latency hides behind this block
        else:
            j_next = i + 1
        acc, l_i, m_i = _attend_block(acc, l_i, m_i, q, c_q, K, V, KS, j, b, hk, k_base, v_base, ks_base, sks, skd,
                                      svs, svd, S_K, offs_n, offs_d, D, BLOCK_N, LOG2_P_SCALE, TMA, False, QUANT, INT_QK)
        j = j_next
    if count > 0:
        acc, l_i, m_i = _attend_block(acc, l_i, m_i, q, c_q, K, V, KS, j, b, hk, k_base, v_base, ks_base, sks, skd,
                                      svs, svd, S_K, offs_n, offs_d, D, BLOCK_N, LOG2_P_SCALE, TMA, not EVEN_K, QUANT,
                                      INT_QK)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_safe[:, None]
    if QUANT:
        out = out * tl.load(VS + bhk * D + offs_d)[None, :]  # acc and l_i both carry P's scale
    o_ptrs = O + b * sob + h * soh + offs_m[:, None] * sos + offs_d[None, :] * sod
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=offs_m[:, None] < S_Q)


@dataclass(frozen=True)
class KernelConfig:
    """The Triton schedule's tiles: query rows and key rows per block, warps and pipeline stages per program."""

    block_m: int = 128
    block_n: int = 128
    num_warps: int = 8
    num_stages: int = 3
    tma: bool = False  # load Q/K/V tiles through tensor descriptors (Hopper's bulk copy engine)


def default_config(head_dim: int, device_type: str, qk: str = "fp8", block: int | None = None,
                   tensors: tuple[torch.Tensor, ...] = ()) -> KernelConfig:
    """Tile configuration per mode and head dim: the fastest of a sweep of tiles, warps and stages at video lengths
    on Hopper. ``block``: square tiles of this size (the block size of a sparse selection's lists). ``tensors``: the
    call's Q, K, V; plain mode reads them through descriptors only where ``descriptor_ready`` says so.

    Descriptor loads (the bulk copy engine) are faster for plain mode's 16-bit tiles and for FP8's own copies at head
    dim 64, and no faster elsewhere. Triton's automatic warp specialization of the key loop ranged from 3 % slower
    to 3 % faster, so it is not used (the Hopper schedule specializes its warps by hand)."""
    if device_type != "cuda":
        b = block or 32
        return KernelConfig(b, b, 4, 1)  # interpreter: small tiles keep CPU tests quick
    if qk == "plain":
        tma = bool(tensors) and descriptor_ready(*tensors)
    else:
        tma = qk == "fp8" and head_dim < 128
    if block is not None:
        warps = 8 if head_dim >= 128 and block >= 128 and qk != "fp8" else 4
        return KernelConfig(block, block, warps, 3, tma=tma)
    if qk == "plain":
        return KernelConfig(128, 128, 8 if head_dim >= 128 else 4, 3, tma=tma)
    if qk == "fp8":
        return KernelConfig(128, 128, 4, 3, tma=tma)
    if head_dim < 128:
        return KernelConfig(128, 128, 4, 3)
    # INT8 at head dim 128: 128-row tiles at four warps turned slow and unsteady once INT8's products became floats
    # by the magic-number add; 64-row tiles did not
    return KernelConfig(64, 128, 4, 3)


QK_MODES = ("fp8", "int8", "plain")


def descriptor_ready(*tensors: torch.Tensor) -> bool:
    """Whether Hopper's bulk tensor copy can read these [B, H, S, D] tensors in place: the head dim
    innermost and contiguous, the base and every other stride a multiple of 16 bytes."""
    for t in tensors:
        size = t.element_size()
        if t.stride(3) != 1 or t.data_ptr() % 16 or any((st * size) % 16 for st in t.stride()[:3]):
            return False
    return True


def _host_descriptor(t: torch.Tensor, rows: int):
    """A 4-D descriptor over the host's own strides; a tile is ``rows`` sequence positions of one head."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, t.shape[3]])


def quant_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, qk: str = "fp8",
                    scale: float | None = None, kv_index: torch.Tensor | None = None,
                    kv_count: torch.Tensor | None = None, config: KernelConfig | None = None,
                    buffers=None, out: torch.Tensor | None = None, prepared: Quantized | None = None,
                    quantizer=None) -> torch.Tensor:
    """Non-causal attention over B, H, S, D tensors (any strides).

    qk: "fp8" (FP8 Q·Kᵀ, FP8 P·V), "int8" (INT8 Q·Kᵀ, FP8 P·V), or "plain" (no quantization: the
    host's bf16/fp16 tensors read in place through their strides, P in the same dtype, FP32
    accumulation: the same block-sparse loop at the host's precision). kv_index: int32 [B, H,
    ceil(Sq / block_m), L] key-block ids per query block, each row's first kv_count entries ascending;
    kv_count: int32 [B, H, ceil(Sq / block_m)] how many to visit. Both or neither. prepared: this call's
    quantized copies, made already (``quantize`` with ``config``'s blocks, as the sparse forms do while
    the selector pools); checked to match, never remade. quantizer: what makes the copies otherwise, with
    ``quantize``'s arguments (``quant_passes_carried.quantize_carried`` bound to a site's statistics); ``quantize``
    by default.
    """
    if qk not in QK_MODES:
        raise ValueError(f"qk must be one of {QK_MODES}, not {qk!r}")
    if (kv_index is None) != (kv_count is None):
        raise ValueError("kv_index and kv_count go together")
    B, H, SQ, D = q.shape
    HK, SK = k.shape[1], k.shape[2]
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"inputs must be bfloat16 or float16 alike, not {q.dtype}, {k.dtype}, {v.dtype}")
    if H % HK:
        raise ValueError(f"{H} query heads are not a multiple of {HK} key/value heads")
    if D not in (64, 128) or v.shape[3] != D or k.shape[3] != D:
        raise ValueError(f"head dims must be 64 or 128 and equal, got q {D}, k {k.shape[3]}, v {v.shape[3]}")
    cfg = config or default_config(D, q.device.type, qk, tensors=(q, k, v))
    quant = qk != "plain"
    if cfg.tma and not quant and not descriptor_ready(q, k, v):
        raise ValueError("tensor-descriptor loads need 16-byte aligned tensors and strides, head dim innermost")
    scale = D ** -0.5 if scale is None else float(scale)
    n_m, n_n = _cdiv(SQ, cfg.block_m), _cdiv(SK, cfg.block_n)
    if out is None:
        out = torch.empty((B, SQ, H, D), dtype=q.dtype, device=q.device).transpose(1, 2)  # B, S, H, D storage
    elif out.shape != q.shape or out.dtype != q.dtype:
        raise ValueError(f"out must be {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)} {out.dtype}")
    sparse = kv_index is not None
    if sparse:
        if kv_index.shape[:3] != (B, H, n_m) or kv_count.shape != (B, H, n_m):
            raise ValueError(f"kv_index must be [B, H, {n_m}, L] and kv_count [B, H, {n_m}] for block_m "
                             f"{cfg.block_m}; got {tuple(kv_index.shape)} and {tuple(kv_count.shape)}")
        if kv_index.shape[3] == 0:
            raise ValueError("kv_index needs at least one slot per row (kv_count may still be 0)")
        kv_index = kv_index.to(torch.int32).contiguous()
        kv_count = kv_count.to(torch.int32).contiguous()
        max_list = kv_index.shape[3]
    if quant:
        qz = checked_prepared(prepared, qk, scale, cfg.block_m, cfg.block_n, False) or (quantizer or quantize)(
            q, k, v, qk, scale, cfg, buffers)
        q_arg, k_arg, v_arg = qz.q, qz.k, qz.vt
        scales = (qz.q_scale, qz.k_scale, qz.v_scale)
        pads = (qz.sq_pad, qz.sk_pad)
        # the padded copies as plain strides: K [B·H, S_PAD, D]; V transposed, so V[s, d] sits at d·S_PAD + s
        strides = (0, 0, 0, 0) + (0, 0, D, 1) + (0, 0, 1, qz.sk_pad)
        if cfg.tma:
            from triton.tools.tensor_descriptor import TensorDescriptor

            q_arg = TensorDescriptor.from_tensor(qz.q.view(-1, D), [cfg.block_m, D])
            k_arg = TensorDescriptor.from_tensor(qz.k.view(-1, D), [cfg.block_n, D])
            v_arg = TensorDescriptor.from_tensor(qz.vt.view(-1, qz.sk_pad), [D, cfg.block_n])
    else:
        q_arg, k_arg, v_arg = q, k, v
        if cfg.tma:
            q_arg = _host_descriptor(q, cfg.block_m)
            k_arg, v_arg = _host_descriptor(k, cfg.block_n), _host_descriptor(v, cfg.block_n)
        scales = (out, out, out)  # unused placeholders
        pads = (n_m * cfg.block_m, n_n * cfg.block_n)
        strides = (*q.stride(), *k.stride(), *v.stride())
    if not sparse:
        kv_index = kv_count = scales[0]  # unused placeholders
        max_list = 0
    _attn_kernel[(n_m, B * H)](
        q_arg, k_arg, v_arg, *scales, out, kv_index, kv_count, *strides, *out.stride(),
        H, HK, SQ, SK, *pads, n_m, n_n, max_list, scale * LOG2E,
        D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SPARSE=sparse, TMA=cfg.tma,
        EVEN_K=SK % cfg.block_n == 0, QUANT=quant, INT_QK=qk == "int8", num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out
