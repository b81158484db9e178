"""Resolved routes: what one site does with a call of one signature, decided once and replayed.

Deciding a route (describing the call, asking the chooser, checking the form's reasons) costs tens of
microseconds of Python; serving a call should cost a dictionary lookup. So each site keeps, per *call
signature* (the raw shapes, dtype, device, mask, flags: everything a decision may depend on, read without
formatting a string), the route it resolved to, and drops them all when the plan's generation changes (a new
verdict, a chooser mode, a disabled form, detach). A route replays the decision on every call of its signature:

- ``HostRoute``: the host serves, with the reason;
- ``FormRoute``: the form runs on the call as it is (a raise hands the call to the host, counted);
- ``PreparedRoute``: the form runs after ``SiteRouter.prepare`` (a padding cut or a sparse selection, which
  depend on the call's data, so they are made on every call);
- ``MeasureRoute``: the chooser measures this call (never kept: the next call decides again).

Inside a torch.compile trace the same decision is made at trace time instead (``traced.TracedSite``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import torch

from ..forms import AttentionCall, AttentionInputs, Form, MaskKind
from .ledger import HOST

if TYPE_CHECKING:
    from .site import SiteRouter

HostFn = Callable[[], torch.Tensor]
ToHostLayout = Callable[[torch.Tensor], torch.Tensor]


class CallArgs(NamedTuple):
    """One call's tensors in B, H, S, D and its flags, as the entry received them."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_mask: object
    scale: float | None
    is_causal: bool
    dropout_p: float
    enable_gqa: bool

    def inputs(self, site: str | None = None) -> AttentionInputs:
        return AttentionInputs(self.query, self.key, self.value, self.attn_mask, self.scale, self.is_causal,
                               self.dropout_p, self.enable_gqa, site=site)


def mask_signature(mask: object) -> object:
    """What a decision may read of a mask: none, or a tensor's dtype and shape, or the type of anything else."""
    if mask is None:
        return None
    if isinstance(mask, torch.Tensor):
        return mask.dtype, mask.shape
    return type(mask)


def signature(args: CallArgs) -> tuple:
    """The key a site's routes are kept under: every input of ``describe_call``, raw (no strings built)."""
    q, k, v = args.query, args.key, args.value
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return (q.shape, k.shape, v.shape, q.dtype, q.device, mask_signature(args.attn_mask), bool(args.is_causal),
            float(args.dropout_p), bool(args.enable_gqa), needs_grad)


def call_of(sig: tuple, capability: tuple[int, int] | None) -> AttentionCall:
    """The ``AttentionCall`` a signature describes (the same as ``forms.describe_call`` on its tensors)."""
    q_shape, k_shape, v_shape, dtype, device, mask, is_causal, dropout_p, enable_gqa, needs_grad = sig
    if mask is None:
        kind = MaskKind.NONE
    elif isinstance(mask, tuple):
        kind = MaskKind.BOOLEAN if mask[0] == torch.bool else MaskKind.ADDITIVE
    else:
        kind = MaskKind.BLOCK
    return AttentionCall(
        batch=q_shape[0], heads_q=q_shape[1], heads_kv=k_shape[1], seq_q=q_shape[2], seq_kv=k_shape[2],
        head_dim=q_shape[3], head_dim_v=v_shape[3], dtype=str(dtype).removeprefix("torch."), device_type=device.type,
        capability=capability, mask=kind, is_causal=is_causal, dropout_p=dropout_p, enable_gqa=enable_gqa,
        needs_grad=needs_grad)


class Route:
    """One resolved decision of one site for one signature."""

    name: str  # a form name, or "host"
    reason: str = ""
    keep = True  # False: decide again on the next call

    def __init__(self, call: AttentionCall) -> None:
        self.call = call
        self.tally_key = (self.name, self.reason)

    def serve(self, site: SiteRouter, args: CallArgs, host: HostFn, to_host: ToHostLayout) -> torch.Tensor:
        raise NotImplementedError


class HostRoute(Route):
    def __init__(self, call: AttentionCall, reason: str) -> None:
        self.name, self.reason = HOST, reason
        super().__init__(call)

    def serve(self, site, args, host, to_host):
        if site.context.tally:
            site.ledger.routes[self.tally_key] += 1
        return host()


class FormRoute(Route):
    def __init__(self, call: AttentionCall, form: Form) -> None:
        self.name, self.form = form.name, form
        super().__init__(call)

    def serve(self, site, args, host, to_host):
        try:
            out = self.form.run(args.inputs(site.name))
        except Exception as exc:  # never fail a call the host could serve
            return site.failed(self.form, exc, self.call, host)
        if site.context.tally:
            site.ledger.routes[self.tally_key] += 1
        return to_host(out)


class PreparedRoute(FormRoute):
    """A form whose call is prepared per call (``SiteRouter.prepare``): the padding cut, the sparse selection."""

    def serve(self, site, args, host, to_host):
        return site.serve_prepared(self.form, self.call, args.inputs(site.name), host, to_host)


class SelectedRoute(FormRoute):
    """A block-sparse form inside a compiled graph: the sparse stage selects there (``SparseStage.
    graph_selection``); resolved at trace time only, never served eagerly."""


class MeasureRoute(Route):
    keep = False

    def __init__(self, call: AttentionCall) -> None:
        self.name, self.reason = HOST, "calibrating"
        super().__init__(call)

    def serve(self, site, args, host, to_host):
        if site.context.tally:
            site.ledger.routes[self.tally_key] += 1
        site.observe(self.call, HOST, self.reason)
        return site.context.chooser.measure(site, self.call, args.inputs(site.name), host, to_host)
