"""The form registry: which forms exist, in which default order, and how to make them per plan.

The registry itself holds only classes (immutable); ``create_forms`` makes fresh instances so that
whatever a form compiles or allocates belongs to one plan and goes away with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .base import Form, FormInfo, envelope_of
from .fa3 import FlashAttn3, FlashAttn3Fp8
from .fa4 import FlashAttn4, FlashAttn4Sparse
from .flex import FlexCompiled, FlexSparse
from .quant import BlockSparseAttention, Fp8Attention, Fp8SparseAttention, Int8Attention, Int8SparseAttention
from .sage import SageAttention
from .sdpa import SdpaCudnn, SdpaEfficient, SdpaFlash, SdpaMath

# Exact forms in the documented static priority: fastest measured on Hopper first (DESIGN.md
# anchors: flash-attn-4 > cuDNN > torch flash); flex is exact but compiles per shape, so it comes
# after the kernels that need no compilation; math is the universal last resort. FlashAttention-3
# comes after flash-attn-4: it is the faster of the two at head dim 128 and the slower at 64 (DESIGN.md,
# H100), an order cannot say "per head dim" without a form refusing calls it serves, and fa4 serves more
# (fp16, Blackwell, backward); the gate, which measures both, picks fa3 where it wins.
EXACT_PRIORITY: tuple[str, ...] = ("fa4", "fa3", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "flex", "sdpa_math")
# ditgate's own 8-bit forms win from video lengths up; fa3_fp8 (FA3's FP8 kernel over per-head copies) where
# their fixed costs lose, at image lengths (issue 33); the gate measures all of them per shape.
BOUNDED_PRIORITY: tuple[str, ...] = ("fp8", "int8", "fa3_fp8", "sage")
# Block-sparse consumers: measured only for plans with a sparse setting (attach(..., sparse=...)).
SPARSE_PRIORITY: tuple[str, ...] = ("fa4_sparse", "block_sparse", "fp8_sparse", "int8_sparse", "flex_sparse")

_FORM_CLASSES: dict[str, type[Form]] = {
    cls.spec.name: cls
    for cls in (FlashAttn4, FlashAttn3, SdpaCudnn, SdpaFlash, SdpaEfficient, FlexCompiled, SdpaMath, SageAttention,
                Fp8Attention, Int8Attention, Fp8SparseAttention, Int8SparseAttention, BlockSparseAttention,
                FlexSparse, FlashAttn4Sparse, FlashAttn3Fp8)
}


class UnknownFormError(ValueError):
    pass


def known_form_names() -> tuple[str, ...]:
    listed = EXACT_PRIORITY + BOUNDED_PRIORITY + SPARSE_PRIORITY
    return listed + tuple(n for n in _FORM_CLASSES if n not in listed)


def check_form_names(names: Iterable[str], extra: Iterable[str] = ()) -> tuple[str, ...]:
    names = tuple(names)
    known = set(known_form_names()) | set(extra)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UnknownFormError(
            f"unknown form name(s) {unknown}; known forms: {', '.join(known_form_names() + tuple(extra))}"
        )
    return names


def create_forms(names: Sequence[str] | None = None) -> dict[str, Form]:
    """Fresh form instances, by name, in priority order (all known forms when ``names`` is None)."""
    wanted = check_form_names(names) if names is not None else known_form_names()
    return {name: _FORM_CLASSES[name]() for name in wanted}


def form_info(form: Form) -> FormInfo:
    avail = form.availability()
    return FormInfo(name=form.name, precision=form.precision.value, available=avail.available, reason=avail.reason,
                    version=avail.version, description=form.spec.description, envelope=envelope_of(form.spec))


def describe_forms() -> list[FormInfo]:
    return [form_info(f) for f in create_forms().values()]
