"""The router entries of one attention module: stand-ins for ``dispatch_attention_fn`` and SDPA.

Each entry has the exact signature of the function it stands in for, builds the host call (the
original function with the original arguments) and B, H, S, D views for the forms, and passes both to
the site that the call index names. No tensor is copied on the way in.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..forms import AttentionInputs
from ..hosts import AttentionModule, Convention, original_entry
from .parallel import ParallelServing
from .site import RouterContext, SiteRouter


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

    def _next_site(self, convention: Convention) -> SiteRouter:
        index = self._index
        self._index += 1
        return self.site(index, convention)

    def entries(self) -> dict[Convention, Callable]:
        made: dict[Convention, Callable] = {}
        if Convention.DISPATCH in self.conventions:
            made[Convention.DISPATCH] = self._dispatch_entry()
        if Convention.SDPA in self.conventions:
            made[Convention.SDPA] = self._sdpa_entry()
        return made

    def _dispatch_entry(self) -> Callable:
        original = self.originals[Convention.DISPATCH]

        def dispatch_attention_fn(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                  enable_gqa=False, attention_kwargs=None, *, backend=None, parallel_config=None):
            def host():
                return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                scale=scale, enable_gqa=enable_gqa, attention_kwargs=attention_kwargs,
                                backend=backend, parallel_config=parallel_config)

            site = self._next_site(Convention.DISPATCH)
            if parallel_config is not None:
                return self.parallel.serve(site, host, query, key, value, attn_mask, dropout_p, is_causal, scale,
                                           enable_gqa, attention_kwargs, backend, parallel_config)
            if attention_kwargs:
                return site.host_only(f"backend-specific attention_kwargs {sorted(attention_kwargs)}", host)
            if not all(isinstance(t, torch.Tensor) and t.ndim == 4 for t in (query, key, value)):
                return site.host_only("inputs are not 4-D tensors", host)
            mask = attn_mask
            if (isinstance(mask, torch.Tensor) and mask.ndim == 2 and mask.shape[0] == query.shape[0]
                    and mask.shape[1] == key.shape[1]):
                mask = mask[:, None, None, :]  # the same broadcast diffusers' native backend applies
            inputs = AttentionInputs(_bhsd(query), _bhsd(key), _bhsd(value), mask, scale, is_causal, dropout_p,
                                     enable_gqa)
            return site.serve(inputs, host, _bhsd)

        return dispatch_attention_fn

    def _sdpa_entry(self) -> Callable:
        original = self.originals[Convention.SDPA]

        def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                         scale=None, enable_gqa=False):
            def host():
                return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                scale=scale, enable_gqa=enable_gqa)

            site = self._next_site(Convention.SDPA)
            if not all(isinstance(t, torch.Tensor) and t.ndim == 4 for t in (query, key, value)):
                return site.host_only("inputs are not 4-D tensors", host)
            inputs = AttentionInputs(query, key, value, attn_mask, scale, is_causal, dropout_p, enable_gqa)
            return site.serve(inputs, host, _same)

        return scaled_dot_product_attention
