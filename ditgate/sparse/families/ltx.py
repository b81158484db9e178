"""LTX-Video and LTX-2: the latent packed [B, F·H·W, C] before the denoiser sees it.

- LTX-Video (``LTXVideoTransformer3DModel``): packed ``hidden_states`` [B, F·H·W, C] with ``num_frames``,
  ``height``, ``width`` given; self-attention sees video tokens only. Image to video passes one timestep per token,
  0 on the first frame (the image): conditioning, kept dense, as Wan 2.2's TI2V. Its condition pipeline passes
  each token's coordinates (``video_coords``) instead of the grid and prepends the tokens of conditions placed at
  later frames: those are conditioning, kept dense, and the grid is read from the coordinates' tail (one device
  read per forward).
- LTX-2 (``LTX2VideoTransformer3DModel``): the video stream as LTX-Video packs it, for the video self-attention
  (``attn1``) only; the audio stream's self-attention and the cross-modal attention stay dense.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ..layout import TokenLayout
from .base import ForwardLayouts, arg, video_after_clean_frames


def ltx(model, args, kwargs, family: str = "LTX-Video") -> ForwardLayouts:
    hs = arg(args, kwargs, "hidden_states", 0)
    f, h, w = (kwargs.get(k) for k in ("num_frames", "height", "width"))
    coords = kwargs.get("video_coords")
    if isinstance(hs, torch.Tensor) and None in (f, h, w) and isinstance(coords, torch.Tensor):
        return ltx_from_coords(hs, coords, arg(args, kwargs, "timestep", 2), family)
    if not isinstance(hs, torch.Tensor) or None in (f, h, w):
        return ForwardLayouts((), f"{family}: num_frames, height and width were not passed")
    p, pt = model.config.patch_size, model.config.patch_size_t
    grid = (int(f) // pt, int(h) // p, int(w) // p)
    if math.prod(grid) != hs.shape[1]:
        return ForwardLayouts((), f"{family}: grid {grid} does not cover {hs.shape[1]} tokens")
    return video_after_clean_frames(grid, arg(args, kwargs, "timestep", 2),
                                     f"{family}: latent grid {grid[0]}x{grid[1]}x{grid[2]}")


def ltx_from_coords(hs: torch.Tensor, coords: torch.Tensor, timestep: object, family: str) -> ForwardLayouts:
    """LTX-Video's condition pipeline passes each token's (frame, row, column) coordinates [B, 3, S] instead of the
    grid, and prepends the tokens of conditions placed at later frames (their frame coordinates start there, above
    0). The generated grid is the tail from the first token at coordinates (0, 0, 0); its last frame's and last
    row's runs of equal coordinates give its height and width. One device read per forward."""
    n = hs.shape[1]
    if coords.dim() != 3 or coords.shape[1] != 3 or coords.shape[2] != n:
        return ForwardLayouts((), f"{family}: video_coords is not a [B, 3, {n}] tensor")
    frame, row, col = coords[0]
    index = torch.arange(n, device=coords.device)
    origin = (frame == 0) & (row == 0) & (col == 0)
    last_change = [torch.where(c != c[-1], index, -1).max() for c in (frame, row)]
    has_origin, start, frame_run, row_run, differ = torch.stack([
        origin.any().long(), origin.long().argmax(), n - 1 - last_change[0], n - 1 - last_change[1],
        (coords != coords[:1]).any().long()]).tolist()
    video = n - start
    if not has_origin or differ or frame_run % row_run or video % frame_run:
        return ForwardLayouts((), f"{family}: video_coords do not end in a whole grid the batch agrees on")
    grid = (video // frame_run, frame_run // row_run, row_run)
    source = f"{family}: {start} condition tokens kept dense, then latent grid {grid[0]}x{grid[1]}x{grid[2]}"
    tail = timestep[:, start:] if isinstance(timestep, torch.Tensor) and timestep.dim() == 2 else timestep
    generated = video_after_clean_frames(grid, tail, source).layouts[0]
    return ForwardLayouts((TokenLayout.of(("conditioning", start),
                                          *((seg.kind, seg.end - seg.start) for seg in generated.segments),
                                          grid=generated.grid, source=generated.source),))


def ltx2(model, args, kwargs) -> ForwardLayouts:
    """The video stream as LTX-Video packs it; its self-attention modules are ``attn1``. The audio stream's
    (``audio_attn1``) and the cross-modal modules stay dense."""
    return dataclasses.replace(ltx(model, args, kwargs, family="LTX-2"), modules=("attn1",))
