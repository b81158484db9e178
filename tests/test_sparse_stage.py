"""The sparse stage inside a plan: gating, the schedule, reasons, and the gate measuring sparse forms."""

import dataclasses

import pytest
import torch

import ditgate
from ditgate.gate.verdict import LESS_ACCURATE, SLOWER, UNSUPPORTED
from ditgate.models.presets import get_preset
from ditgate.hosts import model_output

from .helpers import routes_of

pytest.importorskip("torch.nn.attention.flex_attention")


def _wan(frames=4, size=16):
    base = get_preset("tiny-wan")
    preset = dataclasses.replace(base, geometry=dict(base.geometry, frames=frames, height=size, width=size))
    model = preset.build()
    return model, preset.inputs(model)  # 4 x 8 x 8 = 256 video tokens


def _forward(model, inputs, t):
    with torch.no_grad():
        return model_output(model(**{**inputs, "timestep": torch.tensor([t])})).clone()


def _setting(**schedule):
    return ditgate.SparseSetting(ditgate.BudgetSchedule(**{"budget": 0.3, "dense_steps": 0, "dense_layers": 0,
                                                          **schedule}), block=16, forms=("flex_sparse",))


def test_sparse_needs_a_profile_that_allows_bounded_forms():
    model, _ = _wan()
    with pytest.raises(ValueError, match="bounded"):
        ditgate.attach(model, profile="quality", sparse=_setting())
    with pytest.raises(TypeError, match="SparseSetting"):
        ditgate.attach(model, profile="speed", sparse={"budget": 0.3})


def test_the_schedule_keeps_the_first_steps_and_layers_dense_and_says_why():
    model, inputs = _wan()
    ref0, ref1 = _forward(model, inputs, 900), _forward(model, inputs, 800)
    plan = ditgate.attach(model, forms=["flex_sparse"], measure=False, sparse=_setting(dense_steps=1, dense_layers=1))
    out0 = _forward(model, inputs, 900)  # step 0: dense by the schedule
    out1 = _forward(model, inputs, 800)  # step 1: layer 1 sparse, layer 0 dense
    routes = routes_of(plan)
    plan.detach()
    assert torch.equal(out0, ref0)
    assert routes["blocks.0.attn1"] == {("host", "sparse: layer 0 runs dense (schedule: first 1)"): 2}
    assert routes["blocks.1.attn1"] == {("host", "sparse: dense at step 0 (schedule)"): 1, ("flex_sparse", ""): 1}
    assert ("host", "sparse: cross-attention stays dense") in routes["blocks.1.attn2"]
    cos = torch.nn.functional.cosine_similarity(out1.flatten(), ref1.flatten(), 0)
    assert not torch.equal(out1, ref1) and cos > 0.9  # the selection changed the result, boundedly


def test_an_unverified_family_stays_dense_with_the_reason():
    tiny = get_preset("tiny-pixart")
    model = tiny.build()
    plan = ditgate.attach(model, forms=["flex_sparse"], measure=False, sparse=_setting())
    with torch.no_grad():
        model(**tiny.inputs(model))
    reasons = {r for s in routes_of(plan).values() for (_, r) in s}
    plan.detach()
    assert any("no verified token layout for PixArtTransformer2DModel" in r for r in reasons)


def test_cogvideox_joint_attention_goes_sparse_with_its_text_kept_whole():
    """CogVideoX calls F.scaled_dot_product_attention on text then video; the stage selects over the video
    tiles only, so the text rows' outputs are exactly dense attention's."""
    base = get_preset("tiny-cogvideox")
    preset = dataclasses.replace(base, geometry=dict(base.geometry, frames=4, height=16, width=16))
    model = preset.build()
    inputs = preset.inputs(model)  # 8 text tokens (the configuration's), then 4 x 8 x 8 = 256 video tokens
    ref = _forward(model, inputs, 500)
    seen = []
    plan = ditgate.attach(model, forms=["flex_sparse"], measure=False, sparse=_setting())
    handle = model.transformer_blocks[0].attn1.register_forward_hook(lambda m, a, kw, out: seen.append(out),
                                                                      with_kwargs=True)
    out = _forward(model, inputs, 500)
    routes = routes_of(plan)
    handle.remove()
    plan.detach()
    dense = []
    handle = model.transformer_blocks[0].attn1.register_forward_hook(lambda m, a, kw, out: dense.append(out),
                                                                      with_kwargs=True)
    _forward(model, inputs, 500)
    handle.remove()
    assert routes["transformer_blocks.0.attn1"] == {("flex_sparse", ""): 1}
    video, text = seen[0]  # the processor returns the video rows, then the text rows
    assert torch.allclose(text, dense[0][1], atol=1e-5)  # text rows attend to every token
    assert not torch.allclose(video, dense[0][0], atol=1e-3)  # video rows saw only their selected tiles
    cos = torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), 0)
    assert not torch.equal(out, ref) and cos > 0.9


def test_the_gate_measures_sparse_forms_only_where_a_setting_asks():
    model, inputs = _wan()
    plan = ditgate.attach(model, profile="balanced", forms=["sdpa_math", "flex_sparse"])
    _forward(model, inputs, 900)
    refusals = {(v.site, r.form): r for v in plan.chooser.verdicts.values() for r in v.refusals}
    plan.detach()
    assert refusals[("blocks.1.attn1", "flex_sparse")].kind == UNSUPPORTED
    assert "no sparse setting" in refusals[("blocks.1.attn1", "flex_sparse")].detail

    plan = ditgate.attach(model, profile="balanced", sparse=_setting())  # the setting names flex_sparse only
    candidates = plan.chooser.candidates()
    plan.detach()
    assert "flex_sparse" in candidates and "fp8_sparse" not in candidates


def test_the_gate_times_a_sparse_form_with_its_selection_at_self_sites():
    model, inputs = _wan()
    # random weights attend almost uniformly, so 30 % of the tiles keep about 95 % of the output: a floor
    # of 0.9 lets the form through to its timing; balanced's 0.999 refuses it (next assertion)
    loose = dataclasses.replace(ditgate.PROFILES["balanced"], forms=("flex_sparse",), rounds=2, whole_rounds=1,
                                min_call_cosine=0.9, min_output_cosine=0.9)
    strict = dataclasses.replace(loose, min_call_cosine=0.999)
    plan = ditgate.attach(model, profile=strict, sparse=_setting())
    _forward(model, inputs, 900)
    refused = {r.form: r.kind for v in plan.chooser.verdicts.values() if v.site == "blocks.1.attn1" for r in v.refusals}
    plan.detach()
    assert refused["flex_sparse"] == LESS_ACCURATE
    plan = ditgate.attach(model, profile=loose, sparse=_setting())
    _forward(model, inputs, 900)
    by_site = {v.site: v for v in plan.chooser.verdicts.values()}
    plan.detach()
    self_site, cross_site = by_site["blocks.0.attn1"], by_site["blocks.1.attn2"]
    assert [m.form for m in self_site.measured] == ["flex_sparse"]
    assert 0.9 < self_site.measured[0].cosine < 1.0  # measured against the host's dense output
    # the next self site of the same shape reads that timing (selection included) instead of timing it again
    assert [m.timed_at for m in by_site["blocks.1.attn1"].measured] == ["blocks.0.attn1"]
    cross = {r.form: r for r in cross_site.refusals}
    assert cross["flex_sparse"].kind == UNSUPPORTED and "cross-attention" in cross["flex_sparse"].detail


def test_without_a_setting_sparse_forms_are_not_candidates():
    model, inputs = _wan(frames=2, size=8)
    plan = ditgate.attach(model, profile="speed")
    candidates = plan.chooser.candidates()
    plan.detach()
    assert "fp8" in candidates and not set(candidates) & set(ditgate.SparseSetting().forms)


def test_the_whole_model_check_judges_sparse_routes_as_they_run_on_sparse_steps():
    model, inputs = _wan()
    loose = dataclasses.replace(ditgate.PROFILES["balanced"], forms=("flex_sparse",), rounds=1, whole_rounds=1,
                                min_call_cosine=0.9, min_output_cosine=0.9, min_speedup=1e-3,
                                min_whole_ratio=1e-3)
    # the first forward is step 0, dense by this schedule; the check must still see the sparse selections
    plan = ditgate.attach(model, profile=loose, sparse=_setting(dense_steps=2))
    _forward(model, inputs, 900)
    checks = list(plan._whole)
    routed = [v for v in plan.chooser.verdicts.values() if v.form == "flex_sparse"]
    plan.detach()
    assert routed and len(checks) == 1
    assert checks[0].cosine < 0.99999  # a check on dense steps would have compared the host with itself


def test_a_consumer_that_asks_for_taller_query_tiles_gets_them():
    """A block-sparse form's ``selection_rows`` sets the selection's query tile (as the Hopper schedule's
    three warpgroups ask for 192 over 128): here 48 query rows over the setting's 16-row key tiles."""
    from ditgate.forms.quant import BlockSparseAttention

    class Tall(BlockSparseAttention):
        spec = dataclasses.replace(BlockSparseAttention.spec, name="tall_sparse")
        seen: list = []

        def selection_rows(self, call, block):
            return 3 * block

        def run(self, inputs):
            self.seen.append(inputs.attn_mask)
            return super().run(inputs)

    tall = Tall()
    if not tall.availability().available:
        pytest.skip(tall.availability().reason)
    base = get_preset("tiny-wan")  # head dim 64 and 16-bit weights: what the kernel takes
    preset = dataclasses.replace(base, config=dict(base.config, num_attention_heads=1, attention_head_dim=64),
                                 geometry=dict(base.geometry, frames=4, height=16, width=16))
    model = preset.build().to(torch.float16)
    inputs = {n: x.to(torch.float16) if torch.is_tensor(x) and x.is_floating_point() else x
              for n, x in preset.inputs(model).items()}
    ref = _forward(model, inputs, 800)
    plan = ditgate.attach(model, forms=["tall_sparse"], measure=False, extra_forms=[tall], sparse=_setting())
    out = _forward(model, inputs, 800)
    plan.detach()
    assert tall.seen and all((s.block_m, s.block_n) == (48, 16) for s in tall.seen)
    assert tall.seen[0].kv_count.shape[-1] == -(-256 // 48)
    cos = torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), 0)
    assert not torch.equal(out, ref) and cos > 0.9


def _hunyuan(frames=4, size=16):
    base = get_preset("tiny-hunyuan-video")
    preset = dataclasses.replace(base, geometry=dict(base.geometry, frames=frames, height=size, width=size))
    model = preset.build()
    return model, preset.inputs(model)  # 4 x 8 x 8 = 256 video tokens, 6 text, 2 padding


def test_hunyuan_video_masked_calls_go_sparse_over_the_keys_before_the_padding():
    """HunyuanVideo hides its text padding with a boolean key mask; the stage serves those calls over the keys
    before the padding with the selection as the only mask, and they match the host's masked attention where the
    selection keeps everything (text rows) while video rows see only their tiles."""
    model, inputs = _hunyuan()
    ref = _forward(model, inputs, 500)
    plan = ditgate.attach(model, forms=["flex_sparse"], measure=False, sparse=_setting())
    seen = {}
    block = model.transformer_blocks[0].attn
    handle = block.register_forward_hook(lambda m, a, kw, out: seen.setdefault("sparse", out), with_kwargs=True)
    out = _forward(model, inputs, 500)
    routes = routes_of(plan)
    handle.remove()
    plan.detach()
    handle = block.register_forward_hook(lambda m, a, kw, out: seen.setdefault("dense", out), with_kwargs=True)
    _forward(model, inputs, 500)
    handle.remove()
    assert routes["transformer_blocks.0.attn"] == {("flex_sparse", ""): 1}
    assert routes["single_transformer_blocks.0.attn"] == {("flex_sparse", ""): 1}
    assert routes["context_embedder.token_refiner.refiner_blocks.0.attn"] == {
        ("host", "sparse: a masked call stays dense (no layout covers a 8-token sequence)"): 1}
    (video, text), (dense_video, dense_text) = seen["sparse"], seen["dense"]
    assert torch.allclose(text, dense_text, atol=1e-5)  # text and padding rows attend every valid key
    assert not torch.allclose(video, dense_video, atol=1e-3)
    cos = torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), 0)
    assert not torch.equal(out, ref) and cos > 0.9


def test_a_mask_that_hides_other_keys_than_the_padding_is_kept():
    model, inputs = _hunyuan()
    plan = ditgate.attach(model, forms=["flex_sparse"], measure=False, sparse=_setting())
    _forward(model, inputs, 500)  # the plan reads this forward's layout
    padding = plan.context.padding
    site, path = "transformer_blocks.0.attn", "transformer_blocks.0.attn"
    q = torch.zeros(1, 2, 264, 16)
    good = (torch.arange(264) < 262).view(1, 1, 1, 264)
    found, why = padding.cut(site, path, q, good)
    assert (found.keys, found.zero_rows, why) == (262, False, "")
    wrong = good.expand(2, 1, 1, 264).clone()  # a shape not checked yet: the first of each is compared
    wrong[1, ..., 5] = False
    other_shape = torch.zeros(1, 2, 264, 264, dtype=torch.bool)
    keys, why = padding.cut(site, path, q, wrong)
    keys_shape, why_shape = padding.cut(site, path, q, other_shape)
    plan.detach()
    assert keys is None and "hides other keys than the layout's padding" in why
    assert keys_shape is None and "is not a boolean mask [B, 1, 1, 264]" in why_shape


def test_masks_of_families_without_a_padding_layout_are_kept():
    model, inputs = _wan()
    plan = ditgate.attach(model, forms=["flex_sparse"], measure=False, sparse=_setting())
    _forward(model, inputs, 500)
    keys, why = plan.context.padding.cut("blocks.0.attn1", "blocks.0.attn1", torch.zeros(1, 2, 256, 16),
                                         torch.ones(1, 1, 1, 256, dtype=torch.bool))
    plan.detach()
    assert keys is None and "no verified layout says what the mask hides" in why


def test_the_gate_measures_sparse_forms_on_hunyuan_videos_masked_calls():
    model, inputs = _hunyuan()
    plan = ditgate.attach(model, profile="speed", forms=["sdpa_math", "flex_sparse"], sparse=_setting())
    _forward(model, inputs, 500)
    verdict = next(v for v in plan.chooser.verdicts.values() if v.site == "transformer_blocks.0.attn")
    plan.detach()
    refused = {r.form: r for r in verdict.refusals}
    assert "mask=boolean" in verdict.shape_key
    # timed or judged on its output (random weights: the cosine floor may refuse it), never "not supported"
    assert "flex_sparse" not in refused or refused["flex_sparse"].kind in (LESS_ACCURATE, SLOWER)


def test_ltx2_video_self_attention_goes_sparse_and_the_audio_stream_stays_dense():
    preset = get_preset("tiny-ltx2")
    model = preset.build()
    inputs = preset.inputs(model)
    plan = ditgate.attach(model, forms=["flex_sparse"], measure=False, sparse=_setting())
    with torch.no_grad():
        model(**inputs)
    routes = routes_of(plan)
    plan.detach()
    assert routes["transformer_blocks.0.attn1"] == {("flex_sparse", ""): 1}
    assert routes["transformer_blocks.0.audio_attn1"] == {
        ("host", "sparse: the layouts describe the attn1 modules' sequences only"): 1}
    assert routes["transformer_blocks.0.audio_to_video_attn"] == {("host", "sparse: cross-attention stays dense"): 1}


def test_explain_says_what_layout_the_stage_read():
    model, inputs = _hunyuan()
    plan = ditgate.attach(model, forms=["flex_sparse"], measure=False, sparse=_setting())
    before = plan.report().sparse
    _forward(model, inputs, 500)
    text, report = plan.explain(), plan.report()
    plan.detach()
    assert before.layouts == (("", "no forward seen yet"),)
    assert report.sparse.setting.startswith("selected, budget 0.3")
    assert "[video 256 | text 6 | padding 2, grid 4x8x8]" in text
    assert report.to_dict()["sparse"]["layouts"][0][1].startswith("HunyuanVideo: latent 4x16x16")


def test_mochi_joint_attention_goes_sparse():
    """Mochi's attention module has no ``set_processor`` (ditgate sets the attribute) and calls
    F.scaled_dot_product_attention per batch item over the latent and that prompt's valid text."""
    base = get_preset("tiny-mochi")
    preset = dataclasses.replace(base, geometry=dict(base.geometry, frames=4, height=16, width=16))
    model = preset.build()
    inputs = preset.inputs(model)  # 4 x 8 x 8 = 256 video tokens, then 6 valid text tokens
    ref = _forward(model, inputs, 500)
    plan = ditgate.attach(model, forms=["flex_sparse"], measure=False, sparse=_setting())
    out = _forward(model, inputs, 500)
    routes = routes_of(plan)
    plan.detach()
    assert torch.equal(_forward(model, inputs, 500), ref)  # detached: the model as it was
    assert routes["transformer_blocks.0.attn1"] == {("flex_sparse", ""): 1}
    cos = torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), 0)
    assert not torch.equal(out, ref) and cos > 0.9


@pytest.mark.parametrize("name, site, frames", [
    ("tiny-chronoedit", "blocks.0.attn1", 4), ("tiny-wan-animate", "blocks.0.attn1", 5),
    ("tiny-allegro", "transformer_blocks.0.attn1", 4), ("tiny-consisid", "transformer_blocks.0.attn1", 4),
    ("tiny-easyanimate", "transformer_blocks.0.attn1", 4), ("tiny-framepack", "transformer_blocks.0.attn", 4),
    ("tiny-kandinsky5", "visual_transformer_blocks.0.self_attention", 4), ("tiny-helios", "blocks.0.attn1", 4),
    ("tiny-motif-video", "transformer_blocks.0.attn", 4),
    ("tiny-kandinsky6", "visual_transformer_blocks.0.video_dec_block.self_attention", 4)])
def test_newly_verified_families_go_sparse_and_detach_as_they_were(name, site, frames):
    base = get_preset(name)
    preset = dataclasses.replace(base, geometry=dict(base.geometry, frames=frames, height=16, width=16))
    model = preset.build()
    inputs = preset.inputs(model)  # 4 (Wan Animate: 1 + 4) x 8 x 8 latent tokens
    ref = _forward(model, inputs, 500)
    plan = ditgate.attach(model, forms=["flex_sparse"], measure=False, sparse=_setting())
    out = _forward(model, inputs, 500)
    routes = routes_of(plan)
    plan.detach()
    assert routes[site] == {("flex_sparse", ""): 1}
    assert torch.equal(_forward(model, inputs, 500), ref)
    cos = torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), 0)
    assert not torch.equal(out, ref) and cos > 0.9


def test_wan_animates_reference_frame_attends_densely():
    """The reference frame's rows are conditioning: under the sparse stage they see every key, as dense attention."""
    base = get_preset("tiny-wan-animate")
    preset = dataclasses.replace(base, geometry=dict(base.geometry, frames=5, height=16, width=16))
    model = preset.build()
    inputs = preset.inputs(model)  # 64 reference tokens, then 4 x 8 x 8 video tokens
    outs = []
    handle = model.blocks[0].attn1.register_forward_hook(lambda m, a, kw, out: outs.append(out), with_kwargs=True)
    _forward(model, inputs, 500)
    plan = ditgate.attach(model, forms=["flex_sparse"], measure=False, sparse=_setting())
    _forward(model, inputs, 500)
    plan.detach()
    handle.remove()
    dense, sparse = outs
    assert torch.allclose(sparse[:, :64], dense[:, :64], atol=1e-5)
    assert not torch.allclose(sparse[:, 64:], dense[:, 64:], atol=1e-3)


def test_a_pipelines_denoisers_share_one_step_count():
    """Wan 2.2 hands a generation's later steps to its low-noise expert: those are not its "first steps"."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    (high, inputs), (low, _) = _wan(), _wan()
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=FlowMatchEulerDiscreteScheduler(),
                       transformer=high, transformer_2=low)
    plan = ditgate.attach(pipe, forms=["flex_sparse"], measure=False, sparse=_setting(dense_steps=2))
    for model, t in ((high, 900), (high, 900), (high, 800), (low, 600), (low, 600), (low, 400), (high, 950)):
        _forward(model, inputs, t)  # two forwards per step (guidance); 950: the next generation
    routes = routes_of(plan)
    assert plan.sparse.counter.step == 0 and plan.sparse.counter.generation == 1
    plan.detach()
    assert routes["transformer.blocks.1.attn1"] == {("host", "sparse: dense at step 0 (schedule)"): 3,
                                                    ("host", "sparse: dense at step 1 (schedule)"): 1}
    assert routes["transformer_2.blocks.1.attn1"] == {("flex_sparse", ""): 3}  # steps 2 and 3


def test_the_first_layers_are_the_first_blocks_over_laid_out_sequences():
    """HunyuanVideo's token refiner attends over its text alone before the joint blocks: it is not "layer 0"."""
    base = get_preset("tiny-hunyuan-video")
    preset = dataclasses.replace(base, geometry=dict(base.geometry, frames=4, height=16, width=16))
    model = preset.build()
    inputs = preset.inputs(model)
    plan = ditgate.attach(model, forms=["flex_sparse"], measure=False, sparse=_setting(dense_layers=1))
    _forward(model, inputs, 500)
    routes = routes_of(plan)
    plan.detach()
    assert routes["transformer_blocks.0.attn"] == {("host", "sparse: layer 0 runs dense (schedule: first 1)"): 1}
    assert routes["single_transformer_blocks.0.attn"] == {("flex_sparse", ""): 1}


def _wan_pipeline():
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=FlowMatchEulerDiscreteScheduler(),
                       transformer=get_preset("tiny-wan").build())

    def generate():
        gen = torch.Generator().manual_seed(0)
        prompt, negative = torch.randn(1, 8, 16, generator=gen), torch.randn(1, 8, 16, generator=gen)
        return pipe(prompt_embeds=prompt, negative_prompt_embeds=negative, height=128, width=128, num_frames=5,
                    num_inference_steps=4, guidance_scale=5.0, output_type="latent", generator=gen).frames

    return pipe, generate


def _hunyuan_video_pipeline():
    from diffusers import FlowMatchEulerDiscreteScheduler, HunyuanVideoPipeline

    pipe = HunyuanVideoPipeline(text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None, vae=None,
                                scheduler=FlowMatchEulerDiscreteScheduler(),
                                transformer=get_preset("tiny-hunyuan-video").build())

    def generate():
        gen = torch.Generator().manual_seed(0)
        prompt, pooled = torch.randn(1, 8, 16, generator=gen), torch.randn(1, 8, generator=gen)
        padded = torch.tensor([[1] * 6 + [0] * 2])
        return pipe(prompt_embeds=prompt, pooled_prompt_embeds=pooled, prompt_attention_mask=padded, height=128,
                    width=128, num_frames=5, num_inference_steps=4, output_type="latent", generator=gen).frames

    return pipe, generate


@pytest.mark.parametrize("make, site, per_step", [
    (_wan_pipeline, "transformer.blocks.1.attn1", 2),  # guidance: two forwards per step
    (_hunyuan_video_pipeline, "transformer.transformer_blocks.0.attn", 1)])  # its text padding under a mask
def test_unmodified_pipelines_run_their_steps_through_the_schedule(make, site, per_step):
    """The pipelines' own loops (no text encoder or VAE: prompt embeddings given, latents out, 2 x 8 x 8 = 128 video
    tokens): the first step of each call runs dense, the others sparse, and detach gives the pipeline's bits back."""
    pipe, generate = make()
    ref = generate()
    plan = ditgate.attach(pipe, forms=["flex_sparse"], measure=False, sparse=_setting(dense_steps=1))
    out = generate()
    generate()  # a second generation: its first step is dense again
    routes = routes_of(plan)
    plan.detach()
    assert routes[site] == {("host", "sparse: dense at step 0 (schedule)"): 2 * per_step,
                            ("flex_sparse", ""): 6 * per_step}
    assert plan.sparse.counter.generation == 1
    assert not torch.equal(out, ref) and torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), 0) > 0.9
    assert torch.equal(generate(), ref)


def test_a_layout_reader_that_fails_leaves_the_forward_dense_and_says_why(monkeypatch):
    """The readers run in the host's forward (a pre-hook): an argument they did not expect must not fail it."""
    from ditgate.sparse import families

    def broken(model, args, kwargs):
        raise KeyError("an argument no reader expected")

    monkeypatch.setitem(families.FAMILIES, "WanTransformer3DModel", broken)
    model, inputs = _wan()
    ref = _forward(model, inputs, 500)
    plan = ditgate.attach(model, forms=["flex_sparse"], measure=False, sparse=_setting())
    out = _forward(model, inputs, 500)
    routes = routes_of(plan)
    plan.detach()
    assert torch.equal(out, ref)
    ((route, reason),) = routes["blocks.0.attn1"]
    assert route == "host" and "no layout could be read" in reason and "KeyError" in reason


def test_a_selection_that_raises_hands_the_call_to_the_host(monkeypatch):
    """The selection runs before the form (and runs the form's pooling): it must not fail the host's forward."""
    from ditgate.sparse.selector import TileSelector

    def broken(self, *args, **kwargs):
        raise RuntimeError("the selection broke")

    model, inputs = _wan()
    ref = _forward(model, inputs, 500)
    plan = ditgate.attach(model, forms=["flex_sparse"], measure=False, sparse=_setting())
    monkeypatch.setattr(TileSelector, "select", broken)
    out = _forward(model, inputs, 500)
    routes = routes_of(plan)
    plan.detach()
    assert torch.equal(out, ref)
    assert routes["blocks.0.attn1"] == {("host", "flex_sparse raised"): 1}
