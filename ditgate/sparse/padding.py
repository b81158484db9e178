"""Boolean key masks that hide only padding, served as attention over the keys before it.

HunyuanVideo appends its text stream, padded to a fixed length, after the video tokens, and passes every joint
attention call a boolean key mask [B, 1, 1, S] that hides the padding. A mask keeps SDPA off its fastest
kernels and rules out forms that take none (flash-attn-4, cuDNN's and flash's SDPA). Attention over keys whose
tail is masked is attention over the keys before that tail: the same function, with the padding neither read nor
computed. So where a verified family's layout says where its padding starts (``ForwardLayouts.padding_mask``),
the router hands every form the call over ``key[:, :, :end]`` without a mask, and the host keeps its own call.

The layouts are read once per forward by a pre-hook on each such denoiser (one device read: the prompt's length).
The first mask met per layout and mask shape is compared with the layout (one more); later ones are taken to
match, as the family builds every mask of a forward from the same count. Any other mask stays as it is.
"""

from __future__ import annotations

import logging

import torch

from .families import FAMILIES_WITH_PADDING_MASKS, ForwardLayouts, layouts_of_forward

logger = logging.getLogger("ditgate")


class PaddingKeys:
    """One plan's reader of padding masks: hooks on its denoisers of a family with padding masks, the layouts
    their last forward declared, and which masks were checked against them."""

    def __init__(self) -> None:
        self._forward: dict[str, ForwardLayouts] = {}
        self._denoiser_of: dict[str, str] = {}
        self._checked: dict[tuple, bool] = {}  # (layout, mask shape, device): the mask hides the layout's padding
        self._said: set[tuple[str, str]] = set()

    def install(self, name: str, model: torch.nn.Module, module_paths: list[str]) -> list:
        """A pre-hook on ``model`` where its family passes padding masks; returns the handles (none otherwise)."""
        if type(model).__name__ not in FAMILIES_WITH_PADDING_MASKS:
            return []
        for path in module_paths:
            self._denoiser_of[path] = name

        def pre(module, args, kwargs):
            self._forward[name] = layouts_of_forward(module, args, kwargs)
            return None

        return [model.register_forward_pre_hook(pre, with_kwargs=True)]

    def covers(self, name: str) -> bool:
        """Whether the denoiser ``name`` has had a forward read here."""
        return name in self._forward

    def covers_path(self, module_path: str) -> bool:
        """Whether the module at ``module_path`` belongs to a denoiser whose masks this reader checks."""
        return module_path in self._denoiser_of

    def layouts(self, name: str) -> ForwardLayouts:
        return self._forward[name]

    def keys_end(self, site_name: str, module_path: str, q: torch.Tensor, mask: object) -> tuple[int | None, str]:
        """Where the keys of a call with this boolean mask end, when the mask hides exactly the trailing padding
        of the call's layout; otherwise None and why the call keeps its mask (said once per site)."""
        n = q.shape[2]
        denoiser = self._denoiser_of.get(module_path)
        forward = self._forward.get(denoiser) if denoiser is not None else None
        if forward is None or not forward.padding_mask:
            return None, "no verified layout says what the mask hides"
        layout, why = forward.for_call(module_path, n)
        if layout is None:
            return self._keeps(site_name, why)
        if (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 4
                or tuple(mask.shape[1:]) != (1, 1, n)):
            shape = list(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
            return self._keeps(site_name, f"mask {shape} is not a boolean key mask [B, 1, 1, {n}]")
        key = (layout, tuple(mask.shape), str(mask.device))
        if key not in self._checked:
            expected = (torch.arange(n, device=mask.device) < layout.keys_end).expand(mask.shape[0], n)
            self._checked[key] = torch.equal(mask.reshape(mask.shape[0], n), expected)
        if not self._checked[key]:
            return self._keeps(site_name, f"the mask hides other keys than the layout's padding ({layout.source})")
        return layout.keys_end, ""

    def _keeps(self, site_name: str, reason: str) -> tuple[None, str]:
        if (site_name, reason) not in self._said:
            self._said.add((site_name, reason))
            logger.info("ditgate: %s keeps its mask: %s", site_name, reason)
        return None, reason
