"""Attention calls under diffusers' context parallelism: the exchange stays diffusers', the local op is routed.

A call that carries a ``parallel_config`` reaches its module's dispatch entry holding the rank's shard of the
sequence. When ditgate can serve it, the host's own backend runs it (``hosts.parallel.templated_backend``):
diffusers exchanges the shards, and the local op it would then call - on the whole sequence and the rank's heads
(Ulysses), or on one key/value chunk (ring) - comes to the site instead. The site routes that local call like any
other: the gate times the host's local op against each candidate on the same tensors, with no collective inside
the timed region, and whatever serves it hands its result back to diffusers' exchange. The ranks then settle on one
verdict (``gate.agree``), so that every rank takes the same route.

Ring (alone, or inside unified) merges the chunks' partial results by their log-sum-exp, so only forms that return
it (``Form.returns_lse``) may serve a site under it; the others are refused there with that reason. Under Ulysses
the sparse stage reads the whole sequence's layout, which holds only where the exchanged sequence is that sequence
in order: a site whose layout has more than one segment (a joint text + image sequence, sharded stream by stream)
keeps its sparse forms out. Anything else ditgate cannot serve (a mask, gradients, uneven shards, a backend outside
diffusers' templated path) stays on the host with the reason.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..forms import AttentionInputs, describe_call
from ..hosts.parallel import ContextParallel, TemplatedBackend, backend_name, is_diffusers_dispatch, templated_backend
from .ledger import HOST
from .routes import CallArgs
from .site import HostFn, SiteRouter

NO_LSE = "returns no log-sum-exp, which ring attention needs to merge the chunks' results"
GATHERED_LAYOUT = ("context parallelism: the exchanged sequence is the ranks' shards side by side, which a layout of "
                   "{segments} segments does not describe")


def _bhsd(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2)


class ParallelServing:
    """The context-parallel calls of one attention module (owned by its ``ModuleRouter``)."""

    def __init__(self, original: Callable) -> None:
        self.original = original
        self._backends: dict[str, TemplatedBackend] = {}
        self._site: SiteRouter | None = None  # the site whose call is inside diffusers' exchange right now

    def serve(self, site: SiteRouter, host: HostFn, query, key, value, attn_mask, dropout_p, is_causal, scale,
              enable_gqa, attention_kwargs, backend, parallel_config) -> torch.Tensor:
        cp = ContextParallel.of(parallel_config)
        why = self._refusal(cp, (query, key, value), attn_mask, is_causal, enable_gqa, attention_kwargs)
        if not why:
            try:
                templated = self._templated(backend_name(backend))
            except ValueError as exc:  # an unknown backend: the host says so in its own words
                return site.host_only(f"backend {backend!r}: {exc}", host)
            why = templated.reason
        if why:
            return site.host_only(why, host)
        if cp.merges_by_lse:
            for name, form in site.context.forms.items():
                if not form.returns_lse:
                    site.disable(name, NO_LSE)
        kwargs = dict(query=query, key=key, value=value, attn_mask=attn_mask, dropout_p=dropout_p,
                      is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, _parallel_config=parallel_config)
        self._site = site
        try:
            return templated.call(**{k: v for k, v in kwargs.items() if k in templated.arguments})
        finally:
            self._site = None

    def _refusal(self, cp: ContextParallel | None, qkv, attn_mask, is_causal, enable_gqa, attention_kwargs) -> str:
        if attention_kwargs:
            return f"backend-specific attention_kwargs {sorted(attention_kwargs)}"
        if cp is None:
            return "a parallel_config without context parallelism over several ranks"
        if cp.refusal():
            return cp.refusal()
        if not is_diffusers_dispatch(self.original):
            return "context-parallel call to a dispatch_attention_fn that is not diffusers' own"
        if not all(isinstance(t, torch.Tensor) and t.ndim == 4 for t in qkv):
            return "inputs are not 4-D tensors"
        if attn_mask is not None:
            return "a masked context-parallel call (diffusers exchanges the mask with the shards)"
        if is_causal or enable_gqa:
            return "causal or grouped-query attention: diffusers' templated context-parallel path refuses it"
        if torch.is_grad_enabled() and any(t.requires_grad for t in qkv):
            return "context-parallel call that needs gradients: the exchange's backward runs the backend's own"
        return ""

    def _templated(self, name: str) -> TemplatedBackend:
        if name not in self._backends:
            self._backends[name] = templated_backend(name, self._routed_local_op)
        return self._backends[name]

    def _routed_local_op(self, forward_op: Callable) -> Callable:
        """diffusers' local op for this call, as the site's route decides (diffusers calls it after its exchange)."""

        def local_op(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                     enable_gqa=False, return_lse=False, *, _save_ctx=True, _parallel_config=None):
            def host():
                return forward_op(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                                  return_lse, _save_ctx=_save_ctx, _parallel_config=_parallel_config)

            site = self._site
            args = CallArgs(_bhsd(query), _bhsd(key), _bhsd(value), attn_mask, scale, is_causal, dropout_p,
                            enable_gqa)
            if return_lse:
                return serve_with_lse(site, args.inputs(), host)
            keep_sparse_out_of_gathered_layouts(site, query.shape[1])
            return site.serve(args, host, _bhsd)

        return local_op


def keep_sparse_out_of_gathered_layouts(site: SiteRouter, tokens: int) -> None:
    """Refuse the site's block-sparse forms where the layout of its ``tokens``-long sequence has several segments:
    under Ulysses each rank's shard of every stream sits side by side, not the streams one after the other."""
    stage = site.context.sparse
    if stage is None:
        return
    for name, forward in stage.layouts().items():
        if name and site.module_path != name and not site.module_path.startswith(f"{name}."):
            continue
        layout, _ = forward.for_call(site.module_path, tokens)
        if layout is not None and len(layout.segments) > 1:
            reason = GATHERED_LAYOUT.format(segments=len(layout.segments))
            for form_name, form in site.context.forms.items():
                if form.spec.takes_selection:
                    site.disable(form_name, reason)
        return


def serve_with_lse(site: SiteRouter, inputs: AttentionInputs, host: Callable[[], tuple]) -> tuple:
    """One ring chunk's local call: (out [B, S, H, D], log-sum-exp [B, S, H]) from the host or a form that returns
    it. The gate measures the forms on their output against the host's (the log-sum-exp comes from the same kernel
    pass); forms without one were refused at this site before."""
    q = inputs.query
    call = describe_call(q, inputs.key, inputs.value, inputs.attn_mask, inputs.dropout_p, inputs.is_causal,
                         inputs.enable_gqa, site.context.capability(q.device))
    site.role = site.role or site.role_hint
    site.shapes.setdefault(call.shape_key, call)
    chooser = site.context.chooser
    decision = chooser.decide(site, call)
    if decision.measure:
        kept: list = []

        def host_out() -> torch.Tensor:  # the host's op is deterministic: every call leaves the same LSE
            out, lse = host()
            kept[:] = [lse]
            return out

        if site.context.tally:
            site.ledger.hosted("calibrating")
        site.observe(call, HOST, "calibrating")
        out = chooser.measure(site, call, inputs, host_out, _bhsd)
        return out, kept[0]
    if decision.form is None:
        return site._host(call, decision.reason, host)
    blocked = site.usable(decision.form, call)
    if blocked:
        return site._host(call, f"{decision.form}: {blocked[0]}", host)
    form = site.context.forms[decision.form]
    try:
        out, lse = form.run_lse(inputs)
    except Exception as exc:  # never fail a call the host could serve
        return site.failed(form, exc, call, host)
    if site.context.tally:
        site.ledger.served(form.name)
    site.observe(call, form.name, "")
    return _bhsd(out), lse.transpose(1, 2)
