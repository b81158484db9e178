"""What a torch.compile graph sees of a site: the route decided at trace time, traced like the host's code.

Inside a trace, ``ModuleRouter.next_site`` hands the entry a ``TracedSite`` (made in the trace, so dynamo
needs no guard on it) instead of the ``SiteRouter``. Its route is decided once, at trace time, by plain Python
that dynamo runs eagerly and keeps as a constant (``ModuleRouter.traced_route``, marked
``torch._dynamo.assume_constant_result``): the plan's verdict for the call's signature, or the host with a
reason. Nothing is measured in a trace: a signature the chooser would measure is served by the host in that
graph, with the reason, until a call outside any graph measures it (its new verdict changes the plan's
generation, and the graph, which guards on the generation, recompiles). The form then runs through
``Form.in_graph`` (a custom op for ditgate's own kernels), traced into the graph; a form that raises while it
is traced is dropped from that graph and the host is traced instead.

Calls served inside a compiled graph run none of this Python, so the ledger cannot count them: it counts
traces (``SiteLedger.traces``), and ``Plan.explain()`` says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..forms import AttentionInputs
from ..hosts import Convention
from .ledger import HOST
from .routes import CallArgs, HostFn, ToHostLayout

RAISED_IN_TRACE = "raised while it was traced; this graph calls the host instead"

if TYPE_CHECKING:
    from .module import ModuleRouter


def plain_sizes(shape) -> tuple[int, ...]:
    """Plain ints (dynamo specialises a symbolic size on it, with a guard: a route holds for one shape)."""
    return tuple(int(n) for n in shape)


class TracedSite:
    def __init__(self, router: ModuleRouter, index: int, convention: Convention) -> None:
        self.router = router
        self.index = index
        self.convention = convention

    def host_only(self, reason: str, host: HostFn) -> torch.Tensor:
        self.router.note_trace(self.index, self.convention, HOST, reason)
        return host()

    def serve(self, args: CallArgs, host: HostFn, to_host: ToHostLayout) -> torch.Tensor:
        q, k, v, mask = args.query, args.key, args.value, args.attn_mask
        if mask is None:
            mask_sig = None
        elif isinstance(mask, torch.Tensor):
            mask_sig = (mask.dtype, plain_sizes(mask.shape))
        else:
            mask_sig = type(mask)
        needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        router = self.router
        sig = (plain_sizes(q.shape), plain_sizes(k.shape), plain_sizes(v.shape), q.dtype, q.device, mask_sig,
               bool(args.is_causal), float(args.dropout_p), bool(args.enable_gqa), needs_grad)
        name, reason, selected = router.traced_route(self.index, self.convention, router.context.generation, *sig)
        inputs = args.inputs()
        if selected:  # a block-sparse form: the sparse stage selects, in the graph, for this step's budget
            stage = router.context.sparse
            plan, reason = router.traced_selection(self.index, self.convention, stage.graph_token, name, *sig)
            if plan is None:
                name = None
            else:
                inputs = AttentionInputs(q, k, v, stage.lists_in_graph(q, k, plan), args.scale)
        if name is None:
            router.note_trace(self.index, self.convention, HOST, reason)
            return host()
        try:  # a form that raises while it is traced is traced no further: this graph calls the host
            out = router.context.forms[name].in_graph(inputs)
        except Exception:
            router.note_trace(self.index, self.convention, HOST, f"{name} {RAISED_IN_TRACE}")
            return host()
        router.note_trace(self.index, self.convention, name, "")
        return to_host(out)
