"""Joint attention over text and the latent in one sequence, without a padding mask.

- CogVideoX (``CogVideoXTransformer3DModel``): joint attention over the text stream first, then the
  ``hidden_states`` [B, F, C, H, W] latent patchified by ``patch_size`` (and ``patch_size_t`` when the
  configuration has one) in (frame, row, column) order. ConsisID (``ConsisIDTransformer3DModel``) packs the same way.
- EasyAnimate (``EasyAnimateTransformer3DModel``): joint attention over the text stream first (then the optional
  second, T5, stream), then each latent frame patchified by ``patch_size``.
- Mochi (``MochiTransformer3DModel``): per batch item, attention over the patchified latent (frame by frame)
  then that prompt's valid text tokens only, so one layout per prompt length (the count is one device read per
  forward).
- Flux (``FluxTransformer2DModel``): joint attention over the text stream first, then the image tokens
  (both in the dual-stream blocks, which concatenate text before image, and in the single-stream
  blocks). ``img_ids`` give the image grid and, where Flux Kontext appends a reference image's tokens (index 1 in
  the ids' first column), where that conditioning starts: it is kept dense. One device read per forward.
"""

from __future__ import annotations

import math

import torch

from ..layout import TokenLayout
from .base import ForwardLayouts, arg


def cogvideox(model, args, kwargs) -> ForwardLayouts:
    """CogVideoX and ConsisID: the text, then the latent [B, F, C, H, W]."""
    family = type(model).__name__.removesuffix("Transformer3DModel")
    hs = arg(args, kwargs, "hidden_states", 0)
    ehs = arg(args, kwargs, "encoder_hidden_states", 1)
    if not isinstance(hs, torch.Tensor) or hs.dim() != 5 or not isinstance(ehs, torch.Tensor):
        return ForwardLayouts((), f"{family}: hidden_states [B, F, C, H, W] / encoder_hidden_states missing")
    _, f, _, h, w = hs.shape
    return text_then_latent(family, model, ehs.shape[1], f, h, w, getattr(model.config, "patch_size_t", None) or 1)


def easyanimate(model, args, kwargs) -> ForwardLayouts:
    """The text stream (and the T5 stream after it, where one is passed), then the latent [B, C, F, H, W]."""
    hs = arg(args, kwargs, "hidden_states", 0)
    ehs, t5 = kwargs.get("encoder_hidden_states"), kwargs.get("encoder_hidden_states_t5")
    if not isinstance(hs, torch.Tensor) or hs.dim() != 5 or not isinstance(ehs, torch.Tensor):
        return ForwardLayouts((), "EasyAnimate: hidden_states [B, C, F, H, W] / encoder_hidden_states missing")
    n_txt = ehs.shape[1] + (t5.shape[1] if isinstance(t5, torch.Tensor) else 0)
    _, _, f, h, w = hs.shape
    return text_then_latent("EasyAnimate", model, n_txt, f, h, w, 1)


def text_then_latent(family: str, model, n_txt: int, f: int, h: int, w: int, pt: int) -> ForwardLayouts:
    p = model.config.patch_size
    grid = (f // pt, h // p, w // p)
    return ForwardLayouts((TokenLayout.of(("text", n_txt), ("video", math.prod(grid)), grid=grid,
                                          source=f"{family}: {n_txt} text tokens, then latent {f}x{h}x{w} / "
                                                 f"patch {pt}x{p}x{p}"),))


def mochi(model, args, kwargs) -> ForwardLayouts:
    hs = arg(args, kwargs, "hidden_states", 0)
    mask = arg(args, kwargs, "encoder_attention_mask", 3)
    if not isinstance(hs, torch.Tensor) or hs.dim() != 5 or not isinstance(mask, torch.Tensor):
        return ForwardLayouts((), "Mochi: hidden_states [B, C, F, H, W] / encoder_attention_mask missing")
    p = model.config.patch_size
    _, _, f, h, w = hs.shape
    grid = (f, h // p, w // p)
    counts = sorted(set(mask.sum(dim=1, dtype=torch.int64).tolist()))  # one device read per forward
    return ForwardLayouts(tuple(
        TokenLayout.of(("video", math.prod(grid)), ("text", n), grid=grid,
                       source=f"Mochi: latent {f}x{h}x{w} / patch 1x{p}x{p}, then {n} text tokens")
        for n in counts))


def flux(model, args, kwargs) -> ForwardLayouts:
    hs = arg(args, kwargs, "hidden_states", 0)
    ehs = arg(args, kwargs, "encoder_hidden_states", 1)
    if not isinstance(hs, torch.Tensor) or not isinstance(ehs, torch.Tensor):
        return ForwardLayouts((), "Flux: hidden_states / encoder_hidden_states missing")
    n_img, n_txt = hs.shape[1], ehs.shape[1]
    ids = kwargs.get("img_ids")
    ids = ids[0] if isinstance(ids, torch.Tensor) and ids.dim() == 3 else ids
    if not isinstance(ids, torch.Tensor) or ids.shape[0] != n_img:
        return ForwardLayouts((TokenLayout.of(("text", n_txt), ("image", n_img),
                                              source=f"Flux: {n_txt} text tokens, then {n_img} image tokens"),))
    ref = ids[:, 0] != 0  # Flux Kontext's reference images: index 1 in the ids' first column, after the latent
    # one device read per forward: how many reference tokens, where the first one is, the generated image's rows
    n_ref, first, last_row = (int(x) for x in torch.stack(
        [ref.sum().double(), ref.int().argmax().double(), ids[:, 1].masked_fill(ref, -1).max().double()]).tolist())
    if n_ref and first != n_img - n_ref:
        return ForwardLayouts((), "Flux: the reference-image tokens do not close the image stream")
    n_gen, rows = n_img - n_ref, last_row + 1
    grid = (1, rows, n_gen // rows) if rows > 0 and n_gen % rows == 0 else None
    ref_text = f", then {n_ref} reference-image tokens kept dense" if n_ref else ""
    return ForwardLayouts((TokenLayout.of(("text", n_txt), ("image", n_gen), ("conditioning", n_ref), grid=grid,
                                          source=f"Flux: {n_txt} text tokens, then {n_gen} image tokens{ref_text}"),))
