"""What every family's reader shares: the layouts of one forward, the padding its masks hide, where an argument
is, and the clean frames and history streams that several families put before the latent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..layout import TokenLayout


KEY_PADDING = "keys"
PAIR_PADDING = "queries and keys"


@dataclass(frozen=True)
class ForwardLayouts:
    """The self-attention sequences one denoiser forward will attend over, or why none is known."""

    layouts: tuple[TokenLayout, ...]
    reason: str = ""
    # what the boolean masks this family passes with these sequences hide (verified on the real class), checked by
    # ``padding.PaddingKeys`` against the first mask it meets per layout: "" nothing known; KEY_PADDING the
    # trailing padding's keys ([B, 1, 1, S]); PAIR_PADDING its keys and its queries' rows ([B, 1, S, S])
    padding_mask: str = ""
    # components of the attention module paths the layouts describe (LTX-2's "attn1", Kandinsky 5's
    # "visual_transformer_blocks"); None: every module whose sequence has a layout's length. A stream of other tokens
    # (LTX-2's audio, Kandinsky 5's text) could have the video's length by chance.
    modules: tuple[str, ...] | None = None

    def for_length(self, n: int) -> TokenLayout | None:
        for lay in self.layouts:
            if lay.length == n:
                return lay
        return None

    def for_call(self, module_path: str, n: int) -> tuple[TokenLayout | None, str]:
        """The layout of a call at ``module_path`` over ``n`` tokens, or None and why there is none."""
        if self.modules is not None and not set(module_path.split(".")) & set(self.modules):
            return None, f"the layouts describe the {', '.join(self.modules)} modules' sequences only"
        layout = self.for_length(n)
        if layout is None:
            return None, self.reason or f"no layout covers a {n}-token sequence"
        return layout, ""


def arg(args: tuple, kwargs: dict, name: str, index: int):
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else None


def video_after_clean_frames(grid: tuple[int, int, int], timestep: object, source: str) -> ForwardLayouts:
    """The latent grid's tokens as video, but for its first frames where a per-token timestep marks them clean (the
    image an image-to-video pipeline starts from): those are conditioning, kept dense."""
    clean = clean_leading_frames(timestep, grid)
    if clean:
        per_frame = grid[1] * grid[2]
        return ForwardLayouts((TokenLayout.of(("conditioning", clean * per_frame),
                                              ("video", (grid[0] - clean) * per_frame),
                                              grid=(grid[0] - clean, *grid[1:]),
                                              source=f"{source}, its first {clean} frame(s) at timestep 0 (the "
                                                     f"image it starts from) kept dense"),))
    return ForwardLayouts((TokenLayout.of(("video", math.prod(grid)), grid=grid, source=source),))


def clean_leading_frames(timestep: object, grid: tuple[int, int, int]) -> int:
    """Wan 2.2's TI2V and LTX-Video's image-to-video pass one timestep per token [B, S], 0 where a frame is the clean
    image they start from (the first): how many leading frames are so, when the zeros are exactly whole leading
    frames the batch agrees on. One device read per forward, for per-token timesteps only."""
    if not isinstance(timestep, torch.Tensor) or timestep.dim() != 2 or timestep.shape[1] != math.prod(grid):
        return 0
    zero = timestep[0] == 0
    total, leading, differ = torch.stack([zero.sum(), zero.int().cumprod(0).sum(),
                                          (timestep != timestep[:1]).any().long()]).tolist()
    per_frame = grid[1] * grid[2]
    if differ or total != leading or leading % per_frame or leading == math.prod(grid):
        return 0
    return leading // per_frame


def history_tokens(kwargs: dict, streams) -> int:
    """Tokens of the history streams a Framepack-like host prepends to the latent: each stream (the name of its
    latents [B, C, F, H, W], the patch it is padded up to or None, its patch) counts where both its latents and
    its ``indices_`` frame indices are given, as the host only packs those."""
    total = 0
    for name, pad, patch in streams:
        latents, indices = kwargs.get(name), kwargs.get("indices_" + name)
        if isinstance(latents, torch.Tensor) and isinstance(indices, torch.Tensor):
            dims = latents.shape[2:] if pad is None else [-(-n // k) * k for n, k in zip(latents.shape[2:], pad)]
            total += math.prod(n // k for n, k in zip(dims, patch))
    return total
