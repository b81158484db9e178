"""Token layouts read from real diffusers classes (tiny configurations, random weights).

A layout is right when the tokens it calls text are exactly the tokens of the first self-attention call
that depend on the text: perturb only ``encoder_hidden_states`` and see which query rows move.
"""

import dataclasses

import pytest
import torch

import ditgate
from ditgate.models.presets import get_preset
from ditgate.sparse.families import layouts_of_forward

from .helpers import CaptureForm, Tiny, twice


def _queries(tiny: Tiny, *overrides: dict) -> list[torch.Tensor]:
    """Every attention call's queries, in call order, over one forward per dict of ``overrides``."""
    cap = CaptureForm()
    plan = ditgate.attach(tiny.model, forms=["capture"], measure=False, extra_forms=[cap])
    try:
        for changed in overrides:
            tiny.forward(**changed)
    finally:
        plan.detach()
    return cap.queries


def _first_self_queries(tiny: Tiny, length: int | None = None, **overrides) -> torch.Tensor:
    """The queries of the forward's first attention call, or of its first over ``length`` tokens (HunyuanVideo's
    token refiner attends over its text alone first)."""
    return next(x for x in _queries(tiny, overrides) if length is None or x.shape[2] == length)


@pytest.mark.parametrize("name, kinds", [("tiny-wan", {"video"}), ("tiny-ltx", {"video"}),
                                         ("tiny-flux", {"text", "image"}), ("tiny-cogvideox", {"text", "video"}),
                                         ("tiny-wan-vace", {"video"}), ("tiny-skyreels-v2", {"video"}),
                                         ("tiny-cosmos", {"video"}), ("tiny-chronoedit", {"video"}),
                                         ("tiny-allegro", {"video"}), ("tiny-consisid", {"text", "video"}),
                                         ("tiny-easyanimate", {"text", "video"}),
                                         ("tiny-helios", {"conditioning", "video"})])
def test_the_layout_puts_every_text_token_where_the_model_keeps_it(name, kinds):
    tiny = Tiny(name)
    found = layouts_of_forward(tiny.model, (), tiny.inputs)
    assert not found.reason and len(found.layouts) == 1
    layout = found.layouts[0]
    assert {s.kind for s in layout.segments} == kinds
    q = _first_self_queries(tiny)
    assert q.shape[2] == layout.length  # the first attention call is a self-attention over exactly this
    assert layout.grid is not None and layout.visual().end - layout.visual().start == torch.Size(layout.grid).numel()
    other = tiny.inputs["encoder_hidden_states"] + 1.0
    moved = (_first_self_queries(tiny, encoder_hidden_states=other) - q).abs().amax(dim=(0, 1, 3)) > 1e-6
    text = torch.tensor([k == "text" for k in layout.token_kinds()])
    assert torch.equal(moved, text)  # text rows move, video/image rows do not


def test_flux_text_comes_first_then_the_image_grid():
    tiny = Tiny("tiny-flux")
    layout = layouts_of_forward(tiny.model, (), tiny.inputs).layouts[0]
    n_txt = tiny.inputs["encoder_hidden_states"].shape[1]
    assert layout.segments[0].kind == "text" and layout.segments[0].end == n_txt
    assert layout.grid == (1, 4, 4)  # the 8x8 latent packed 2x2


def test_cogvideox_text_comes_first_then_the_latent_grid():
    tiny = Tiny("tiny-cogvideox")
    layout = layouts_of_forward(tiny.model, (), tiny.inputs).layouts[0]
    n_txt = tiny.inputs["encoder_hidden_states"].shape[1]
    assert [(s.kind, s.end - s.start) for s in layout.segments] == [("text", n_txt), ("video", 2 * 4 * 4)]
    assert layout.grid == (2, 4, 4) and layout.source.startswith("CogVideoX: 8 text tokens")


def test_an_unverified_family_has_no_layout_and_says_why():
    tiny = Tiny("tiny-pixart")
    found = layouts_of_forward(tiny.model, (), tiny.inputs)
    assert found.layouts == () and "PixArtTransformer2DModel" in found.reason and "dense" in found.reason


def test_hunyuan_video_puts_the_latent_first_then_text_then_the_masked_padding():
    tiny = Tiny("tiny-hunyuan-video")
    found = layouts_of_forward(tiny.model, (), tiny.inputs)
    layout = found.layouts[0]
    assert found.padding_mask and layout.grid == (2, 4, 4)
    assert [(s.kind, s.end - s.start) for s in layout.segments] == [("video", 32), ("text", 6), ("padding", 2)]
    assert layout.keys_end == 38
    queries = _queries(tiny, {}, {"encoder_hidden_states": tiny.inputs["encoder_hidden_states"] + 1.0})
    # each forward: the token refiner's attention over the 8 text tokens alone, then the joint blocks'
    assert [x.shape[2] for x in queries] == [8, 40, 40] * 2
    joint, moved_joint = queries[1], queries[4]
    moved = (moved_joint - joint).abs().amax(dim=(0, 1, 3)) > 1e-6
    not_video = torch.tensor([k != "video" for k in layout.token_kinds()])
    assert torch.equal(moved, not_video)  # text and padding rows move, video rows do not


def test_hunyuan_video_prompts_of_different_lengths_in_one_batch_have_no_layout():
    tiny = Tiny("tiny-hunyuan-video")
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[0, 6:] = False
    mask[1, 5:] = False
    inputs = {**tiny.inputs, "encoder_attention_mask": mask,
              "encoder_hidden_states": tiny.inputs["encoder_hidden_states"].expand(2, -1, -1)}
    found = layouts_of_forward(tiny.model, (), inputs)
    assert found.layouts == () and "differ in length ([5, 6] tokens)" in found.reason


def test_ltx2_layouts_describe_the_video_self_attention_only():
    """LTX-2's audio stream could match the video's length: only its ``attn1`` modules get the video layout."""
    tiny = Tiny("tiny-ltx2")
    found = layouts_of_forward(tiny.model, (), tiny.inputs)
    assert found.modules == ("attn1",) and found.layouts[0].grid == (2, 4, 4)
    layout, why = found.for_call("transformer_blocks.0.attn1", 32)
    assert layout is not None and layout.visual().end == 32 and not why
    assert found.for_call("transformer_blocks.0.audio_attn1", 32) == (
        None, "the layouts describe the attn1 modules' sequences only")
    queries = _queries(tiny, {}, {"encoder_hidden_states": tiny.inputs["encoder_hidden_states"] + 1.0})
    video = [x for x in queries if x.shape[2] == 32]
    assert torch.equal(video[0], video[len(video) // 2])  # the text does not reach the video self-attention


def test_flux_kontext_reference_tokens_close_the_image_stream_and_stay_dense():
    """Flux Kontext appends a reference image's tokens after the latent's, with index 1 in the ids' first column:
    the layout calls them conditioning (dense), and they are the rows that move when only the reference does."""
    tiny = Tiny("tiny-flux")
    hs, ids = tiny.inputs["hidden_states"], tiny.inputs["img_ids"]
    ref_ids = ids.clone()
    ref_ids[:, 0] = 1
    inputs = {**tiny.inputs, "hidden_states": torch.cat([hs, torch.randn_like(hs)], 1),
              "img_ids": torch.cat([ids, ref_ids], 0)}
    layout = layouts_of_forward(tiny.model, (), inputs).layouts[0]
    assert [(s.kind, s.end - s.start) for s in layout.segments] == [("text", 8), ("image", 16), ("conditioning", 16)]
    assert layout.grid == (1, 4, 4) and "16 reference-image tokens kept dense" in layout.source
    q = _first_self_queries(tiny, **inputs)
    moved_ref = {**inputs, "hidden_states": inputs["hidden_states"].clone()}
    moved_ref["hidden_states"][:, 16:] += 1.0
    moved = (_first_self_queries(tiny, **moved_ref) - q).abs().amax(dim=(0, 1, 3)) > 1e-6
    assert q.shape[2] == layout.length
    assert torch.equal(moved, torch.tensor([k == "conditioning" for k in layout.token_kinds()]))
    scrambled = {**inputs, "img_ids": torch.cat([ref_ids, ids], 0)}  # reference first: not how Kontext packs
    found = layouts_of_forward(tiny.model, (), scrambled)
    assert found.layouts == () and "do not close the image stream" in found.reason


def test_mochi_attends_over_the_latent_then_the_valid_text_only():
    """Mochi's time embedding pools the text, so every row moves with it; the latent, though, reaches only the
    video rows of the first attention call, and the padded text reaches none."""
    tiny = Tiny("tiny-mochi")
    found = layouts_of_forward(tiny.model, (), tiny.inputs)
    layout = found.layouts[0]
    assert [(s.kind, s.end - s.start) for s in layout.segments] == [("video", 32), ("text", 6)]
    assert layout.grid == (2, 4, 4)
    q = _first_self_queries(tiny)
    assert q.shape[2] == layout.length
    moved = (_first_self_queries(tiny, hidden_states=tiny.inputs["hidden_states"] + 1.0) - q).abs().amax(
        dim=(0, 1, 3)) > 1e-6
    assert torch.equal(moved, torch.tensor([k == "video" for k in layout.token_kinds()]))
    padded = tiny.inputs["encoder_hidden_states"].clone()
    padded[:, 6:] += 1.0  # the tokens the mask drops
    assert torch.equal(_first_self_queries(tiny, encoder_hidden_states=padded), q)
    two = {**tiny.inputs, "hidden_states": tiny.inputs["hidden_states"].expand(2, -1, -1, -1, -1),
           "encoder_hidden_states": tiny.inputs["encoder_hidden_states"].expand(2, -1, -1),
           "encoder_attention_mask": torch.tensor([[True] * 6 + [False] * 2, [True] * 4 + [False] * 4])}
    assert [lay.length for lay in layouts_of_forward(tiny.model, (), two).layouts] == [36, 38]


def test_hunyuan_video15_puts_the_latent_first_then_valid_image_and_text_then_the_padding():
    tiny = Tiny("tiny-hunyuan-video15")  # text to video: the 5 image tokens are all padding
    found = layouts_of_forward(tiny.model, (), tiny.inputs)
    layout = found.layouts[0]
    assert found.padding_mask == "queries and keys"
    assert [(s.kind, s.end - s.start) for s in layout.segments] == [("video", 128), ("text", 9), ("padding", 8)]
    q = _first_self_queries(tiny, layout.length)
    kinds = layout.token_kinds()
    latent = (_first_self_queries(tiny, layout.length, hidden_states=tiny.inputs["hidden_states"] + 1.0)
              - q).abs().amax(dim=(0, 1, 3)) > 1e-6
    assert torch.equal(latent, torch.tensor([k == "video" for k in kinds]))
    prompt = (_first_self_queries(tiny, layout.length, encoder_hidden_states=tiny.inputs["encoder_hidden_states"] + 1.0)
              - q).abs().amax(dim=(0, 1, 3)) > 1e-6
    assert prompt.sum() == 6 and all(kinds[i] == "text" for i in torch.nonzero(prompt).flatten().tolist())
    given = {**tiny.inputs, "image_embeds": torch.randn_like(tiny.inputs["image_embeds"])}  # image to video
    assert [(s.kind, s.end - s.start) for s in layouts_of_forward(tiny.model, (), given).layouts[0].segments] == [
        ("video", 128), ("text", 14), ("padding", 3)]


@pytest.mark.parametrize("name", ["tiny-wan", "tiny-skyreels-v2", "tiny-cosmos", "tiny-hunyuan-video", "tiny-mochi",
                                  "tiny-cogvideox", "tiny-consisid", "tiny-chronoedit", "tiny-allegro",
                                  "tiny-easyanimate", "tiny-framepack", "tiny-kandinsky5", "tiny-helios",
                                  "tiny-motif-video", "tiny-kandinsky6"])
def test_the_first_latent_frame_is_the_first_row_of_the_grid(name):
    """The grid's order (frame, row, column): changing the latent's first frame moves exactly the video segment's
    first frame of tokens at the first attention call."""
    tiny = Tiny(name)
    layout = layouts_of_forward(tiny.model, (), tiny.inputs).layouts[0]
    video = layout.visual()
    per_frame = layout.grid[1] * layout.grid[2]
    hs = tiny.inputs["hidden_states"].clone()
    # CogVideoX's latent is [B, F, C, H, W], Kandinsky 5's [B, F, H, W, C]
    frame_dim = 1 if name in ("tiny-cogvideox", "tiny-consisid", "tiny-kandinsky5", "tiny-kandinsky6") else 2
    hs.select(frame_dim, 0).add_(1.0)
    q = _first_self_queries(tiny, layout.length)
    moved = (_first_self_queries(tiny, layout.length, hidden_states=hs) - q).abs().amax(dim=(0, 1, 3)) > 1e-6
    expected = torch.zeros(layout.length, dtype=torch.bool)
    expected[video.start: video.start + per_frame] = True
    assert torch.equal(moved, expected)


def _rows_moved_by(tiny: Tiny, length: int, **changed) -> torch.Tensor:
    """Bool [length]: the query rows of the first attention call over ``length`` tokens that ``changed`` moves."""
    q = _first_self_queries(tiny, length)
    return (_first_self_queries(tiny, length, **changed) - q).abs().amax(dim=(0, 1, 3)) > 1e-6


def test_wan_animate_keeps_the_reference_frame_dense_and_sparsifies_the_posed_frames():
    """The reference character's latent is the first frame: changing it moves exactly the conditioning rows, and
    the pose, which the host adds to the other frames, moves exactly the video rows."""
    tiny = Tiny("tiny-wan-animate")
    layout = layouts_of_forward(tiny.model, (), tiny.inputs).layouts[0]
    assert [(s.kind, s.end - s.start) for s in layout.segments] == [("conditioning", 16), ("video", 32)]
    assert layout.grid == (2, 4, 4)
    kinds = layout.token_kinds()
    reference = tiny.inputs["hidden_states"].clone()
    reference[:, :, 0] += 1.0
    assert torch.equal(_rows_moved_by(tiny, layout.length, hidden_states=reference),
                       torch.tensor([k == "conditioning" for k in kinds]))
    pose = tiny.inputs["pose_hidden_states"] + 1.0
    assert torch.equal(_rows_moved_by(tiny, layout.length, pose_hidden_states=pose),
                       torch.tensor([k == "video" for k in kinds]))


@pytest.mark.parametrize("name, history", [
    ("tiny-framepack", ("latents_clean", "latents_history_2x", "latents_history_4x")),
    ("tiny-helios", ("latents_history_short", "latents_history_mid", "latents_history_long"))])
def test_the_history_streams_are_the_conditioning_before_the_window(name, history):
    """Three history streams (2 clean frames of 4x4 tokens, 2 frames patched to 1x2x2, 4 frames to 1x1x1) come
    first: changing them moves exactly those 37 rows, and the latent window exactly the video rows."""
    tiny = Tiny(name)
    layout = layouts_of_forward(tiny.model, (), tiny.inputs).layouts[0]
    assert layout.segments[0].kind == "conditioning" and layout.segments[0].end == 37
    assert layout.segments[1].kind == "video" and layout.segments[1].end == 37 + 32 and layout.grid == (2, 4, 4)
    kinds = layout.token_kinds()
    assert torch.equal(_rows_moved_by(tiny, layout.length, **{k: tiny.inputs[k] + 1.0 for k in history}),
                       torch.tensor([i < 37 for i in range(layout.length)]))
    assert torch.equal(_rows_moved_by(tiny, layout.length, hidden_states=tiny.inputs["hidden_states"] + 1.0),
                       torch.tensor([k == "video" for k in kinds]))
    no_history = {**tiny.inputs, "indices_" + history[2]: None, history[2]: None}
    assert layouts_of_forward(tiny.model, (), no_history).layouts[0].segments[0].end == 37 - 1  # no 4x stream


def test_framepack_puts_the_image_and_the_valid_text_after_the_window():
    tiny = Tiny("tiny-framepack")
    found = layouts_of_forward(tiny.model, (), tiny.inputs)
    layout = found.layouts[0]
    # one prompt: the host cuts the 2 padding tokens off
    assert [(s.kind, s.end - s.start) for s in layout.segments] == [
        ("conditioning", 37), ("video", 32), ("conditioning", 3), ("text", 6)]
    assert found.padding_mask == "keys"
    assert torch.equal(_rows_moved_by(tiny, layout.length, image_embeds=tiny.inputs["image_embeds"] + 1.0),
                       torch.tensor([37 + 32 <= i < 37 + 32 + 3 for i in range(layout.length)]))


def test_framepack_with_two_prompts_masks_the_padding_that_follows_the_text():
    tiny = Tiny("tiny-framepack")
    two = twice(tiny.inputs)
    found = layouts_of_forward(tiny.model, (), two)
    assert [(s.kind, s.end - s.start) for s in found.layouts[0].segments][-2:] == [("text", 6), ("padding", 2)]
    q = _first_self_queries(tiny, found.layouts[0].length, **two)
    assert q.shape[0] == 2
    two["encoder_attention_mask"] = torch.tensor([[True] * 6 + [False] * 2, [True] * 5 + [False] * 3])
    assert "differ in length ([5, 6] tokens)" in layouts_of_forward(tiny.model, (), two).reason


def test_kandinsky5s_layout_describes_its_visual_blocks_only():
    """Kandinsky 5's text blocks attend over the text alone, which may have the video's length: they never take
    the video layout. Where the pipeline asks for its own sparse attention (NABLA), there is no layout."""
    tiny = Tiny("tiny-kandinsky5")
    found = layouts_of_forward(tiny.model, (), tiny.inputs)
    assert found.layouts[0].grid == (2, 4, 4) and found.layouts[0].visual().end == 32
    assert found.for_call("visual_transformer_blocks.1.self_attention", 32)[0] is not None
    layout, why = found.for_call("text_transformer_blocks.0.self_attention", 32)
    assert layout is None and "visual_transformer_blocks" in why
    long_text = {**tiny.inputs, "encoder_hidden_states": torch.randn(1, 32, 16), "text_rope_pos": torch.arange(32)}
    q = _first_self_queries(tiny, 32, **long_text)  # the text block's, over 32 text tokens
    assert not torch.equal(q, _first_self_queries(tiny, 32, **{**long_text, "encoder_hidden_states":
                                                                 long_text["encoder_hidden_states"] + 1.0}))
    nabla = layouts_of_forward(tiny.model, (), {**tiny.inputs, "sparse_params": {"to_fractal": True}})
    assert nabla.layouts == () and "its own sparse attention" in nabla.reason


def test_motif_video_puts_the_latent_first_then_the_image_then_text_and_padding():
    tiny = Tiny("tiny-motif-video")
    found = layouts_of_forward(tiny.model, (), tiny.inputs)
    layout = found.layouts[0]
    assert [(s.kind, s.end - s.start) for s in layout.segments] == [
        ("video", 32), ("conditioning", 3), ("text", 6), ("padding", 2)]
    assert found.padding_mask == "keys" and layout.keys_end == 41
    kinds = layout.token_kinds()
    image = tiny.inputs["image_embeds"] + torch.randn_like(tiny.inputs["image_embeds"])  # (a shift is normed away)
    assert torch.equal(_rows_moved_by(tiny, layout.length, image_embeds=image),
                       torch.tensor([k == "conditioning" for k in kinds]))
    assert torch.equal(_rows_moved_by(tiny, layout.length, hidden_states=tiny.inputs["hidden_states"] + 1.0),
                       torch.tensor([k == "video" for k in kinds]))
    text_only = {k: v for k, v in tiny.inputs.items() if k != "image_embeds"}  # text to video: no image tokens
    assert [s.kind for s in layouts_of_forward(tiny.model, (), text_only).layouts[0].segments] == [
        "video", "text", "padding"]


def test_kandinsky6_keeps_its_tail_reference_frame_dense_and_its_audio_out():
    """Image to video appends the reference image as a last frame of token type 1: changing it moves exactly the
    conditioning rows of the video self-attention; the audio stream's modules never take the layout."""
    tiny = Tiny("tiny-kandinsky6")
    found = layouts_of_forward(tiny.model, (), tiny.inputs)
    layout = found.layouts[0]
    assert [(s.kind, s.end - s.start) for s in layout.segments] == [("video", 32), ("conditioning", 16)]
    assert layout.grid == (2, 4, 4)
    assert found.for_call("visual_transformer_blocks.0.audio_dec_block.self_attention", 48)[0] is None
    reference = tiny.inputs["hidden_states"].clone()
    reference[:, -1] += torch.randn_like(reference[:, -1])
    assert torch.equal(_rows_moved_by(tiny, layout.length, hidden_states=reference),
                       torch.tensor([k == "conditioning" for k in layout.token_kinds()]))
    types = tiny.inputs["visual_token_type_ids"]
    first = {**tiny.inputs, "visual_token_type_ids": types.flip(1)}  # the reference first: not how it packs
    assert "not all last" in layouts_of_forward(tiny.model, (), first).reason
    text_to_video = {k: v for k, v in tiny.inputs.items() if k != "visual_token_type_ids"}
    assert layouts_of_forward(tiny.model, (), text_to_video).layouts[0].grid == (3, 4, 4)


def test_wan22_ti2v_keeps_the_frame_it_starts_from_dense():
    """Wan 2.2's TI2V passes one timestep per token, 0 on the first frame (the image it starts from): that frame is
    conditioning. Zeros that are not whole leading frames leave the layout as it was."""
    tiny = Tiny("tiny-wan")  # 2 x 4 x 4 tokens
    per_token = torch.full((1, 32), 500.0)
    per_token[:, :16] = 0.0
    layout = layouts_of_forward(tiny.model, (), {**tiny.inputs, "timestep": per_token}).layouts[0]
    assert [(s.kind, s.end - s.start) for s in layout.segments] == [("conditioning", 16), ("video", 16)]
    assert layout.grid == (1, 4, 4) and "timestep 0" in layout.source
    assert _first_self_queries(tiny, timestep=per_token).shape[2] == layout.length  # the model takes it so
    text_to_video = torch.full((1, 32), 500.0)
    partial = per_token.clone()
    partial[:, 8:16] = 500.0
    for timestep in (text_to_video, partial):
        found = layouts_of_forward(tiny.model, (), {**tiny.inputs, "timestep": timestep})
        assert [s.kind for s in found.layouts[0].segments] == ["video"]


def test_ltx_image_to_video_keeps_the_image_frame_dense():
    """LTX-Video's image-to-video pipeline passes t * (1 - conditioning mask) per token: 0 on the first frame."""
    tiny = Tiny("tiny-ltx")  # 2 x 4 x 4 tokens
    per_token = torch.full((1, 32), 500.0)
    per_token[:, :16] = 0.0
    layout = layouts_of_forward(tiny.model, (), {**tiny.inputs, "timestep": per_token}).layouts[0]
    assert [(s.kind, s.end - s.start) for s in layout.segments] == [("conditioning", 16), ("video", 16)]
    first = tiny.inputs["hidden_states"].clone()
    first[:, :16] += 1.0
    moved = (_first_self_queries(tiny, timestep=per_token, hidden_states=first)
             - _first_self_queries(tiny, timestep=per_token)).abs().amax(dim=(0, 1, 3)) > 1e-6
    assert torch.equal(moved, torch.tensor([k == "conditioning" for k in layout.token_kinds()]))


def _ltx_condition_call(tiny: Tiny, with_image: bool) -> dict:
    """What LTXConditionPipeline passes the tiny LTX-Video model: a one-frame condition at frame 8 prepended to the
    2 x 4 x 4 grid, every token's coordinates (its own static methods), and (``with_image``) an image blended into
    the first frame, whose tokens then get timestep 0 as the condition's do."""
    from diffusers import LTXConditionPipeline as pipeline

    main = pipeline._scale_video_ids(pipeline._prepare_video_ids(1, 2, 4, 4), 32, 8, 0)
    cond = pipeline._scale_video_ids(pipeline._prepare_video_ids(1, 1, 4, 4), 32, 8, 8)
    coords = torch.cat([cond, main], 2).float()
    coords[:, 0] /= 25.0  # the frame rate
    timestep = torch.full((1, 48), 500.0)
    timestep[:, :16 + (16 if with_image else 0)] = 0.0
    return dict(tiny.inputs, hidden_states=torch.cat([torch.randn(1, 16, 8), tiny.inputs["hidden_states"]], 1),
                video_coords=coords, timestep=timestep, num_frames=None, height=None, width=None)


def test_ltx_condition_pipeline_calls_keep_their_condition_tokens_dense():
    tiny = Tiny("tiny-ltx")
    call, image_call = _ltx_condition_call(tiny, with_image=False), _ltx_condition_call(tiny, with_image=True)
    layout = layouts_of_forward(tiny.model, (), call).layouts[0]
    assert [(s.kind, s.end - s.start) for s in layout.segments] == [("conditioning", 16), ("video", 32)]
    assert layout.grid == (2, 4, 4)
    kinds = layout.token_kinds()
    moved_condition = call["hidden_states"].clone()
    moved_condition[:, :16] += 1.0
    tiny.inputs = call
    assert torch.equal(_rows_moved_by(tiny, 48, hidden_states=moved_condition),
                       torch.tensor([k == "conditioning" for k in kinds]))
    moved_frame = call["hidden_states"].clone()
    moved_frame[:, 16:32] += 1.0  # the grid's first frame
    assert torch.equal(_rows_moved_by(tiny, 48, hidden_states=moved_frame),
                       torch.tensor([16 <= i < 32 for i in range(48)]))
    with_image = layouts_of_forward(tiny.model, (), image_call).layouts[0]
    assert [(s.kind, s.end - s.start) for s in with_image.segments] == [("conditioning", 32), ("video", 16)]
    assert with_image.grid == (1, 4, 4)
    scrambled = {**call, "video_coords": call["video_coords"].flip(2)}
    assert "whole grid" in layouts_of_forward(tiny.model, (), scrambled).reason


def test_hunyuan_video_image_to_video_by_token_replacement_keeps_the_image_frame_dense():
    """With ``image_condition_type="token_replace"`` the first latent frame is modulated at timestep 0: the
    timestep moves every row of the first joint attention but that frame's."""
    base = get_preset("tiny-hunyuan-video")
    preset = dataclasses.replace(base, config=dict(base.config, image_condition_type="token_replace"))
    tiny = Tiny(preset)
    layout = layouts_of_forward(tiny.model, (), tiny.inputs).layouts[0]
    assert [(s.kind, s.end - s.start) for s in layout.segments] == [
        ("conditioning", 16), ("video", 16), ("text", 6), ("padding", 2)]
    assert layout.grid == (1, 4, 4)
    moved = _rows_moved_by(tiny, layout.length, timestep=tiny.inputs["timestep"] + 100)
    assert torch.equal(moved, torch.tensor([i >= 16 for i in range(layout.length)]))
