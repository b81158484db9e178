"""Masks that hide only padding (HunyuanVideo's text tail): every form sees the keys before the padding, unmasked."""

import dataclasses

import pytest
import torch

import ditgate
from ditgate.forms import MaskKind
from ditgate.models.presets import get_preset

from .helpers import FakeForm, Tiny, routes_of, twice


class _Seen(FakeForm):
    """Exact SDPA on maskless calls only (as fa4 and flash's SDPA take them), recording each call's key length."""

    def __init__(self) -> None:
        super().__init__("nomask", masks=frozenset({MaskKind.NONE}))
        self.keys: list[int] = []

    def run(self, inputs):
        self.keys.append(inputs.key.shape[2])
        return super().run(inputs)


def _host_then_routed(tiny: Tiny) -> tuple[torch.Tensor, torch.Tensor, dict, _Seen]:
    """The host's forward, then one routed through a static plan of the maskless form: both outputs, the plan's
    routes and the form (which kept every key length it saw)."""
    host = tiny.forward()
    seen = _Seen()
    plan = ditgate.attach(tiny.model, forms=["nomask"], measure=False, extra_forms=[seen])
    routed = tiny.forward()
    routes = routes_of(plan)
    plan.detach()
    return host, routed, routes, seen


def test_a_form_without_masks_serves_hunyuan_videos_masked_calls_exactly():
    tiny = Tiny("tiny-hunyuan-video")  # 32 video tokens, then 6 text and 2 of padding
    host, routed, routes, seen = _host_then_routed(tiny)
    assert routes["transformer_blocks.0.attn"] == {("nomask", ""): 1}
    assert routes["single_transformer_blocks.0.attn"] == {("nomask", ""): 1}
    # the token refiner's attention over the text alone has no layout: it keeps its mask, and the host serves it
    (refiner,) = routes["context_embedder.token_refiner.refiner_blocks.0.attn"]
    assert refiner[0] == "host" and "mask kind boolean" in refiner[1]
    assert seen.keys == [38, 38]  # the two padding keys were never read
    assert (routed - host).norm() / host.norm() < 1e-5
    assert torch.equal(tiny.forward(), host)  # detached: as it was


def test_framepacks_two_prompt_batches_are_served_over_the_keys_before_the_padding():
    """With one prompt Framepack cuts the text's padding off itself; with two it masks it ([B, 1, 1, S])."""
    tiny = Tiny("tiny-framepack")  # 37 history, 32 video, 3 image and 6 text tokens, then 2 of padding
    tiny.inputs = twice(tiny.inputs)
    host, routed, routes, seen = _host_then_routed(tiny)
    assert routes["transformer_blocks.0.attn"] == {("nomask", ""): 1}
    assert routes["single_transformer_blocks.0.attn"] == {("nomask", ""): 1}
    assert seen.keys == [78, 78]
    assert (routed - host).norm() / host.norm() < 1e-5


def test_motif_videos_joint_blocks_are_served_over_the_keys_before_the_padding():
    """Motif Video masks its text's padding ([B, 1, 1, S]) in its joint blocks; its decoder block attends over the
    latent twice, with no mask and no layout."""
    tiny = Tiny("tiny-motif-video")  # 32 video, 3 image and 6 text tokens, then 2 of padding
    host, routed, routes, seen = _host_then_routed(tiny)
    assert routes["transformer_blocks.0.attn"] == {("nomask", ""): 1}
    assert routes["single_transformer_blocks.0.attn"] == {("nomask", ""): 1}
    assert seen.keys == [41, 41, 64]
    assert (routed - host).norm() / host.norm() < 1e-5


@pytest.mark.parametrize("name", ["tiny-hunyuan-video", "tiny-hunyuan-video15"])
def test_the_gate_measures_maskless_forms_on_padding_masked_calls(name):
    base = get_preset(name)
    preset = dataclasses.replace(base, geometry=dict(base.geometry, frames=4, height=16, width=16))
    model = preset.build()
    inputs = preset.inputs(model)
    plan = ditgate.attach(model, profile="quality", forms=["sdpa_math", "nomask"], extra_forms=[_Seen()])
    with torch.no_grad():
        model(**inputs)
    verdict = next(v for v in plan.chooser.verdicts.values() if v.site == "transformer_blocks.0.attn")
    plan.detach()
    assert "mask=boolean" in verdict.shape_key
    measured = {m.form: m for m in verdict.measured}
    assert "nomask" in measured and measured["nomask"].cosine > 0.9999  # the same function, without the padding


def test_a_wan_mask_is_not_taken_for_padding():
    """Families without padding masks keep theirs: a maskless form never sees such a call."""
    tiny = Tiny("tiny-wan")
    plan = ditgate.attach(tiny.model, forms=["nomask"], measure=False, extra_forms=[_Seen()])
    assert plan.context.padding.cut("blocks.0.attn1", "blocks.0.attn1", torch.zeros(1, 2, 32, 16),
                                    torch.ones(1, 1, 1, 32, dtype=torch.bool)) == (
        None, "no verified layout says what the mask hides")
    plan.detach()


def test_hunyuan_video15s_square_masks_are_cut_and_their_padding_rows_zeroed():
    """HunyuanVideo 1.5 hides the padding's keys and rows ([B, 1, S, S]): the host's attention gives zeros in those
    rows, and a maskless form, handed the keys before the padding, gives the same once the router zeroes them."""
    tiny = Tiny("tiny-hunyuan-video15")  # 128 video tokens, 9 valid image and text tokens, 8 of padding
    block = tiny.model.transformer_blocks[0].attn
    outs = []
    handle = block.register_forward_hook(lambda m, a, kw, out: outs.append(out), with_kwargs=True)
    host, routed, routes, seen = _host_then_routed(tiny)
    handle.remove()
    assert routes["transformer_blocks.0.attn"] == {("nomask", ""): 1}
    assert seen.keys == [137]
    (host_video, host_text), (video, text) = outs
    # the padding rows leave the module as its output projection's bias alone, in both
    assert torch.allclose(text[:, 9:], host_text[:, 9:], atol=1e-6)
    assert torch.allclose(text, host_text, atol=1e-5) and torch.allclose(video, host_video, atol=1e-5)
    assert (routed - host).norm() / host.norm() < 1e-5
