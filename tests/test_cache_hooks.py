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


@pytest.mark.parametrize("remembered", [False, True], ids=["checked", "check remembered"])
def test_pyramid_attention_broadcast_sees_the_calibrating_generation_as_diffusers_runs_it(tmp_path, remembered):
    """Pyramid Attention Broadcast counts forwards to decide which steps reuse attention: with the check's forward
    counted (one, where the check was remembered from an earlier process), the calibrating generation differed from
    stock's with the same cache by 0.2."""
    from diffusers import PyramidAttentionBroadcastConfig

    pipe, model, generate = _pipeline()
    model.enable_cache(PyramidAttentionBroadcastConfig(
        spatial_attention_block_skip_range=2, spatial_attention_timestep_skip_range=(-1, 1001),
        current_timestep_callback=lambda: pipe.current_timestep))
    stock = generate()
    cache = tmp_path / "timings.json"
    for _ in range(2 if remembered else 1):  # the first attach remembers the check, the second replays it
        plan = ditgate.attach(pipe, profile=LENIENT_SPEED, forms=["sdpa_math"], timing_cache=cache, progress=False)
        calibrating, after = generate(), generate()
        checks = plan.report().whole_model
        plan.detach()
    assert checks and checks[0].forwards == (1 if remembered else 2)
    assert torch.allclose(calibrating, stock, atol=1e-5) and torch.allclose(after, stock, atol=1e-5)
