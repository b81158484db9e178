"""What a form is: a declared envelope, an availability probe, and the call itself.

A form answers two questions before it is ever run: is it installed here (``availability``), and
can it serve *this* call (``not_supported_reasons``). Both answers are plain sentences so that the
router and the gate can write them down instead of raising. The declaration style follows xformers'
fmha ops: capabilities are data, the check is generic, and a form adds only what is peculiar to it.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch


class Precision(str, enum.Enum):
    """Whether a form computes the same function as the host up to rounding, or a bounded approximation."""

    EXACT = "exact"
    BOUNDED = "bounded"


class MaskKind(str, enum.Enum):
    NONE = "none"
    BOOLEAN = "boolean"
    ADDITIVE = "additive"
    BLOCK = "block"


def mask_kind_of(mask: object) -> MaskKind:
    if mask is None:
        return MaskKind.NONE
    if isinstance(mask, torch.Tensor):
        return MaskKind.BOOLEAN if mask.dtype == torch.bool else MaskKind.ADDITIVE
    return MaskKind.BLOCK


@dataclass(frozen=True)
class AttentionCall:
    """Everything about one attention call that decides which forms may serve it (no tensors).

    Tensors are described in the B, H, S, D convention whatever layout the host used.
    """

    batch: int
    heads_q: int
    heads_kv: int
    seq_q: int
    seq_kv: int
    head_dim: int
    head_dim_v: int
    dtype: str
    device_type: str
    capability: tuple[int, int] | None
    mask: MaskKind
    is_causal: bool
    dropout_p: float
    enable_gqa: bool
    needs_grad: bool

    @property
    def shape_key(self) -> str:
        """The key a verdict holds for: shape, dtype and mask kind (and causality), nothing else."""
        return (
            f"B{self.batch}:Hq{self.heads_q}:Hkv{self.heads_kv}:Sq{self.seq_q}:Skv{self.seq_kv}:"
            f"D{self.head_dim}:Dv{self.head_dim_v}:{self.dtype}:mask={self.mask.value}"
            f":causal={int(self.is_causal)}"
        )

    @property
    def flops(self) -> float:
        """Multiply-adds of Q·Kᵀ and P·V counted as 2 FLOPs each (the usual 4·H·S²·D)."""
        return 2.0 * self.batch * self.heads_q * self.seq_q * self.seq_kv * (self.head_dim + self.head_dim_v)

    def shapes_text(self) -> str:
        return (
            f"q[{self.batch},{self.heads_q},{self.seq_q},{self.head_dim}] "
            f"kv[{self.batch},{self.heads_kv},{self.seq_kv},{self.head_dim}]"
        )


def describe_call(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: object,
    dropout_p: float,
    is_causal: bool,
    enable_gqa: bool,
    capability: tuple[int, int] | None,
) -> AttentionCall:
    """Describe a call whose tensors are already in B, H, S, D."""
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    return AttentionCall(
        batch=query.shape[0],
        heads_q=query.shape[1],
        heads_kv=key.shape[1],
        seq_q=query.shape[2],
        seq_kv=key.shape[2],
        head_dim=query.shape[3],
        head_dim_v=value.shape[3],
        dtype=str(query.dtype).removeprefix("torch."),
        device_type=query.device.type,
        capability=capability,
        mask=mask_kind_of(attn_mask),
        is_causal=bool(is_causal),
        dropout_p=float(dropout_p),
        enable_gqa=bool(enable_gqa),
        needs_grad=needs_grad,
    )


@dataclass(frozen=True)
class FormSpec:
    """The declared envelope of a form. Every field is checked by ``spec_reasons``."""

    name: str
    precision: Precision
    description: str
    devices: frozenset[str]
    dtypes: frozenset[str]
    mask_kinds: frozenset[MaskKind] = frozenset({MaskKind.NONE})
    head_dims: frozenset[int] | None = None  # None: any head dim up to max_head_dim
    max_head_dim: int = 256
    min_capability: tuple[int, int] | None = None  # CUDA only
    max_capability: tuple[int, int] | None = None
    gqa: bool = True
    causal: bool = True
    cross: bool = True  # keys of a different length than queries
    dropout: bool = False
    backward: bool = False
    equal_head_dims: bool = True  # value head dim must equal query head dim
    package: str | None = None  # the distribution whose version a receipt records
    error_bound: str | None = None  # for bounded forms: the declared envelope of the error
    # compiles a kernel for every new shape on its first call (seconds each): the gate measures it only where the
    # caller names it, so that calibration does not pay a compile per shape key for a form that has not won on
    # the GPUs measured (compiled flex trails cuDNN and flash-attn-4 at every shape of DESIGN.md's anchors)
    compiles_per_shape: bool = False

    @property
    def takes_selection(self) -> bool:
        """A block-sparse consumer: it serves key-block lists only, which the sparse stage supplies."""
        return self.mask_kinds == frozenset({MaskKind.BLOCK})


def spec_reasons(spec: FormSpec, call: AttentionCall) -> list[str]:
    """Reasons, from the declaration alone, why ``spec`` cannot serve ``call``."""
    reasons: list[str] = []
    if call.device_type not in spec.devices:
        reasons.append(f"device {call.device_type} not in {sorted(spec.devices)}")
    if call.dtype not in spec.dtypes:
        reasons.append(f"dtype {call.dtype} not in {sorted(spec.dtypes)}")
    if call.mask not in spec.mask_kinds:
        reasons.append(f"mask kind {call.mask.value} not supported (serves {sorted(m.value for m in spec.mask_kinds)})")
    if spec.head_dims is not None and call.head_dim not in spec.head_dims:
        reasons.append(f"head dim {call.head_dim} not in {sorted(spec.head_dims)}")
    if call.head_dim > spec.max_head_dim:
        reasons.append(f"head dim {call.head_dim} > {spec.max_head_dim}")
    if spec.equal_head_dims and call.head_dim_v != call.head_dim:
        reasons.append(f"value head dim {call.head_dim_v} differs from query head dim {call.head_dim}")
    if call.heads_q != call.heads_kv:
        if not spec.gqa:
            reasons.append(f"grouped-query attention ({call.heads_q} query / {call.heads_kv} kv heads) not supported")
        elif call.heads_q % call.heads_kv:
            reasons.append(f"{call.heads_q} query heads not a multiple of {call.heads_kv} kv heads")
    if call.is_causal and not spec.causal:
        reasons.append("causal attention not supported")
    if call.seq_q != call.seq_kv and not spec.cross:
        reasons.append(f"query length {call.seq_q} differs from key length {call.seq_kv}")
    if call.dropout_p > 0 and not spec.dropout:
        reasons.append(f"dropout {call.dropout_p} not supported")
    if call.needs_grad and not spec.backward:
        reasons.append("inputs require grad and the form has no backward")
    if call.device_type == "cuda" and call.capability is not None:
        if spec.min_capability is not None and call.capability < spec.min_capability:
            reasons.append(f"compute capability {call.capability} < {spec.min_capability}")
        if spec.max_capability is not None and call.capability > spec.max_capability:
            reasons.append(f"compute capability {call.capability} > {spec.max_capability}")
    return reasons


@dataclass(frozen=True)
class Availability:
    available: bool
    reason: str = ""
    version: str | None = None


@dataclass(frozen=True)
class AttentionInputs:
    """The tensors of one call, in B, H, S, D (views of the host's tensors, never copies)."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_mask: object = None
    scale: float | None = None
    is_causal: bool = False
    dropout_p: float = 0.0
    enable_gqa: bool = False
    # what a block-sparse form made of these tensors while the selector pooled them (its quantized copies:
    # ``Form.pool_for_selection``), handed back to that form's ``run`` so that it does not make them again
    prepared: object = None
    # rows from this one on are zeros in the host's output: its mask hid those queries from every key (padding
    # that the router cut from the keys, ``sparse.padding``); ``finish`` writes them, whatever form ran
    zero_rows_from: int | None = None
    # the site's name where the router made the call (None elsewhere: a benchmark, a compiled graph): what a form
    # that keeps statistics from one call of a site to its next keys them by (``fa3_fp8``'s carried scales)
    site: str | None = None

    def finish(self, out: torch.Tensor) -> torch.Tensor:
        """A form's output ([B, H, S, D]) as the host's would be: the rows its mask hid, zeroed."""
        if self.zero_rows_from is not None:
            out[:, :, self.zero_rows_from:] = 0
        return out


@dataclass(frozen=True)
class PooledTiles:
    """A block-sparse form's answer to ``pool_for_selection``: the selector's pooled tiles, made in a pass
    over Q and K that the form makes anyway, and what else that pass made for the form's own run."""

    query: torch.Tensor  # float32 [B, H, query tiles, D]: each tile's mean
    key: torch.Tensor  # float32 [B, Hkv, key tiles, D]
    prepared: object  # back to the form as ``AttentionInputs.prepared``


class Probed:
    """What every form, attention or linear, declares: a ``spec`` (with ``name`` and ``precision``) and an
    availability probe (``_probe``: import and hardware checks), run once per instance, that never raises."""

    def __init__(self) -> None:
        self._availability: Availability | None = None
        self.probe_s = 0.0  # what the probe took (imports: flash-attn-4's CuTe DSL takes seconds)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def precision(self) -> Precision:
        return self.spec.precision

    def availability(self) -> Availability:
        if self._availability is None:
            started = time.perf_counter()
            try:
                self._availability = self._probe()
            except Exception as exc:  # a probe must never take the process down
                self._availability = Availability(False, f"probe failed: {type(exc).__name__}: {exc}")
            self.probe_s = time.perf_counter() - started
        return self._availability

    def _probe(self) -> Availability:
        raise NotImplementedError


class Form(Probed):
    """One executable attention implementation.

    Subclasses set ``spec``, implement ``_probe`` (import and hardware checks, run once per form
    instance) and ``run``. Instances are made per ``Plan`` (see ``registry.create_forms``) so that any
    compiled callable or workspace a form holds lives and dies with that plan.
    """

    spec: FormSpec
    # its first call may run in a thread beside other forms' first calls while a contest warms up (``gate.warm``).
    # Opt-in: only a form whose first call compiles (so that overlapping pays) and that touches no process-wide state
    # (torch's SDPA forms set the global backend flags through ``sdpa_kernel``; two threads restoring them in the
    # wrong order leave them changed for the host and the user)
    warms_in_thread: bool = False
    # its first call may be made once with Triton's launches recorded, not run, so that its kernels compile beside
    # every other's before the real first call (``gate.compile_ahead``). Opt-in: only a form whose Python reads no
    # value its own kernels wrote (their outputs hold garbage in that call)
    compiles_ahead: bool = False

    def not_supported_reasons(self, call: AttentionCall, probe: bool = True) -> list[str]:
        """Why this form cannot serve ``call``; ``probe=False``: the declared envelope only, without the availability
        probe (its imports), for a gate that may learn from known timings that it need not run the form at all."""
        if probe:
            avail = self.availability()
            if not avail.available:
                return [f"unavailable: {avail.reason}"]
        return spec_reasons(self.spec, call) + self.extra_reasons(call)

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        """Reasons peculiar to this form beyond the declared envelope."""
        return []

    def selection_rows(self, call: AttentionCall, block: int) -> int | None:
        """For a block-sparse consumer: the query rows per tile it wants its selection in, the key tiles
        being ``block`` rows (a kernel whose program covers more query rows than that asks for taller
        tiles), or None for the sparse setting's square tiles."""
        return None

    def pool_for_selection(self, call: AttentionCall, inputs: AttentionInputs, rows: int,
                           block: int) -> PooledTiles | None:
        """For a block-sparse consumer that reads all of Q and K before its kernel anyway (to quantize them):
        the tile means the selector needs (``rows`` query rows, ``block`` keys per tile) from that same
        read, and what it made, or None to let the selector pool for itself."""
        return None

    def run(self, inputs: AttentionInputs) -> torch.Tensor:
        """Compute attention; returns B, H, Sq, Dv in the query's dtype."""
        raise NotImplementedError

    def in_graph(self, inputs: AttentionInputs) -> torch.Tensor:
        """The call as a torch.compile graph is to hold it (dynamo traces this; it never runs eagerly in a trace).
        By default ``run`` itself, which suits forms made of torch operations; a form whose call dynamo cannot
        trace (a kernel launch with host-side state, a library's own dispatch) serves it through a
        ``torch.library`` custom op with a fake implementation (``forms.ops``), opaque to the compiler."""
        return self.run(inputs)

    def run_lse(self, inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention (as ``run``) and each query row's log-sum-exp of its scaled scores (B, H, Sq; float32): what a
        caller that merges partial results over chunks of the keys needs (diffusers' ring attention). A form whose
        kernel does not give it keeps this default, and ``returns_lse`` says so."""
        raise NotImplementedError(f"{self.name} returns no log-sum-exp")

    @property
    def returns_lse(self) -> bool:
        return type(self).run_lse is not Form.run_lse

    def resident_bytes(self) -> int:
        """Device memory this form holds between calls (workspaces, quantized copies)."""
        return 0

    def repaired_heads(self) -> int:
        """Heads whose copies a one-read quantization made again because the statistics carried from their site's
        previous call did not hold (``forms.carried``); 0 for forms that carry nothing."""
        return 0

    def release(self) -> None:
        """Drop anything held between calls; called when the form lost the gate everywhere."""


@dataclass(frozen=True)
class FormInfo:
    """One line of ``ditgate doctor``: a form, whether it can run here, and why not."""

    name: str
    precision: str
    available: bool
    reason: str
    version: str | None
    description: str
    envelope: dict = field(default_factory=dict)


def envelope_of(spec: FormSpec) -> dict:
    return {
        "devices": sorted(spec.devices),
        "dtypes": sorted(spec.dtypes),
        "masks": sorted(m.value for m in spec.mask_kinds),
        "head_dims": sorted(spec.head_dims) if spec.head_dims else f"<= {spec.max_head_dim}",
        "min_capability": spec.min_capability,
        "gqa": spec.gqa,
        "causal": spec.causal,
        "cross": spec.cross,
        "error_bound": spec.error_bound,
    }
