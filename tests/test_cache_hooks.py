"""diffusers' cache hooks on an attached model: the whole-model check's forwards do not move their state, so the
generation that calibrates is diffusers' own."""

import dataclasses

import pytest
import torch

import ditgate

from .helpers import LENIENT_SPEED, Tiny


def _pipeline():
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    preset = dataclasses.replace(Tiny("tiny-wan").preset, config=dict(Tiny("tiny-wan").preset.config, num_layers=3))
    tiny = Tiny(preset)
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=FlowMatchEulerDiscreteScheduler(),
                       transformer=tiny.model)

    def generate():
        gen = torch.Generator().manual_seed(0)
        prompt, negative = torch.randn(1, 8, 16, generator=gen), torch.randn(1, 8, 16, generator=gen)
        return pipe(prompt_embeds=prompt, negative_prompt_embeds=negative, height=16, width=16, num_frames=5,
                    num_inference_steps=4, guidance_scale=5.0, output_type="latent", generator=gen).frames

    return pipe, tiny.model, generate


def _cache(pipe, name: str):
    import diffusers

    if name == "pyramid attention broadcast":
        return diffusers.PyramidAttentionBroadcastConfig(
            spatial_attention_block_skip_range=2, spatial_attention_timestep_skip_range=(-1, 1001),
            current_timestep_callback=lambda: pipe.current_timestep)
    if name == "first block cache":
        return diffusers.FirstBlockCacheConfig(threshold=0.3)
    return diffusers.TaylorSeerCacheConfig(cache_interval=3, disable_cache_before_step=1,
                                           taylor_factors_dtype=torch.float32,
                                           cache_identifiers=[r"blocks\.\d+\.attn\d"])


CACHES = ["pyramid attention broadcast", "first block cache", "taylorseer"]


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("remembered", [False, True], ids=["checked", "check remembered"])
def test_a_cache_hook_sees_the_calibrating_generation_as_diffusers_runs_it(tmp_path, remembered, cache):
    """The check's forwards step over the cache hooks: counted by them (Pyramid Attention Broadcast, TaylorSeer), the
    calibrating generation differed from stock's with the same cache by 0.04-0.2, depending on how many forwards the
    check ran (one where it was remembered from an earlier process)."""
    pipe, model, generate = _pipeline()
    model.enable_cache(_cache(pipe, cache))
    stock = generate()
    timings = tmp_path / "timings.json"
    for _ in range(2 if remembered else 1):  # the first attach remembers the check, the second replays it
        plan = ditgate.attach(pipe, profile=LENIENT_SPEED, forms=["sdpa_math"], timing_cache=timings, progress=False)
        calibrating, after = generate(), generate()
        checks = plan.report().whole_model
        plan.detach()
    assert checks and checks[0].forwards == (1 if remembered else 2)
    assert torch.allclose(calibrating, stock, atol=1e-5) and torch.allclose(after, stock, atol=1e-5)


@pytest.mark.parametrize("cache", CACHES)
def test_calibrating_with_a_function_works_with_a_cache_on(cache):
    """``attach(pipe, calibrate=generate)``: the check runs after the generation, outside the pipeline's cache context
    and timestep, where First Block Cache raised ("No cache context is set") and Pyramid Attention Broadcast compared
    a timestep of None."""
    pipe, model, generate = _pipeline()
    model.enable_cache(_cache(pipe, cache))
    stock = generate()
    plan = ditgate.attach(pipe, profile=LENIENT_SPEED, forms=["sdpa_math"], timing_cache=False, progress=False,
                          calibrate=generate)
    after = generate()
    checks = plan.report().whole_model
    plan.detach()
    assert checks and checks[0].passed and torch.allclose(after, stock, atol=1e-5)
