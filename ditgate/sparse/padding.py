"""Boolean masks that hide only padding, served as attention over the keys before it.

HunyuanVideo appends its text stream, padded to a fixed length, after the video tokens, and passes every joint
attention call a boolean key mask [B, 1, 1, S] that hides the padding. HunyuanVideo 1.5 passes a square one,
[B, 1, S, S], that hides the padding's rows too; the host returns zeros there, and so does the router
(``AttentionInputs.finish``). A mask keeps SDPA off its fastest kernels and rules out forms that take none
(flash-attn-4, cuDNN's and flash's SDPA). Attention over keys whose tail is masked is attention over the keys
before that tail: the same function, with the padding neither read nor computed. So where a verified family's
layout says where its padding starts (``ForwardLayouts.padding_mask``), the router hands every form the call over
``key[:, :, :end]`` without a mask, and the host keeps its own call.

The layouts are read once per forward by a pre-hook on each such denoiser (one device read: the prompt's length).
The first mask met per layout and mask shape is compared with the layout (one more); later ones are taken to
match, as the family builds every mask of a forward from the same count. Any other mask stays as it is.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from .families import FAMILIES_WITH_PADDING_MASKS, PAIR_PADDING, ForwardLayouts, layouts_of_forward

logger = logging.getLogger("ditgate")


def capturing() -> bool:
    """Whether this thread's CUDA stream is being captured into a CUDA graph (no device value may be read)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


@dataclass(frozen=True)
class PaddingCut:
    """Where a call's keys end before its padding, and whether the host's rows from there on are zeros (its mask
    hid those queries from every key too: HunyuanVideo 1.5's)."""

    keys: int
    zero_rows: bool


class PaddingKeys:
    """One plan's reader of padding masks: hooks on its denoisers of a family with padding masks, the layouts
    their last forward declared, and which masks were checked against them."""

    def __init__(self) -> None:
        self._forward: dict[str, ForwardLayouts] = {}
        self._denoiser_of: dict[str, str] = {}
        self._checked: dict[tuple, bool] = {}  # (layout, mask shape, device): the mask hides the layout's padding
        self._said: set[tuple[str, str]] = set()
        self._names: set[str] = set()  # the denoisers whose forwards are read
        self._reads: dict[str, int] = {}

    def install(self, name: str, model: torch.nn.Module, module_paths: list[str]) -> list:
        """A pre-hook on ``model`` where its family passes padding masks; returns the handles (none otherwise)."""
        if type(model).__name__ not in FAMILIES_WITH_PADDING_MASKS:
            return []
        for path in module_paths:
            self._denoiser_of[path] = name

        self._names.add(name)

        def pre(module, args, kwargs):
            # a compiled graph keeps the mask (the router cuts nothing there); a forward captured into a CUDA graph
            # reads no device value: it keeps the layouts of the forward before it (its warm-up)
            if torch.compiler.is_compiling() or capturing():
                return None
            self.read(name, module, args, kwargs)
            return None

        return [model.register_forward_pre_hook(pre, with_kwargs=True)]

    def read(self, name: str, model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        """Read the layouts of a forward of the denoiser ``name`` (its hook does, outside compiled graphs; a plan
        measuring on a forward that a compiled wrapper started does, once that forward runs eagerly)."""
        if name in self._names:
            self._forward[name] = layouts_of_forward(model, args, kwargs)
            self._reads[name] = self._reads.get(name, 0) + 1

    def reads(self, name: str) -> int:
        """How many forwards of ``name`` were read so far (the sparse stage's hook reads one that was not)."""
        return self._reads.get(name, 0)

    def covers(self, name: str) -> bool:
        """Whether the denoiser ``name`` has had a forward read here."""
        return name in self._forward

    def covers_path(self, module_path: str) -> bool:
        """Whether the module at ``module_path`` belongs to a denoiser whose masks this reader checks."""
        return module_path in self._denoiser_of

    def layouts(self, name: str) -> ForwardLayouts:
        return self._forward[name]

    def cut(self, site_name: str, module_path: str, q: torch.Tensor, mask: object) -> tuple[PaddingCut | None, str]:
        """Where the keys of a call with this boolean mask end, when the mask hides exactly the trailing padding
        of the call's layout (its keys, and for PAIR_PADDING its rows too); otherwise None and why the call keeps
        its mask (said once per site)."""
        n = q.shape[2]
        denoiser = self._denoiser_of.get(module_path)
        forward = self._forward.get(denoiser) if denoiser is not None else None
        if forward is None or not forward.padding_mask:
            return None, "no verified layout says what the mask hides"
        layout, why = forward.for_call(module_path, n)
        if layout is None:
            return self._keeps(site_name, why)
        pairs = forward.padding_mask == PAIR_PADDING
        rows = n if pairs else 1
        if (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 4
                or tuple(mask.shape[1:]) != (1, rows, n)):
            shape = list(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
            return self._keeps(site_name, f"mask {shape} is not a boolean mask [B, 1, {rows}, {n}]")
        key = (layout, tuple(mask.shape), str(mask.device))
        if key not in self._checked:
            # the first row (a video query's keys) and, for a square mask, the first column (which queries see the
            # first key): the family builds the rest as their outer product
            expected = (torch.arange(n, device=mask.device) < layout.keys_end).expand(mask.shape[0], n)
            ok = torch.equal(mask[:, 0, 0, :], expected)
            self._checked[key] = ok and (not pairs or torch.equal(mask[:, 0, :, 0], expected))
        if not self._checked[key]:
            return self._keeps(site_name, f"the mask hides other keys than the layout's padding ({layout.source})")
        return PaddingCut(layout.keys_end, zero_rows=pairs), ""

    def _keeps(self, site_name: str, reason: str) -> tuple[None, str]:
        if (site_name, reason) not in self._said:
            self._said.add((site_name, reason))
            logger.info("ditgate: %s keeps its mask: %s", site_name, reason)
        return None, reason
