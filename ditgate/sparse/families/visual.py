"""Self-attention over the latent's tokens alone, in (frame, row, column) order, outside Wan's lineage.

- Allegro (``AllegroTransformer3DModel``): each latent frame patchified by ``patch_size``, frame by frame;
  self-attention sees video tokens only.
- Kandinsky 5 (``Kandinsky5Transformer3DModel``): the latent [B, F, H, W, C] patchified by ``patch_size`` in
  (frame, row, column) order, for the visual blocks' self-attention only (``visual_transformer_blocks``; the text
  blocks attend over the text alone). Where the pipeline passes ``sparse_params`` the host runs its own sparse
  attention (NABLA) over tokens reordered in 8x8 patches: no layout.
- Kandinsky 6 (``Kandinsky6Transformer3DModel``): the latent [B, F, H, W, C] patchified in (frame, row, column)
  order, for the fused blocks' video self-attention only (``video_dec_block``; audio and text stay dense). Image
  to video appends the reference image as a last frame of token type 1: conditioning, kept dense (one device read
  per forward where ``visual_token_type_ids`` is given).
"""

from __future__ import annotations

import math

import torch

from ..layout import TokenLayout
from .base import ForwardLayouts, arg


def allegro(model, args, kwargs) -> ForwardLayouts:
    hs = arg(args, kwargs, "hidden_states", 0)
    if not isinstance(hs, torch.Tensor) or hs.dim() != 5:
        return ForwardLayouts((), "Allegro: hidden_states is not a [B, C, F, H, W] tensor")
    p = model.config.patch_size
    _, _, f, h, w = hs.shape
    grid = (f, h // p, w // p)  # each frame patchified on its own: no temporal patch
    return ForwardLayouts((TokenLayout.of(("video", math.prod(grid)), grid=grid,
                                          source=f"Allegro: latent {f}x{h}x{w} / patch 1x{p}x{p}"),))


def kandinsky5(model, args, kwargs) -> ForwardLayouts:
    hs = arg(args, kwargs, "hidden_states", 0)
    if kwargs.get("sparse_params") is not None:
        return ForwardLayouts((), "Kandinsky5: the host runs its own sparse attention (sparse_params), over tokens "
                                  "it reorders")
    if not isinstance(hs, torch.Tensor) or hs.dim() != 5:
        return ForwardLayouts((), "Kandinsky5: hidden_states is not a [B, F, H, W, C] tensor")
    pt, ph, pw = model.config.patch_size
    _, f, h, w, _ = hs.shape
    grid = (f // pt, h // ph, w // pw)
    return ForwardLayouts((TokenLayout.of(("video", math.prod(grid)), grid=grid,
                                          source=f"Kandinsky5: latent {f}x{h}x{w} / patch {pt}x{ph}x{pw}"),),
                          modules=("visual_transformer_blocks",))


def kandinsky6(model, args, kwargs) -> ForwardLayouts:
    """The patchified latent [B, F, H, W, C], whose frames with a nonzero ``visual_token_type_ids`` (the reference
    image its pipeline appends as a last frame) are conditioning; for the video self-attention of the fused blocks
    only (``video_dec_block``): the audio stream and the text blocks stay dense."""
    hs = arg(args, kwargs, "hidden_states", 0)
    if not isinstance(hs, torch.Tensor) or hs.dim() != 5:
        return ForwardLayouts((), "Kandinsky6: hidden_states is not a [B, F, H, W, C] tensor")
    pt, ph, pw = model.config.patch_size
    _, f, h, w, _ = hs.shape
    frames, per_frame = f // pt, (h // ph) * (w // pw)
    types = kwargs.get("visual_token_type_ids")
    reference = 0
    if isinstance(types, torch.Tensor):
        # one device read per forward: which frames are not generated ones, and where the batch's items disagree
        read = torch.cat([types.ne(0).any(0), types.ne(types[:1]).any(0)]).tolist()
        marked, differ = read[:frames], any(read[frames:])
        reference = sum(marked)
        if differ or any(marked[:frames - reference]):
            return ForwardLayouts((), "Kandinsky6: frames of another type than the generated ones are not all last, "
                                      "or differ across the batch")
    grid = (frames - reference, h // ph, w // pw)
    tail = f", then {reference} reference frame(s) kept dense" if reference else ""
    return ForwardLayouts((TokenLayout.of(("video", math.prod(grid)), ("conditioning", reference * per_frame),
                                          grid=grid, source=f"Kandinsky6: latent {f}x{h}x{w} / patch {pt}x{ph}x{pw}"
                                                            f"{tail}"),),
                          modules=("video_dec_block",))
