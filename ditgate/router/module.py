"""The router entries of one attention module: stand-ins for ``dispatch_attention_fn`` and SDPA.

Each entry is a callable object with the exact signature of the function it stands in for. It builds the
host call (the original function with the original arguments) and B, H, S, D views for the forms, and passes
both to the site that the call index names. No tensor is copied on the way in. Entries are objects rather
than closures so that torch.compile traces them like any method (dynamo cannot guard a closure that holds a
builtin such as ``F.scaled_dot_product_attention``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..hosts import AttentionModule, Convention, original_entry
from .parallel import ParallelServing
from .routes import CallArgs
from .site import RouterContext, SiteRouter
from .traced import TracedSite


def _bhsd(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2)


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


class ModuleRouter:
    def __init__(self, context: RouterContext, found: AttentionModule, processor: object,
                 conventions: frozenset[Convention]) -> None:
        self.context = context
        self.found = found
        self.conventions = conventions
        self.originals = {c: original_entry(processor, c) for c in conventions}
        self.sites: dict[int, SiteRouter] = {}
        self.parallel = ParallelServing(self.originals.get(Convention.DISPATCH))  # calls under context parallelism
        self._index = 0
        # The site of the first call exists from the start, so that explain() lists it before any call.
        self.site(0, next(iter(sorted(conventions, key=lambda c: c.value))))

    def begin_invocation(self) -> None:
        self._index = 0

    def site(self, index: int, convention: Convention) -> SiteRouter:
        site = self.sites.get(index)
        if site is None:
            name = self.found.path if index == 0 else f"{self.found.path}#{index}"
            site = SiteRouter(self.context, name, self.found.path, index, self.found.role_hint, convention)
            self.sites[index] = site
        site.convention = convention
        return site

    def next_site(self, convention: Convention) -> SiteRouter | TracedSite:
        """The site of the next attention call of this invocation (inside a torch.compile trace, its stand-in)."""
        index = self._index
        self._index = index + 1
        if torch.compiler.is_compiling():
            return TracedSite(self, index, convention)
        site = self.sites.get(index)
        if site is None or site.convention is not convention:
            site = self.site(index, convention)
        return site

    # Both run eagerly at trace time (dynamo calls them and keeps the result as a constant of the graph); their
    # arguments are plain values, so that no Python object of ours needs a guard beyond this router's identity.
    @torch._dynamo.assume_constant_result
    def traced_route(self, index: int, convention: Convention, generation: int,
                     *sig) -> tuple[str | None, str, bool]:
        """The form a compiled graph calls for this call, or None for the host, and why, and whether the sparse
        stage selects for it (``SiteRouter.resolve_traced``). ``generation`` is the plan's, read in the trace:
        dynamo guards on it."""
        return self.site(index, convention).resolve_traced(_sig_of(sig))

    @torch._dynamo.assume_constant_result
    def traced_selection(self, index: int, convention: Convention, token: str, form_name: str,
                         *sig) -> tuple[tuple | None, str]:
        """How a graph selects for this call of a block-sparse form (``SiteRouter.resolve_selection``). ``token`` is
        the sparse stage's ``graph_token`` (budget and layouts), read in the trace: dynamo guards on it."""
        return self.site(index, convention).resolve_selection(form_name, _sig_of(sig))

    @torch._dynamo.assume_constant_result
    def note_trace(self, index: int, convention: Convention, route: str, reason: str) -> None:
        """What a trace put in its graph for this call, counted in the site's ledger."""
        site = self.site(index, convention)
        site.ledger.traced(route, reason, site.context.generation)

    def entries(self) -> dict[Convention, Callable]:
        made: dict[Convention, Callable] = {}
        if Convention.DISPATCH in self.conventions:
            made[Convention.DISPATCH] = DispatchEntry(self, self.originals[Convention.DISPATCH])
        if Convention.SDPA in self.conventions:
            made[Convention.SDPA] = SdpaEntry(self, self.originals[Convention.SDPA])
        return made


def _sig_of(plain: tuple) -> tuple:
    """A call signature (``routes.signature``) from the plain values a trace passes."""
    q, k, v, dtype, device, mask, *flags = plain
    mask = (mask[0], torch.Size(mask[1])) if isinstance(mask, tuple) else mask
    return (torch.Size(q), torch.Size(k), torch.Size(v), dtype, device, mask, *flags)


class DispatchEntry:
    """``dispatch_attention_fn`` for one module: B, S, H, D tensors, diffusers' keyword arguments."""

    def __init__(self, router: ModuleRouter, original: Callable) -> None:
        self.router = router
        self.original = original

    def __call__(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                 enable_gqa=False, attention_kwargs=None, *, backend=None, parallel_config=None):
        original = self.original

        def host():
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale, enable_gqa=enable_gqa, attention_kwargs=attention_kwargs,
                            backend=backend, parallel_config=parallel_config)

        site = self.router.next_site(Convention.DISPATCH)
        if parallel_config is not None:
            if isinstance(site, TracedSite):  # diffusers' exchange traced as the host's; its local op not routed
                return site.host_only("context-parallel call inside a compiled graph", host)
            return self.router.parallel.serve(site, host, query, key, value, attn_mask, dropout_p, is_causal, scale,
                                              enable_gqa, attention_kwargs, backend, parallel_config)
        if attention_kwargs:
            return site.host_only(f"backend-specific attention_kwargs {sorted(attention_kwargs)}", host)
        if not (isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor) and isinstance(value, torch.Tensor)
                and query.ndim == 4 and key.ndim == 4 and value.ndim == 4):
            return site.host_only("inputs are not 4-D tensors", host)
        mask = attn_mask
        if (isinstance(mask, torch.Tensor) and mask.ndim == 2 and mask.shape[0] == query.shape[0]
                and mask.shape[1] == key.shape[1]):
            mask = mask[:, None, None, :]  # the same broadcast diffusers' native backend applies
        args = CallArgs(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), mask, scale, is_causal,
                        dropout_p, enable_gqa)
        return site.serve(args, host, _bhsd)


class SdpaEntry:
    """``F.scaled_dot_product_attention`` for one module: B, H, S, D tensors."""

    def __init__(self, router: ModuleRouter, original: Callable) -> None:
        self.router = router
        self.original = original

    def __call__(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                 enable_gqa=False):
        original = self.original

        def host():
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale, enable_gqa=enable_gqa)

        site = self.router.next_site(Convention.SDPA)
        if not (isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor) and isinstance(value, torch.Tensor)
                and query.ndim == 4 and key.ndim == 4 and value.ndim == 4):
            return site.host_only("inputs are not 4-D tensors", host)
        return site.serve(CallArgs(query, key, value, attn_mask, scale, is_causal, dropout_p, enable_gqa), host,
                          _same)
