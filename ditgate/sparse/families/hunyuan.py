"""HunyuanVideo's lineage and Motif Video: the latent, then the text streams, whose padding a boolean mask hides.

- HunyuanVideo (``HunyuanVideoTransformer3DModel``): joint attention over the patchified latent first, then the
  text stream, whose tail past ``encoder_attention_mask``'s count is padding. The host passes a boolean key mask
  [B, 1, 1, S] that hides exactly that padding (``padding_mask``): every form is handed such a call as attention
  over the keys before the padding, with no mask (``padding.py``). The count is one device read per forward; a
  batch whose items differ in it has no layout.
  Its image-to-video configuration by token replacement (``image_condition_type="token_replace"``) modulates the
  first latent frame at timestep 0: that frame, the image, is conditioning, kept dense.
- HunyuanVideo 1.5 (``HunyuanVideo15Transformer3DModel``): the patchified latent, then one stream of an image's
  tokens, the glyph (ByT5) text and the prompt, each stream's valid tokens first and all padding last; an
  all-zero ``image_embeds`` (text to video) makes every image token padding. Its mask [B, 1, S, S] hides the
  padding's keys and its rows (PAIR_PADDING), whose outputs the host returns as zeros. One device read per
  forward.
- HunyuanVideo Framepack (``HunyuanVideoFramepackTransformer3DModel``): the history latents (4x, then 2x
  downsampled, then the clean frames), then the latent window, then the image's tokens and the valid text; with
  more than one prompt, the text's padding follows under a key mask [B, 1, 1, S] (KEY_PADDING), and with one the
  host cuts it off. The history and the image are conditioning, kept dense. One device read per forward.
- Motif Video (``MotifVideoTransformer3DModel``): joint attention over the patchified latent, then (image to
  video) the image's tokens, kept dense, then the text, whose tail past ``encoder_attention_mask``'s count is
  padding hidden by a key mask [B, 1, 1, S] (KEY_PADDING). Its decoder blocks attend over the latent twice and have
  no layout. One device read per forward where a mask is given.
"""

from __future__ import annotations

import math

import torch

from ..layout import TokenLayout
from .base import KEY_PADDING, PAIR_PADDING, ForwardLayouts, arg, history_tokens


def hunyuan_video(model, args, kwargs) -> ForwardLayouts:
    hs = arg(args, kwargs, "hidden_states", 0)
    ehs = arg(args, kwargs, "encoder_hidden_states", 2)
    mask = arg(args, kwargs, "encoder_attention_mask", 3)
    if not isinstance(hs, torch.Tensor) or hs.dim() != 5 or not isinstance(ehs, torch.Tensor):
        return ForwardLayouts((), "HunyuanVideo: hidden_states [B, C, F, H, W] / encoder_hidden_states missing")
    n_txt = ehs.shape[1]
    if not isinstance(mask, torch.Tensor) or mask.shape != ehs.shape[:2]:
        return ForwardLayouts((), "HunyuanVideo: encoder_attention_mask [B, text] missing")
    counts = mask.sum(dim=1, dtype=torch.int64).tolist()  # one device read per forward
    # image to video by token replacement: the first latent frame is the image, modulated at timestep 0
    clean = 1 if getattr(model.config, "image_condition_type", None) == "token_replace" else 0
    return latent_then_padded_text("HunyuanVideo", model, hs, counts, n_txt, "text tokens", KEY_PADDING,
                                    clean_frames=clean)


def hunyuan_video15(model, args, kwargs) -> ForwardLayouts:
    hs = arg(args, kwargs, "hidden_states", 0)
    ehs, mask = arg(args, kwargs, "encoder_hidden_states", 2), arg(args, kwargs, "encoder_attention_mask", 3)
    ehs2, mask2 = kwargs.get("encoder_hidden_states_2"), kwargs.get("encoder_attention_mask_2")
    image = kwargs.get("image_embeds")
    streams = (hs, ehs, mask, ehs2, mask2, image)
    if not all(isinstance(t, torch.Tensor) for t in streams) or hs.dim() != 5:
        return ForwardLayouts((), "HunyuanVideo 1.5: hidden_states [B, C, F, H, W], both text streams with their "
                                  "masks, or image_embeds missing")
    n_txt = image.shape[1] + ehs2.shape[1] + ehs.shape[1]
    # one device read per forward: each item's valid tokens of both text streams, and whether an image is given
    # (an all-zero image_embeds, over the whole batch, is text to video: the model then masks every image token)
    given = (image != 0).any().long().expand(mask.shape[0])
    counts = [a + b + g * image.shape[1] for a, b, g in torch.stack([mask.sum(1), mask2.sum(1), given], 1).tolist()]
    return latent_then_padded_text("HunyuanVideo 1.5", model, hs, counts, n_txt, "valid image and text tokens",
                                    PAIR_PADDING)


def latent_then_padded_text(family: str, model, hs: torch.Tensor, counts: list[int], n_txt: int, what: str,
                             padding_mask: str, image: int = 0, clean_frames: int = 0) -> ForwardLayouts:
    """HunyuanVideo's packing: the latent [B, C, F, H, W] patchified by ``patch_size_t`` x ``patch_size``² (its first
    ``clean_frames`` the clean image it starts from: conditioning), then ``image`` tokens of an image's embedding
    (conditioning), then a text stream of ``n_txt`` tokens whose first ``counts[i]`` are valid for batch item ``i``
    and the rest padding. Items that differ in their count have no layout (one mask per call serves them all)."""
    if len(set(counts)) != 1:
        return ForwardLayouts((), f"{family}: the batch's prompts differ in length ({sorted(set(counts))} tokens)")
    valid = counts[0]
    pt, p = model.config.patch_size_t, model.config.patch_size
    _, _, f, h, w = hs.shape
    grid = (f // pt, h // p, w // p)
    clean = clean_frames * grid[1] * grid[2]
    then = f"{image} image tokens, " if image else ""
    first = f", its first {clean_frames} frame(s) the image it starts from, kept dense" if clean_frames else ""
    return ForwardLayouts((TokenLayout.of(("conditioning", clean), ("video", math.prod(grid) - clean),
                                          ("conditioning", image), ("text", valid), ("padding", n_txt - valid),
                                          grid=(grid[0] - clean_frames, *grid[1:]),
                                          source=f"{family}: latent {f}x{h}x{w} / patch {pt}x{p}x{p}{first}, then "
                                                 f"{then}{valid} {what} and {n_txt - valid} of padding"),),
                          padding_mask=padding_mask)


def motif_video(model, args, kwargs) -> ForwardLayouts:
    hs = arg(args, kwargs, "hidden_states", 0)
    ehs, mask = arg(args, kwargs, "encoder_hidden_states", 2), arg(args, kwargs, "encoder_attention_mask", 3)
    image = arg(args, kwargs, "image_embeds", 4)
    if not isinstance(hs, torch.Tensor) or hs.dim() != 5 or not isinstance(ehs, torch.Tensor):
        return ForwardLayouts((), "MotifVideo: hidden_states [B, C, F, H, W] / encoder_hidden_states missing")
    n_txt = ehs.shape[1]
    # one device read per forward, where a mask is given
    counts = mask.sum(dim=1, dtype=torch.int64).tolist() if isinstance(mask, torch.Tensor) else [n_txt]
    n_img = image.shape[1] if isinstance(image, torch.Tensor) else 0
    return latent_then_padded_text("MotifVideo", model, hs, counts, n_txt, "text tokens", KEY_PADDING, n_img)


def framepack(model, args, kwargs) -> ForwardLayouts:
    hs = arg(args, kwargs, "hidden_states", 0)
    ehs, mask = arg(args, kwargs, "encoder_hidden_states", 2), arg(args, kwargs, "encoder_attention_mask", 3)
    image = arg(args, kwargs, "image_embeds", 5)
    if not all(isinstance(t, torch.Tensor) for t in (hs, ehs, mask, image)) or hs.dim() != 5:
        return ForwardLayouts((), "Framepack: hidden_states [B, C, F, H, W], encoder_hidden_states, its mask or "
                                  "image_embeds missing")
    pt, p = model.config.patch_size_t, model.config.patch_size
    _, _, f, h, w = hs.shape
    grid = (f // pt, h // p, w // p)
    history = history_tokens(kwargs, (("latents_clean", None, (1, 2, 2)),
                                       ("latents_history_2x", (2, 4, 4), (2, 4, 4)),
                                       ("latents_history_4x", (4, 8, 8), (4, 8, 8))))
    counts = sorted(set(mask.sum(dim=1, dtype=torch.int64).tolist()))  # one device read per forward
    if len(counts) != 1:
        return ForwardLayouts((), f"Framepack: the batch's prompts differ in length ({counts} tokens)")
    valid, n_img = counts[0], image.shape[1]
    padding = ehs.shape[1] - valid if hs.shape[0] > 1 else 0  # one prompt: the host cuts its padding off
    return ForwardLayouts((TokenLayout.of(
        ("conditioning", history), ("video", math.prod(grid)), ("conditioning", n_img), ("text", valid),
        ("padding", padding), grid=grid,
        source=f"Framepack: {history} history tokens kept dense, latent {f}x{h}x{w} / patch {pt}x{p}x{p}, then "
               f"{n_img} image and {valid} text tokens" + (f" and {padding} of padding" if padding else "")),),
        padding_mask=KEY_PADDING)
