"""FlashAttention-3 (the ``fa3-fwd`` wheel, a forward-only Hopper build) as forms: ``fa3`` exact, ``fa3_fp8`` bounded.

What the package is (fa3-fwd 0.0.3, read from its wheel; it follows hopper/flash_api_stable.cpp and
hopper/flash_attn_interface.py of Dao-AILab/flash-attention):
- Modules ``fa3_fwd_interface`` (Python API), ``fa3_fwd._C`` (the kernels, registering ``torch.ops.fa3_fwd.fwd``
  on import through torch's stable ABI; it links libcudart.so.13) and ``fa3_fwd_config`` (its build flags).
  It declares torch, einops, packaging and ninja as requirements; the forward path imports only torch.
- ``flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
  v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1, pack_gqa=None,
  deterministic=False, sm_margin=0, return_attn_probs=False)``: q [B, Sq, H, D], k and v [B, Skv, Hkv, D(v)],
  each with a contiguous last dimension (other strides are passed through); returns the output [B, Sq, H, Dv]
  (and the log-sum-exp [B, H, Sq] in float32 with ``return_attn_probs=True``). It goes through an autograd
  Function and a ``torch.library.custom_op`` (``fa3_fwd::_flash_attn_forward``, with a fake for tracing) into
  ``torch.ops.fa3_fwd.fwd``, which returns (out, lse, out_accum, lse_accum).
- The build: backward, paged KV, local (sliding window) attention and **fp16** are compiled out (an fp16 call
  raises "This flash attention build does not support FP16"); bf16 and FP8 e4m3 in, head dims 64, 96, 128, 192
  and 256 (a call's head dim is rounded up to one of them; at most 256), kernels for sm_90a (and an sm_80 path
  for bf16), none for Blackwell. Head dims must be multiples of 8 (16 for FP8). A value head dim other than the
  query's only on Hopper, for (D in (128, 192], Dv in (96, 128]) or (D <= 64, Dv <= 512). Grouped-query
  attention: Hkv must divide H. Queries and keys may differ in length; a causal mask is aligned to the
  bottom-right corner (SDPA's to the top-left), so the two agree only when the lengths are equal.
- FP8: q, k, v all float8_e4m3fn in the same B, S, H, D layout (V is not transposed by the caller; this build
  has no column-major V); ``q_descale``, ``k_descale``, ``v_descale`` float32 of shape (B, Hkv) each (Q's too is
  per key/value head), meaning x ~ x8 * descale: Q's and K's multiply the softmax scale, V's the output.
  The output is bf16 whatever the inputs were.

Forms here: ``fa3`` serves bf16 calls as they come (B, H, S, D views transposed back, free for diffusers'
B, S, H, D tensors). ``fa3_fp8`` quantizes Q, K and V with ``kernels.fp8_heads`` (per-(batch, kv head) scales,
K smoothed by its mean) into the form's workspace and runs FA3's FP8 kernel with those descales; fp16 callers
get the bf16 output cast back. From a site's second call at a shape on, the quantization reads the inputs once, at
the scales the site's previous call left (``kernels.fp8_heads_carried``; ``_quantizer`` says when).
Eager calls go straight to ``torch.ops.fa3_fwd.fwd``, skipping the autograd
Function and the custom op's Python dispatch (host time at image lengths, where the kernel takes 0.3 ms); under
``torch.compile`` the package's custom op is called instead, since it carries the fake implementation. Inside a
compiled graph ``fa3_fp8`` is one opaque op (``ops.fa3_fp8``: the two Triton passes, then FA3's kernel), or with
``DITGATE_FA3_FP8_GRAPH=traced`` its quantization in torch ops (``fp8_heads_traced``) before FA3's kernel alone
(``ops.fa3_fp8_quantized``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os

import torch

from .base import Availability, AttentionCall, AttentionInputs, Form, FormSpec, Precision
from .carried import CarriedStatistics
from .fp8_heads_traced import quantize_heads_traced
from .workspace import WorkspacePool

_PACKAGE = "fa3-fwd"
_HINT = "pip install 'ditgate[fa3]'"


def _version() -> str | None:
    for name in (_PACKAGE, "fa3_fwd"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _causal_reasons(call: AttentionCall) -> list[str]:
    if call.is_causal and call.seq_q != call.seq_kv:
        return [f"causal with {call.seq_q} queries and {call.seq_kv} keys: FlashAttention-3 aligns the mask to the "
                "bottom-right corner, SDPA to the top-left"]
    return []


class _FlashAttn3Base(Form):
    """The package's probe and call, shared by both forms."""

    def __init__(self) -> None:
        super().__init__()
        self._interface = None

    def _probe(self) -> Availability:
        version = _version()
        if not torch.cuda.is_available():
            return Availability(False, "no CUDA device" + ("" if version else f"; fa3-fwd not installed ({_HINT})"),
                                version)
        major, minor = torch.cuda.get_device_capability()
        if major != 9:
            return Availability(False, f"needs a Hopper GPU (compute capability 9.x); this GPU is {major}.{minor}",
                                version)
        try:
            import fa3_fwd_interface
        except Exception as exc:  # ImportError, or its library failing to load (libcudart.so.13, torch's ABI)
            hint = _HINT if version is None else "installed but failed to import"
            return Availability(False, f"fa3_fwd_interface not importable ({hint}): {type(exc).__name__}: {exc}",
                                version)
        self._interface = fa3_fwd_interface
        return Availability(True, "", version)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, causal: bool,
                descale: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """FA3 on B, S, H, D tensors; returns the output [B, Sq, H, Dv]."""
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        q_descale, k_descale, v_descale = descale if descale is not None else (None, None, None)
        if torch.compiler.is_compiling():
            return self._interface.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, q_descale=q_descale,
                                                   k_descale=k_descale, v_descale=v_descale)
        return torch.ops.fa3_fwd.fwd(q, k, v, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                                     softmax_scale=scale, is_causal=causal, num_splits=1)[0]


class FlashAttn3(_FlashAttn3Base):
    spec = FormSpec(
        name="fa3",
        precision=Precision.EXACT,
        description="FlashAttention-3 (fa3-fwd, forward only), Hopper, bf16",
        devices=frozenset({"cuda"}),
        dtypes=frozenset({"bfloat16"}),  # this build has no fp16 kernels
        max_head_dim=256,
        min_capability=(9, 0),
        max_capability=(9, 0),
        equal_head_dims=False,
        package=_PACKAGE,
    )

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        reasons = _causal_reasons(call)
        d, dv = call.head_dim, call.head_dim_v
        if d % 8 or dv % 8:
            reasons.append(f"head dims ({d}, {dv}) must be multiples of 8")
        if dv != d and not (128 < d <= 192 and 96 < dv <= 128) and not (d <= 64 and dv <= 512):
            reasons.append(f"head dims ({d}, {dv}): a value head dim differing from the query's needs D in (128, 192] "
                           "with Dv in (96, 128], or D <= 64 with Dv <= 512")
        return reasons

    def run(self, inputs: AttentionInputs) -> torch.Tensor:
        q, k, v = (t.transpose(1, 2) for t in (inputs.query, inputs.key, inputs.value))
        return self._attend(q, k, v, inputs.scale, inputs.is_causal).transpose(1, 2)

    def run_lse(self, inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """The kernel's own log-sum-exp ([B, H, Sq] float32) beside the output (eager calls only: the ring path
        that asks for it runs outside compiled graphs)."""
        q, k, v = (t.transpose(1, 2) for t in (inputs.query, inputs.key, inputs.value))
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        out, lse = torch.ops.fa3_fwd.fwd(q, k, v, softmax_scale=inputs.scale, is_causal=inputs.is_causal,
                                         num_splits=1)[:2]
        return out.transpose(1, 2), lse


class FlashAttn3Fp8(_FlashAttn3Base):
    spec = FormSpec(
        name="fa3_fp8",
        precision=Precision.BOUNDED,
        description="FlashAttention-3 FP8 (fa3-fwd) over ditgate's per-head e4m3 copies, K smoothed",
        devices=frozenset({"cuda"}),
        dtypes=frozenset({"float16", "bfloat16"}),
        max_head_dim=256,
        min_capability=(9, 0),
        max_capability=(9, 0),
        package=_PACKAGE,
        error_bound="e4m3 Q, K, V with one scale per (batch, kv head), K less its mean, FA3's FP8 P.V: "
                    "cosine per call below the bf16 kernels' (the gate measures each site)",
    )
    # its quantization (Triton) compiles ahead: nothing it reads back; FA3's kernel then runs once on that call's
    # unwritten copies (it is not run in a thread: fa3-fwd failed there on an H100)
    compiles_ahead = True

    def __init__(self) -> None:
        super().__init__()
        self._quantize = self._carried = self._accumulator_size = self._recording = None
        self._pool: WorkspacePool | None = None
        self._statistics = CarriedStatistics("fa3_fp8", lambda q, k: self._accumulator_size(q, k), torch.int64)
        # quantize in one pass at the scales a site's previous call left (``kernels.fp8_heads_carried``);
        # DITGATE_FA3_FP8_CARRY=0 keeps every call on the two passes
        self.carry_scales = os.environ.get("DITGATE_FA3_FP8_CARRY") != "0"
        # how a compiled graph quantizes: "op" (the Triton passes) or "traced" (torch ops, for the compiler)
        self.graph_quantization = _graph_quantization(os.environ.get("DITGATE_FA3_FP8_GRAPH", "op"))

    def _probe(self) -> Availability:
        avail = super()._probe()
        if not avail.available:
            return avail
        if importlib.util.find_spec("triton") is None:
            return Availability(False, "triton not installed (pip install 'ditgate[triton]')", avail.version)
        try:
            from ..kernels.fp8_heads import accumulator_size, quantize_heads
            from ..kernels.fp8_heads_carried import quantize_heads_carried
            from ..kernels.launches import recording
        except Exception as exc:
            return Availability(False, f"quantization kernel failed to load: {type(exc).__name__}: {exc}",
                                avail.version)
        self._quantize, self._carried = quantize_heads, quantize_heads_carried
        self._accumulator_size, self._recording = accumulator_size, recording
        return avail

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        reasons = _causal_reasons(call)
        if call.head_dim % 16:
            reasons.append(f"head dim {call.head_dim} must be a multiple of 16 for FP8")
        return reasons

    def run(self, inputs: AttentionInputs) -> torch.Tensor:
        q = inputs.query
        if self._pool is None:
            self._pool = WorkspacePool()
        pool, device = self._pool, q.device
        return fp8_attention(self._quantizer(inputs), self._attend, q, inputs.key, inputs.value, inputs.scale,
                             inputs.is_causal,
                             buffers=lambda shape, dtype, name: pool.get(shape, dtype, device, f"fa3_fp8:{name}"))

    def _quantizer(self, inputs: AttentionInputs):
        """How this call is quantized: in one pass at the scales its site's previous call at this shape left
        (``kernels.fp8_heads_carried``) where the router names the site and that site has called at this shape
        before; else in two passes, keeping the statistics for the site's next call (``forms.carried``). A call with
        no site (a benchmark, the context-parallel path) takes two passes and keeps nothing."""
        if inputs.site is None or not self.carry_scales:
            return self._quantize
        two_passes, one_pass = self._quantize, self._carried

        def first(into):
            return lambda q, k, v, buffers=None: two_passes(q, k, v, buffers=buffers, accumulators=into)

        def carried(last, into, repaired):
            return lambda q, k, v, buffers=None: one_pass(q, k, v, last, into, repaired, buffers)

        return self._statistics.quantizer(self._pool, inputs, first, carried, self._recording())

    def repaired_heads(self) -> int:
        """Heads the one-pass quantization quantized again since this form was made or released, because the scale
        carried from the site's previous call did not hold (reads the device's counters: synchronises)."""
        return self._statistics.repaired_heads()

    def in_graph(self, inputs: AttentionInputs) -> torch.Tensor:
        """One custom op (``ops.fa3_fp8``): the two Triton passes, then FA3's kernel; its copies come from torch's
        allocator there, not this plan's pool. ``graph_quantization = "traced"`` (``DITGATE_FA3_FP8_GRAPH=traced``)
        quantizes with torch ops instead (``fp8_heads_traced``), for the compiler to fuse into the kernels that
        make Q, K and V, and calls FA3's kernel alone (``ops.fa3_fp8_quantized``): at Flux 1024 on an H100 that
        launched more kernels and lost to the op (docs/kernels.md)."""
        q, k, v = inputs.query, inputs.key, inputs.value
        if self.graph_quantization != "traced":
            return torch.ops.ditgate.fa3_fp8(q, k, v, inputs.scale, inputs.is_causal)
        q8, k8, v8, descale = quantize_heads_traced(q, k, v)
        out = torch.ops.ditgate.fa3_fp8_quantized(q8, k8, v8, descale, inputs.scale, inputs.is_causal)
        return out if out.dtype == q.dtype else out.to(q.dtype)

    def resident_bytes(self) -> int:
        return self._pool.bytes() if self._pool is not None else 0

    def release(self) -> None:
        self._statistics.clear()
        if self._pool is not None:
            self._pool.release()


def _graph_quantization(setting: str) -> str:
    """``DITGATE_FA3_FP8_GRAPH`` checked: "op" or "traced"; anything else is a mistake, said once, and the op serves."""
    if setting in ("op", "traced"):
        return setting
    logging.getLogger("ditgate").warning("ditgate: DITGATE_FA3_FP8_GRAPH=%r is neither 'op' nor 'traced'; fa3_fp8 "
                                         "keeps its Triton passes (the op) inside compiled graphs", setting)
    return "op"


def fp8_attention(quantize, attend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None,
                  causal: bool, buffers=None) -> torch.Tensor:
    """FA3's FP8 kernel over per-head e4m3 copies of B, H, S, D ``q``, ``k``, ``v`` (``quantize``:
    ``kernels.fp8_heads.quantize_heads``; ``attend``: FA3 on B, S, H, D tensors with descales), in ``q``'s dtype."""
    z = quantize(q, k, v, buffers=buffers)
    out = attend(z.query, z.key, z.value, scale, causal, descale=(z.descale[0], z.descale[1], z.descale[2]))
    out = out.transpose(1, 2)
    return out if out.dtype == q.dtype else out.to(q.dtype)
