"""Token layouts read from what each host family passes its denoiser, for families verified to pack so.

A layout is only ever read from the arguments of the denoiser's forward (shapes, the latent grid, the
text stream's length); it is never guessed from a sequence length. Verified here (and by
``tests/test_sparse_families.py`` on the real classes: perturbing the text, the latent or a reference image
changes exactly the rows the layout gives it at the first attention site):

- Wan (``WanTransformer3DModel``): ``hidden_states`` [B, C, F, H, W] patchified by ``patch_size`` in
  (frame, row, column) order; self-attention sees video tokens only (text enters by cross-attention).
  Wan 2.2's TI2V passes one timestep per token, 0 for the first frame where it starts from an image: those
  frames are conditioning, kept dense (one device read per forward).
- LTX-Video (``LTXVideoTransformer3DModel``): packed ``hidden_states`` [B, F·H·W, C] with ``num_frames``,
  ``height``, ``width`` given; self-attention sees video tokens only. Image to video passes one timestep per token,
  0 on the first frame (the image): conditioning, kept dense, as Wan 2.2's TI2V. Its condition pipeline passes
  each token's coordinates (``video_coords``) instead of the grid and prepends the tokens of conditions placed at
  later frames: those are conditioning, kept dense, and the grid is read from the coordinates' tail (one device
  read per forward).
- Wan VACE (``WanVACETransformer3DModel``), SkyReels-V2 (``SkyReelsV2Transformer3DModel``), ChronoEdit
  (``ChronoEditTransformer3DModel``, Wan 2.1 with its own rotary positions) and Cosmos (``CosmosTransformer3DModel``,
  whose condition and padding masks join the latent's channels, not its tokens): Wan's patchified latent. VACE's control blocks attend over the control latent, patchified to the same grid;
  SkyReels-V2's diffusion forcing passes a causal block mask, and masked calls stay dense (the router).
- Wan Animate (``WanAnimateTransformer3DModel``): Wan's patchified latent, whose first frame is the reference
  character's (the pipeline concatenates the reference image's latent before the segment's frames). That frame's
  tokens are conditioning, kept dense; the pose latent joins the other frames only.
- Helios (``HeliosTransformer3DModel``): Wan's patchified latent after the history streams it is given (long,
  then mid, then short: patched 4x, 2x and 1x the latent's patch, the first two padded up to whole patches), which
  are conditioning, kept dense. Text enters by cross-attention.
- Allegro (``AllegroTransformer3DModel``): each latent frame patchified by ``patch_size``, frame by frame;
  self-attention sees video tokens only.
- LTX-2 (``LTX2VideoTransformer3DModel``): the video stream as LTX-Video packs it, for the video self-attention
  (``attn1``) only; the audio stream's self-attention and the cross-modal attention stay dense.
- CogVideoX (``CogVideoXTransformer3DModel``): joint attention over the text stream first, then the
  ``hidden_states`` [B, F, C, H, W] latent patchified by ``patch_size`` (and ``patch_size_t`` when the
  configuration has one) in (frame, row, column) order. ConsisID (``ConsisIDTransformer3DModel``) packs the same way.
- EasyAnimate (``EasyAnimateTransformer3DModel``): joint attention over the text stream first (then the optional
  second, T5, stream), then each latent frame patchified by ``patch_size``.
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
- Kandinsky 5 (``Kandinsky5Transformer3DModel``): the latent [B, F, H, W, C] patchified by ``patch_size`` in
  (frame, row, column) order, for the visual blocks' self-attention only (``visual_transformer_blocks``; the text
  blocks attend over the text alone). Where the pipeline passes ``sparse_params`` the host runs its own sparse
  attention (NABLA) over tokens reordered in 8x8 patches: no layout.
- Motif Video (``MotifVideoTransformer3DModel``): joint attention over the patchified latent, then (image to
  video) the image's tokens, kept dense, then the text, whose tail past ``encoder_attention_mask``'s count is
  padding hidden by a key mask [B, 1, 1, S] (KEY_PADDING). Its decoder blocks attend over the latent twice and have
  no layout. One device read per forward where a mask is given.
- Kandinsky 6 (``Kandinsky6Transformer3DModel``): the latent [B, F, H, W, C] patchified in (frame, row, column)
  order, for the fused blocks' video self-attention only (``video_dec_block``; audio and text stay dense). Image
  to video appends the reference image as a last frame of token type 1: conditioning, kept dense (one device read
  per forward where ``visual_token_type_ids`` is given).
- Mochi (``MochiTransformer3DModel``): per batch item, attention over the patchified latent (frame by frame)
  then that prompt's valid text tokens only, so one layout per prompt length (the count is one device read per
  forward).
- Flux (``FluxTransformer2DModel``): joint attention over the text stream first, then the image tokens
  (both in the dual-stream blocks, which concatenate text before image, and in the single-stream
  blocks). ``img_ids`` give the image grid and, where Flux Kontext appends a reference image's tokens (index 1 in
  the ids' first column), where that conditioning starts: it is kept dense. One device read per forward.

Any other class has no layout: its sites stay dense and say so.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .layout import TokenLayout


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


def _arg(args: tuple, kwargs: dict, name: str, index: int):
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else None


def _wan(model, args, kwargs) -> ForwardLayouts:
    hs = _arg(args, kwargs, "hidden_states", 0)
    family = type(model).__name__.removesuffix("Transformer3DModel")  # Wan, WanVACE, SkyReelsV2, Cosmos
    if not isinstance(hs, torch.Tensor) or hs.dim() != 5:
        return ForwardLayouts((), f"{family}: hidden_states is not a [B, C, F, H, W] tensor")
    pt, ph, pw = model.config.patch_size
    _, _, f, h, w = hs.shape
    grid = (f // pt, h // ph, w // pw)
    return _video_after_clean_frames(grid, _arg(args, kwargs, "timestep", 1),
                                     f"{family}: latent {f}x{h}x{w} / patch {pt}x{ph}x{pw}")


def _video_after_clean_frames(grid: tuple[int, int, int], timestep: object, source: str) -> ForwardLayouts:
    """The latent grid's tokens as video, but for its first frames where a per-token timestep marks them clean (the
    image an image-to-video pipeline starts from): those are conditioning, kept dense."""
    clean = _clean_leading_frames(timestep, grid)
    if clean:
        per_frame = grid[1] * grid[2]
        return ForwardLayouts((TokenLayout.of(("conditioning", clean * per_frame),
                                              ("video", (grid[0] - clean) * per_frame),
                                              grid=(grid[0] - clean, *grid[1:]),
                                              source=f"{source}, its first {clean} frame(s) at timestep 0 (the "
                                                     f"image it starts from) kept dense"),))
    return ForwardLayouts((TokenLayout.of(("video", math.prod(grid)), grid=grid, source=source),))


def _clean_leading_frames(timestep: object, grid: tuple[int, int, int]) -> int:
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


def _wan_animate(model, args, kwargs) -> ForwardLayouts:
    """Wan's latent, whose first frame holds the reference image: conditioning, kept dense."""
    found = _wan(model, args, kwargs)
    if not found.layouts:
        return found
    (f, h, w), pt = found.layouts[0].grid, model.config.patch_size[0]
    if pt != 1 or f < 2:
        return ForwardLayouts((), f"WanAnimate: the reference frame is not a frame of tokens (patch {pt} in time, "
                                  f"{f} frames of tokens)")
    return ForwardLayouts((TokenLayout.of(("conditioning", h * w), ("video", (f - 1) * h * w), grid=(f - 1, h, w),
                                          source=f"WanAnimate: the reference frame's {h * w} tokens kept dense, then "
                                                 f"{f - 1}x{h}x{w} video tokens"),))


def _allegro(model, args, kwargs) -> ForwardLayouts:
    hs = _arg(args, kwargs, "hidden_states", 0)
    if not isinstance(hs, torch.Tensor) or hs.dim() != 5:
        return ForwardLayouts((), "Allegro: hidden_states is not a [B, C, F, H, W] tensor")
    p = model.config.patch_size
    _, _, f, h, w = hs.shape
    grid = (f, h // p, w // p)  # each frame patchified on its own: no temporal patch
    return ForwardLayouts((TokenLayout.of(("video", math.prod(grid)), grid=grid,
                                          source=f"Allegro: latent {f}x{h}x{w} / patch 1x{p}x{p}"),))


def _ltx(model, args, kwargs, family: str = "LTX-Video") -> ForwardLayouts:
    hs = _arg(args, kwargs, "hidden_states", 0)
    f, h, w = (kwargs.get(k) for k in ("num_frames", "height", "width"))
    coords = kwargs.get("video_coords")
    if isinstance(hs, torch.Tensor) and None in (f, h, w) and isinstance(coords, torch.Tensor):
        return _ltx_from_coords(hs, coords, _arg(args, kwargs, "timestep", 2), family)
    if not isinstance(hs, torch.Tensor) or None in (f, h, w):
        return ForwardLayouts((), f"{family}: num_frames, height and width were not passed")
    p, pt = model.config.patch_size, model.config.patch_size_t
    grid = (int(f) // pt, int(h) // p, int(w) // p)
    if math.prod(grid) != hs.shape[1]:
        return ForwardLayouts((), f"{family}: grid {grid} does not cover {hs.shape[1]} tokens")
    return _video_after_clean_frames(grid, _arg(args, kwargs, "timestep", 2),
                                     f"{family}: latent grid {grid[0]}x{grid[1]}x{grid[2]}")


def _ltx_from_coords(hs: torch.Tensor, coords: torch.Tensor, timestep: object, family: str) -> ForwardLayouts:
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
    generated = _video_after_clean_frames(grid, tail, source).layouts[0]
    return ForwardLayouts((TokenLayout.of(("conditioning", start),
                                          *((seg.kind, seg.end - seg.start) for seg in generated.segments),
                                          grid=generated.grid, source=generated.source),))


def _ltx2(model, args, kwargs) -> ForwardLayouts:
    """The video stream as LTX-Video packs it; its self-attention modules are ``attn1``. The audio stream's
    (``audio_attn1``) and the cross-modal modules stay dense."""
    return dataclasses.replace(_ltx(model, args, kwargs, family="LTX-2"), modules=("attn1",))


def _kandinsky5(model, args, kwargs) -> ForwardLayouts:
    hs = _arg(args, kwargs, "hidden_states", 0)
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


def _kandinsky6(model, args, kwargs) -> ForwardLayouts:
    """The patchified latent [B, F, H, W, C], whose frames with a nonzero ``visual_token_type_ids`` (the reference
    image its pipeline appends as a last frame) are conditioning; for the video self-attention of the fused blocks
    only (``video_dec_block``): the audio stream and the text blocks stay dense."""
    hs = _arg(args, kwargs, "hidden_states", 0)
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


def _cogvideox(model, args, kwargs) -> ForwardLayouts:
    """CogVideoX and ConsisID: the text, then the latent [B, F, C, H, W]."""
    family = type(model).__name__.removesuffix("Transformer3DModel")
    hs = _arg(args, kwargs, "hidden_states", 0)
    ehs = _arg(args, kwargs, "encoder_hidden_states", 1)
    if not isinstance(hs, torch.Tensor) or hs.dim() != 5 or not isinstance(ehs, torch.Tensor):
        return ForwardLayouts((), f"{family}: hidden_states [B, F, C, H, W] / encoder_hidden_states missing")
    _, f, _, h, w = hs.shape
    return _text_then_latent(family, model, ehs.shape[1], f, h, w, getattr(model.config, "patch_size_t", None) or 1)


def _easyanimate(model, args, kwargs) -> ForwardLayouts:
    """The text stream (and the T5 stream after it, where one is passed), then the latent [B, C, F, H, W]."""
    hs = _arg(args, kwargs, "hidden_states", 0)
    ehs, t5 = kwargs.get("encoder_hidden_states"), kwargs.get("encoder_hidden_states_t5")
    if not isinstance(hs, torch.Tensor) or hs.dim() != 5 or not isinstance(ehs, torch.Tensor):
        return ForwardLayouts((), "EasyAnimate: hidden_states [B, C, F, H, W] / encoder_hidden_states missing")
    n_txt = ehs.shape[1] + (t5.shape[1] if isinstance(t5, torch.Tensor) else 0)
    _, _, f, h, w = hs.shape
    return _text_then_latent("EasyAnimate", model, n_txt, f, h, w, 1)


def _text_then_latent(family: str, model, n_txt: int, f: int, h: int, w: int, pt: int) -> ForwardLayouts:
    p = model.config.patch_size
    grid = (f // pt, h // p, w // p)
    return ForwardLayouts((TokenLayout.of(("text", n_txt), ("video", math.prod(grid)), grid=grid,
                                          source=f"{family}: {n_txt} text tokens, then latent {f}x{h}x{w} / "
                                                 f"patch {pt}x{p}x{p}"),))


def _hunyuan_video(model, args, kwargs) -> ForwardLayouts:
    hs = _arg(args, kwargs, "hidden_states", 0)
    ehs = _arg(args, kwargs, "encoder_hidden_states", 2)
    mask = _arg(args, kwargs, "encoder_attention_mask", 3)
    if not isinstance(hs, torch.Tensor) or hs.dim() != 5 or not isinstance(ehs, torch.Tensor):
        return ForwardLayouts((), "HunyuanVideo: hidden_states [B, C, F, H, W] / encoder_hidden_states missing")
    n_txt = ehs.shape[1]
    if not isinstance(mask, torch.Tensor) or mask.shape != ehs.shape[:2]:
        return ForwardLayouts((), "HunyuanVideo: encoder_attention_mask [B, text] missing")
    counts = mask.sum(dim=1, dtype=torch.int64).tolist()  # one device read per forward
    # image to video by token replacement: the first latent frame is the image, modulated at timestep 0
    clean = 1 if getattr(model.config, "image_condition_type", None) == "token_replace" else 0
    return _latent_then_padded_text("HunyuanVideo", model, hs, counts, n_txt, "text tokens", KEY_PADDING,
                                    clean_frames=clean)


def _hunyuan_video15(model, args, kwargs) -> ForwardLayouts:
    hs = _arg(args, kwargs, "hidden_states", 0)
    ehs, mask = _arg(args, kwargs, "encoder_hidden_states", 2), _arg(args, kwargs, "encoder_attention_mask", 3)
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
    return _latent_then_padded_text("HunyuanVideo 1.5", model, hs, counts, n_txt, "valid image and text tokens",
                                    PAIR_PADDING)


def _latent_then_padded_text(family: str, model, hs: torch.Tensor, counts: list[int], n_txt: int, what: str,
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


def _motif_video(model, args, kwargs) -> ForwardLayouts:
    hs = _arg(args, kwargs, "hidden_states", 0)
    ehs, mask = _arg(args, kwargs, "encoder_hidden_states", 2), _arg(args, kwargs, "encoder_attention_mask", 3)
    image = _arg(args, kwargs, "image_embeds", 4)
    if not isinstance(hs, torch.Tensor) or hs.dim() != 5 or not isinstance(ehs, torch.Tensor):
        return ForwardLayouts((), "MotifVideo: hidden_states [B, C, F, H, W] / encoder_hidden_states missing")
    n_txt = ehs.shape[1]
    # one device read per forward, where a mask is given
    counts = mask.sum(dim=1, dtype=torch.int64).tolist() if isinstance(mask, torch.Tensor) else [n_txt]
    n_img = image.shape[1] if isinstance(image, torch.Tensor) else 0
    return _latent_then_padded_text("MotifVideo", model, hs, counts, n_txt, "text tokens", KEY_PADDING, n_img)


def _framepack(model, args, kwargs) -> ForwardLayouts:
    hs = _arg(args, kwargs, "hidden_states", 0)
    ehs, mask = _arg(args, kwargs, "encoder_hidden_states", 2), _arg(args, kwargs, "encoder_attention_mask", 3)
    image = _arg(args, kwargs, "image_embeds", 5)
    if not all(isinstance(t, torch.Tensor) for t in (hs, ehs, mask, image)) or hs.dim() != 5:
        return ForwardLayouts((), "Framepack: hidden_states [B, C, F, H, W], encoder_hidden_states, its mask or "
                                  "image_embeds missing")
    pt, p = model.config.patch_size_t, model.config.patch_size
    _, _, f, h, w = hs.shape
    grid = (f // pt, h // p, w // p)
    history = _history_tokens(kwargs, (("latents_clean", None, (1, 2, 2)),
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


def _history_tokens(kwargs: dict, streams) -> int:
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


def _helios(model, args, kwargs) -> ForwardLayouts:
    """Wan's latent after three history streams (long, mid, short), all conditioning."""
    found = _wan(model, args, kwargs)
    if not found.layouts:
        return found
    p = tuple(model.config.patch_size)
    history = _history_tokens(kwargs, (("latents_history_short", None, p),
                                       ("latents_history_mid", (2, 4, 4), tuple(2 * k for k in p)),
                                       ("latents_history_long", (4, 8, 8), tuple(4 * k for k in p))))
    video = found.layouts[0]
    return ForwardLayouts((TokenLayout.of(("conditioning", history), ("video", video.length), grid=video.grid,
                                          source=f"Helios: {history} history tokens kept dense, then "
                                                 f"{video.source.removeprefix('Helios: ')}"),))


def _mochi(model, args, kwargs) -> ForwardLayouts:
    hs = _arg(args, kwargs, "hidden_states", 0)
    mask = _arg(args, kwargs, "encoder_attention_mask", 3)
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


def _flux(model, args, kwargs) -> ForwardLayouts:
    hs = _arg(args, kwargs, "hidden_states", 0)
    ehs = _arg(args, kwargs, "encoder_hidden_states", 1)
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


FAMILIES: dict[str, Callable[..., ForwardLayouts]] = {
    "WanTransformer3DModel": _wan,
    "WanVACETransformer3DModel": _wan,
    "SkyReelsV2Transformer3DModel": _wan,
    "CosmosTransformer3DModel": _wan,
    "ChronoEditTransformer3DModel": _wan,
    "WanAnimateTransformer3DModel": _wan_animate,
    "AllegroTransformer3DModel": _allegro,
    "CogVideoXTransformer3DModel": _cogvideox,
    "ConsisIDTransformer3DModel": _cogvideox,
    "EasyAnimateTransformer3DModel": _easyanimate,
    "HeliosTransformer3DModel": _helios,
    "Kandinsky5Transformer3DModel": _kandinsky5,
    "Kandinsky6Transformer3DModel": _kandinsky6,
    "HunyuanVideoFramepackTransformer3DModel": _framepack,
    "HunyuanVideoTransformer3DModel": _hunyuan_video,
    "HunyuanVideo15Transformer3DModel": _hunyuan_video15,
    "MochiTransformer3DModel": _mochi,
    "MotifVideoTransformer3DModel": _motif_video,
    "LTXVideoTransformer3DModel": _ltx,
    "LTX2VideoTransformer3DModel": _ltx2,
    "FluxTransformer2DModel": _flux,
}


# families whose boolean attention masks hide only their layout's trailing padding (``ForwardLayouts.padding_mask``)
FAMILIES_WITH_PADDING_MASKS = frozenset({"HunyuanVideoTransformer3DModel",
                                         "HunyuanVideo15Transformer3DModel",
                                         "HunyuanVideoFramepackTransformer3DModel",
                                         "MotifVideoTransformer3DModel"})


def layouts_of_forward(model: torch.nn.Module, args: tuple, kwargs: dict) -> ForwardLayouts:
    """The layouts of ``model``'s self-attention sequences for this forward's arguments."""
    reader = FAMILIES.get(type(model).__name__)
    if reader is None:
        return ForwardLayouts((), f"no verified token layout for {type(model).__name__} "
                                  f"(verified: {', '.join(FAMILIES)}); its attention stays dense")
    try:
        return reader(model, args, kwargs)
    except Exception as exc:  # noqa: BLE001 - read in the host's forward, which a reader must never fail
        return ForwardLayouts((), f"{type(model).__name__}: no layout could be read from this forward's arguments "
                                  f"({type(exc).__name__}: {exc}); its attention stays dense")
