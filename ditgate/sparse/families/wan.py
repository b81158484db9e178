"""Wan and the families that pack its way: the latent [B, C, F, H, W] patchified in (frame, row, column) order.

- Wan (``WanTransformer3DModel``): ``hidden_states`` [B, C, F, H, W] patchified by ``patch_size`` in
  (frame, row, column) order; self-attention sees video tokens only (text enters by cross-attention).
  Wan 2.2's TI2V passes one timestep per token, 0 for the first frame where it starts from an image: those
  frames are conditioning, kept dense (one device read per forward).
- Wan VACE (``WanVACETransformer3DModel``), SkyReels-V2 (``SkyReelsV2Transformer3DModel``), ChronoEdit
  (``ChronoEditTransformer3DModel``, Wan 2.1 with its own rotary positions) and Cosmos (``CosmosTransformer3DModel``,
  whose condition and padding masks join the latent's channels, not its tokens): Wan's patchified latent. VACE's
  control blocks attend over the control latent, patchified to the same grid; SkyReels-V2's diffusion forcing
  passes a causal block mask, and masked calls stay dense (the router).
- Wan Animate (``WanAnimateTransformer3DModel``): Wan's patchified latent, whose first frame is the reference
  character's (the pipeline concatenates the reference image's latent before the segment's frames). That frame's
  tokens are conditioning, kept dense; the pose latent joins the other frames only.
- Helios (``HeliosTransformer3DModel``): Wan's patchified latent after the history streams it is given (long,
  then mid, then short: patched 4x, 2x and 1x the latent's patch, the first two padded up to whole patches), which
  are conditioning, kept dense. Text enters by cross-attention.
"""

from __future__ import annotations

import torch

from ..layout import TokenLayout
from .base import ForwardLayouts, arg, history_tokens, video_after_clean_frames


def wan(model, args, kwargs) -> ForwardLayouts:
    hs = arg(args, kwargs, "hidden_states", 0)
    family = type(model).__name__.removesuffix("Transformer3DModel")  # Wan, WanVACE, SkyReelsV2, Cosmos
    if not isinstance(hs, torch.Tensor) or hs.dim() != 5:
        return ForwardLayouts((), f"{family}: hidden_states is not a [B, C, F, H, W] tensor")
    pt, ph, pw = model.config.patch_size
    _, _, f, h, w = hs.shape
    grid = (f // pt, h // ph, w // pw)
    return video_after_clean_frames(grid, arg(args, kwargs, "timestep", 1),
                                     f"{family}: latent {f}x{h}x{w} / patch {pt}x{ph}x{pw}")


def wan_animate(model, args, kwargs) -> ForwardLayouts:
    """Wan's latent, whose first frame holds the reference image: conditioning, kept dense."""
    found = wan(model, args, kwargs)
    if not found.layouts:
        return found
    (f, h, w), pt = found.layouts[0].grid, model.config.patch_size[0]
    if pt != 1 or f < 2:
        return ForwardLayouts((), f"WanAnimate: the reference frame is not a frame of tokens (patch {pt} in time, "
                                  f"{f} frames of tokens)")
    return ForwardLayouts((TokenLayout.of(("conditioning", h * w), ("video", (f - 1) * h * w), grid=(f - 1, h, w),
                                          source=f"WanAnimate: the reference frame's {h * w} tokens kept dense, then "
                                                 f"{f - 1}x{h}x{w} video tokens"),))


def helios(model, args, kwargs) -> ForwardLayouts:
    """Wan's latent after three history streams (long, mid, short), all conditioning."""
    found = wan(model, args, kwargs)
    if not found.layouts:
        return found
    p = tuple(model.config.patch_size)
    history = history_tokens(kwargs, (("latents_history_short", None, p),
                                       ("latents_history_mid", (2, 4, 4), tuple(2 * k for k in p)),
                                       ("latents_history_long", (4, 8, 8), tuple(4 * k for k in p))))
    video = found.layouts[0]
    return ForwardLayouts((TokenLayout.of(("conditioning", history), ("video", video.length), grid=video.grid,
                                          source=f"Helios: {history} history tokens kept dense, then "
                                                 f"{video.source.removeprefix('Helios: ')}"),))
