"""Real diffusers transformer classes at named configurations, with random weights and inputs.

Used by ``ditgate demo`` (tiny configurations that run on a CPU in seconds), by ``ditgate bench
model`` (the published configurations at real video lengths) and by the tests. Nothing is downloaded:
the classes are diffusers' own, the weights are random, and the inputs are random with the shapes
the family's pipeline would pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch


@dataclass(frozen=True)
class ModelPreset:
    name: str
    family: str  # a key of _FAMILY_CLASS: "ltx", "wan", "hunyuan_video", "flux", "cogvideox", ...
    description: str
    config: dict = field(default_factory=dict)
    geometry: dict = field(default_factory=dict)  # latent frames / height / width, text length
    # modules (ends of their names) that the class initialises to zero and a preset draws again with torch's default
    # initialisation: Kandinsky 5's adaLN-zero modulation would make every untrained block pass its input through,
    # so attention would never reach the output
    redrawn: tuple[str, ...] = ()

    def build(self, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0):
        """Random weights, made on ``device`` itself: Wan-14B's 14 billion parameters would take 56 GB of host
        memory in float32, and minutes of initialisation on a CPU, on their way to a GPU."""
        torch.manual_seed(seed)
        cls = _FAMILY_CLASS[self.family]()
        with torch.device(device):
            model = cls(**self.config)
            for name, module in model.named_modules():
                if name.endswith(self.redrawn) and self.redrawn:
                    module.reset_parameters()
        model = model.to(device=device) if dtype == torch.float32 else model.to(device=device, dtype=dtype)
        return _keep_in_float32(model).eval()

    def with_layers(self, layers: int) -> ModelPreset:
        """The same configuration with each stack of transformer blocks cut to its first ``layers`` (every
        block of a stack has the same shapes, so a few give a model's per-block costs in a fraction of its
        time). Only stacks the configuration names (``num_layers``, ``num_single_layers``) are cut."""
        stacks = [k for k in ("num_layers", "num_single_layers", "num_visual_blocks") if k in self.config]
        if layers < 1:
            raise ValueError(f"layers must be at least 1, not {layers}")
        if not stacks:
            raise ValueError(f"preset {self.name!r} names no block stack to cut")
        every = self.config.get("inject_face_latents_blocks")
        if every and layers % every and layers < self.config["num_layers"]:
            raise ValueError(f"{self.name}: its face adapters follow every {every}th block, so the blocks kept must be "
                             f"a multiple of {every}, not {layers}")
        config = dict(self.config, **{k: min(layers, self.config[k]) for k in stacks})
        if config == self.config:
            return self
        cut = ", ".join(f"{k} {config[k]} of {self.config[k]}" for k in stacks)
        return replace(self, name=f"{self.name}-{layers}l", description=f"{self.description}; {cut}",
                                   config=config)

    def load(self, path: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        """The family's class from a local diffusers folder (``save_pretrained`` layout); nothing is fetched."""
        cls = _FAMILY_CLASS[self.family]()
        return cls.from_pretrained(path, torch_dtype=dtype, local_files_only=True).to(device).eval()

    def inputs(self, model: torch.nn.Module, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
               seed: int = 0) -> dict:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        return _FAMILY_INPUTS[self.family](self, model, gen, torch.device(device), dtype)

    @property
    def video_tokens(self) -> int:
        g = self.geometry
        return g.get("frames", 1) * g["height"] * g["width"] // g.get("patch_area", 1)


def _keep_in_float32(model: torch.nn.Module) -> torch.nn.Module:
    """The parameters and buffers the class names in ``_keep_in_fp32_modules`` back in float32, as diffusers'
    ``from_pretrained(torch_dtype=...)`` leaves them (a component of their name matches): Kandinsky 5's time
    embedding fails in bf16, and Wan's norms and time embedder run in float32 where it is deployed."""
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    if keep:
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if tensor.is_floating_point() and keep & set(name.split(".")):
                tensor.data = tensor.data.float()
    return model


def _rand(gen, shape, device, dtype):
    return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)


def _padded_mask(n: int, device) -> torch.Tensor:
    """Bool [1, n]: a prompt whose last quarter (at least one token) is padding, as a tokenizer pads."""
    mask = torch.ones(1, n, dtype=torch.bool)
    mask[:, n - max(1, n // 4):] = False
    return mask.to(device=device)


def _latent(p: ModelPreset, model, gen, device, dtype) -> torch.Tensor:
    """The [1, C, F, H, W] latent that Wan, HunyuanVideo, Mochi and Cosmos take."""
    g = p.geometry
    return _rand(gen, (1, model.config.in_channels, g["frames"], g["height"], g["width"]), device, dtype)


def _ltx_inputs(p: ModelPreset, model, gen, device, dtype) -> dict:
    g, c = p.geometry, model.config
    f, h, w, text = g["frames"], g["height"], g["width"], g["text"]
    return dict(
        hidden_states=_rand(gen, (1, f * h * w, c.in_channels), device, dtype),
        encoder_hidden_states=_rand(gen, (1, text, c.caption_channels), device, dtype),
        timestep=torch.tensor([500], device=device),
        encoder_attention_mask=_padded_mask(text, device).to(dtype=dtype),
        num_frames=f, height=h, width=w,
        return_dict=False,
    )


def _ltx2_inputs(p: ModelPreset, model, gen, device, dtype) -> dict:
    g, c = p.geometry, model.config
    f, h, w, text, audio = g["frames"], g["height"], g["width"], g["text"], g["audio"]
    return dict(
        hidden_states=_rand(gen, (1, f * h * w, c.in_channels), device, dtype),
        audio_hidden_states=_rand(gen, (1, audio, c.audio_in_channels), device, dtype),
        encoder_hidden_states=_rand(gen, (1, text, c.caption_channels), device, dtype),
        audio_encoder_hidden_states=_rand(gen, (1, text, c.caption_channels), device, dtype),
        timestep=torch.tensor([500.0], device=device),
        num_frames=f, height=h, width=w, audio_num_frames=audio,
        return_dict=False,
    )


def _latent_and_text(p: ModelPreset, model, gen, device, dtype, text_channels: int, masked: bool = False) -> dict:
    """The [1, C, F, H, W] latent, timestep 500 and a prompt of ``text_channels`` (with its padding mask where
    ``masked``): all that Wan's, EasyAnimate's, Mochi's and Allegro's pipelines pass."""
    text = p.geometry["text"]
    out = dict(
        hidden_states=_latent(p, model, gen, device, dtype),
        timestep=torch.tensor([500], device=device),
        encoder_hidden_states=_rand(gen, (1, text, text_channels), device, dtype),
        return_dict=False,
    )
    if masked:
        out["encoder_attention_mask"] = _padded_mask(text, device)
    return out


def _wan_inputs(p: ModelPreset, model, gen, device, dtype) -> dict:
    """Where the geometry names ``start_frames`` (Wan 2.2's TI2V from an image), one timestep per token, 0 on
    those first frames, as its image-to-video pipeline passes."""
    out = _latent_and_text(p, model, gen, device, dtype, model.config.text_dim)
    g = p.geometry
    if g.get("start_frames"):
        pt, ph, pw = model.config.patch_size
        per_frame = (g["height"] // ph) * (g["width"] // pw)
        timestep = torch.full((1, g["frames"] // pt * per_frame), 500.0, device=device)
        timestep[:, :g["start_frames"] * per_frame] = 0.0
        out["timestep"] = timestep
    return out


def _wan_vace_inputs(p: ModelPreset, model, gen, device, dtype) -> dict:
    g, c = p.geometry, model.config
    control = _rand(gen, (1, c.vace_in_channels, g["frames"], g["height"], g["width"]), device, dtype)
    return dict(_wan_inputs(p, model, gen, device, dtype), control_hidden_states=control)


def _wan_animate_inputs(p: ModelPreset, model, gen, device, dtype) -> dict:
    """The latent's ``frames`` include the reference frame first; the pose covers the others, and the face video
    has the 4(T - 1) + 1 frames that the face encoder brings back to T motion frames."""
    g, c = p.geometry, model.config
    f, h, w, size = g["frames"], g["height"], g["width"], c.motion_encoder_size
    out = dict(
        _wan_inputs(p, model, gen, device, dtype),
        pose_hidden_states=_rand(gen, (1, c.latent_channels, f - 1, h, w), device, dtype),
        face_pixel_values=_rand(gen, (1, 3, 4 * (f - 1) - 3, size, size), device, dtype),
    )
    if g.get("clip_image"):  # the character image's CLIP tokens, which the published configuration's attn2 takes
        out["encoder_hidden_states_image"] = _rand(gen, (1, g["clip_image"], c.image_dim), device, dtype)
    return out


def _hunyuan_video_inputs(p: ModelPreset, model, gen, device, dtype) -> dict:
    g, c = p.geometry, model.config
    text = g["text"]
    out = dict(
        hidden_states=_latent(p, model, gen, device, dtype),
        timestep=torch.tensor([500], device=device),
        encoder_hidden_states=_rand(gen, (1, text, c.text_embed_dim), device, dtype),
        encoder_attention_mask=_padded_mask(text, device),
        pooled_projections=_rand(gen, (1, c.pooled_projection_dim), device, dtype),
        return_dict=False,
    )
    if c.guidance_embeds:
        out["guidance"] = torch.tensor([6000.0], device=device, dtype=dtype)
    return out


def _hunyuan_video15_inputs(p: ModelPreset, model, gen, device, dtype) -> dict:
    """Text to video: an all-zero image, as the pipeline passes when no image is given."""
    g, c = p.geometry, model.config
    text, glyphs, image = g["text"], g["glyph_text"], g["image"]
    return dict(
        hidden_states=_latent(p, model, gen, device, dtype),
        timestep=torch.tensor([500.0], device=device, dtype=dtype),
        encoder_hidden_states=_rand(gen, (1, text, c.text_embed_dim), device, dtype),
        encoder_attention_mask=_padded_mask(text, device),
        encoder_hidden_states_2=_rand(gen, (1, glyphs, c.text_embed_2_dim), device, dtype),
        encoder_attention_mask_2=_padded_mask(glyphs, device),
        image_embeds=torch.zeros(1, image, c.image_embed_dim, device=device, dtype=dtype),
        return_dict=False,
    )


def _framepack_inputs(p: ModelPreset, model, gen, device, dtype) -> dict:
    c = model.config
    out = dict(_hunyuan_video_inputs(p, model, gen, device, dtype),
               image_embeds=_rand(gen, (1, p.geometry["image"], c.image_proj_dim), device, dtype))
    return dict(out, **_history(p, model, gen, device, dtype, ("latents_history_4x", "latents_history_2x",
                                                                   "latents_clean", "latents"), batched=False))


def _helios_inputs(p: ModelPreset, model, gen, device, dtype) -> dict:
    out = _wan_inputs(p, model, gen, device, dtype)
    return dict(out, **_history(p, model, gen, device, dtype, ("latents_history_long", "latents_history_mid",
                                                                   "latents_history_short", "hidden_states"),
                                batched=True))


def _history(p: ModelPreset, model, gen, device, dtype, names: tuple[str, str, str, str], batched: bool) -> dict:
    """Framepack's and Helios' history as their pipelines' vanilla sampling gives it: ``history_4x`` frames at the
    coarsest level, two at the middle one, and the image's latent with the newest frame at the finest; then the
    window (``names[3]``: only its frame indices). Each stream has its frame indices, [n] or (``batched``) [1, n]."""
    g, c = p.geometry, model.config
    f, h, w = g["frames"], g["height"], g["width"]
    out, start = {}, 1
    for name, n in zip(names[:3], (g["history_4x"], 2, 2)):
        out[name] = _rand(gen, (1, c.in_channels, n, h, w), device, dtype)
        out["indices_" + name] = torch.arange(start, start + n, device=device)
        start += n
    out["indices_" + names[2]] = torch.tensor([0, start - 1], device=device)  # the image, the newest history frame
    out["indices_" + names[3]] = torch.arange(start, start + f, device=device)
    return {k: v[None] if batched and k.startswith("indices") else v for k, v in out.items()}


def _motif_video_inputs(p: ModelPreset, model, gen, device, dtype) -> dict:
    """Image to video: the image's embedding as ``image_embeds`` (its pipeline's first-frame conditioning)."""
    c = model.config
    out = _latent_and_text(p, model, gen, device, dtype, c.text_embed_dim, masked=True)
    return dict(out, image_embeds=_rand(gen, (1, p.geometry["image"], c.image_embed_dim), device, dtype))


def _mochi_inputs(p: ModelPreset, model, gen, device, dtype) -> dict:
    return _latent_and_text(p, model, gen, device, dtype, model.config.text_embed_dim, masked=True)


def _cosmos_inputs(p: ModelPreset, model, gen, device, dtype) -> dict:
    g, c = p.geometry, model.config
    return dict(
        hidden_states=_latent(p, model, gen, device, dtype),
        timestep=torch.tensor([0.5], device=device, dtype=dtype),
        encoder_hidden_states=_rand(gen, (1, g["text"], c.text_embed_dim), device, dtype),
        return_dict=False,
    )


def _flux_inputs(p: ModelPreset, model, gen, device, dtype) -> dict:
    g, c = p.geometry, model.config
    h, w, text = g["height"] // 2, g["width"] // 2, g["text"]
    img_ids = torch.zeros(h, w, 3)
    img_ids[..., 1] = torch.arange(h)[:, None]
    img_ids[..., 2] = torch.arange(w)[None, :]
    out = dict(
        hidden_states=_rand(gen, (1, h * w, c.in_channels), device, dtype),
        encoder_hidden_states=_rand(gen, (1, text, c.joint_attention_dim), device, dtype),
        pooled_projections=_rand(gen, (1, c.pooled_projection_dim), device, dtype),
        timestep=torch.tensor([0.5], device=device, dtype=dtype),
        img_ids=img_ids.reshape(-1, 3).to(device=device, dtype=dtype),
        txt_ids=torch.zeros(text, 3, device=device, dtype=dtype),
        return_dict=False,
    )
    if c.guidance_embeds:
        out["guidance"] = torch.tensor([3.5], device=device, dtype=dtype)
    return out


def _cogvideox_inputs(p: ModelPreset, model, gen, device, dtype) -> dict:
    g, c = p.geometry, model.config
    return dict(
        hidden_states=_rand(gen, (1, g["frames"], c.in_channels, g["height"], g["width"]), device, dtype),
        encoder_hidden_states=_rand(gen, (1, g["text"], c.text_embed_dim), device, dtype),
        timestep=torch.tensor([500], device=device),
        return_dict=False,
    )


def _easyanimate_inputs(p: ModelPreset, model, gen, device, dtype) -> dict:
    return _latent_and_text(p, model, gen, device, dtype, model.config.text_embed_dim)


def _allegro_inputs(p: ModelPreset, model, gen, device, dtype) -> dict:
    return _latent_and_text(p, model, gen, device, dtype, model.config.caption_channels, masked=True)


def _kandinsky5_inputs(p: ModelPreset, model, gen, device, dtype) -> dict:
    """The latent channels last, [1, F, H, W, C], and the rotary positions its pipeline builds."""
    g, c = p.geometry, model.config
    f, h, w, text = g["frames"], g["height"], g["width"], g["text"]
    _, ph, pw = c.patch_size
    return dict(
        hidden_states=_rand(gen, (1, f, h, w, c.in_visual_dim), device, dtype),
        encoder_hidden_states=_rand(gen, (1, text, c.in_text_dim), device, dtype),
        pooled_projections=_rand(gen, (1, c.in_text_dim2), device, dtype),
        timestep=torch.tensor([500.0], device=device, dtype=dtype),
        visual_rope_pos=[torch.arange(n, device=device) for n in (f, h // ph, w // pw)],
        text_rope_pos=torch.arange(text, device=device),
        return_dict=False,
    )


def _kandinsky6_inputs(p: ModelPreset, model, gen, device, dtype) -> dict:
    """Image and text to video and audio: the reference image appended as a last frame of token type 1, at the
    first frame's rotary position, as its pipeline does; channels [latent | unused conditioning | mask]."""
    g, c = p.geometry, model.config
    f, h, w, text = g["frames"], g["height"], g["width"], g["text"]
    _, ph, pw = c.patch_size
    types = torch.zeros(1, f + 1, dtype=torch.long, device=device)
    types[:, -1] = 1
    return dict(
        hidden_states=_rand(gen, (1, f + 1, h, w, 2 * c.in_visual_dim + 1), device, dtype),
        encoder_hidden_states=_rand(gen, (1, text, c.in_text_dim), device, dtype),
        pooled_projections=_rand(gen, (1, c.in_text_dim2), device, dtype),
        timestep=torch.tensor([500.0], device=device, dtype=dtype),
        audio_hidden_states=_rand(gen, (1, g["audio"], c.in_audio_dim), device, dtype),
        visual_rope_pos=(torch.cat([torch.arange(f), torch.zeros(1, dtype=torch.long)]).to(device),
                         torch.arange(h // ph, device=device), torch.arange(w // pw, device=device)),
        encoder_attention_mask=_padded_mask(text, device),
        visual_token_type_ids=types,
        return_dict=False,
    )


def _pixart_inputs(p: ModelPreset, model, gen, device, dtype) -> dict:
    g, c = p.geometry, model.config
    return dict(
        hidden_states=_rand(gen, (1, c.in_channels, g["height"], g["width"]), device, dtype),
        encoder_hidden_states=_rand(gen, (1, g["text"], c.caption_channels), device, dtype),
        timestep=torch.tensor([500], device=device),
        added_cond_kwargs={"resolution": None, "aspect_ratio": None},
        return_dict=False,
    )


def _cls(name: str) -> Callable[[], type]:
    def get():
        import diffusers

        return getattr(diffusers, name)

    get.class_name = name
    return get


_FAMILY_CLASS = {
    "ltx": _cls("LTXVideoTransformer3DModel"),
    "ltx2": _cls("LTX2VideoTransformer3DModel"),
    "wan": _cls("WanTransformer3DModel"),
    "wan_vace": _cls("WanVACETransformer3DModel"),
    "skyreels_v2": _cls("SkyReelsV2Transformer3DModel"),
    "cosmos": _cls("CosmosTransformer3DModel"),
    "chronoedit": _cls("ChronoEditTransformer3DModel"),
    "wan_animate": _cls("WanAnimateTransformer3DModel"),
    "allegro": _cls("AllegroTransformer3DModel"),
    "consisid": _cls("ConsisIDTransformer3DModel"),
    "easyanimate": _cls("EasyAnimateTransformer3DModel"),
    "kandinsky5": _cls("Kandinsky5Transformer3DModel"),
    "kandinsky6": _cls("Kandinsky6Transformer3DModel"),
    "helios": _cls("HeliosTransformer3DModel"),
    "motif_video": _cls("MotifVideoTransformer3DModel"),
    "framepack": _cls("HunyuanVideoFramepackTransformer3DModel"),
    "flux": _cls("FluxTransformer2DModel"),
    "hunyuan_video": _cls("HunyuanVideoTransformer3DModel"),
    "hunyuan_video15": _cls("HunyuanVideo15Transformer3DModel"),
    "mochi": _cls("MochiTransformer3DModel"),
    "cogvideox": _cls("CogVideoXTransformer3DModel"),
    "pixart": _cls("PixArtTransformer2DModel"),
}
_FAMILY_INPUTS = {
    "ltx": _ltx_inputs,
    "ltx2": _ltx2_inputs,
    "wan": _wan_inputs,
    "wan_vace": _wan_vace_inputs,
    "skyreels_v2": _wan_inputs,
    "cosmos": _cosmos_inputs,
    "chronoedit": _wan_inputs,
    "wan_animate": _wan_animate_inputs,
    "allegro": _allegro_inputs,
    "consisid": _cogvideox_inputs,
    "easyanimate": _easyanimate_inputs,
    "kandinsky5": _kandinsky5_inputs,
    "kandinsky6": _kandinsky6_inputs,
    "helios": _helios_inputs,
    "motif_video": _motif_video_inputs,
    "framepack": _framepack_inputs,
    "flux": _flux_inputs,
    "hunyuan_video": _hunyuan_video_inputs,
    "hunyuan_video15": _hunyuan_video15_inputs,
    "mochi": _mochi_inputs,
    "cogvideox": _cogvideox_inputs,
    "pixart": _pixart_inputs,
}

_TINY_LTX = dict(in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=16,
                 cross_attention_dim=32, num_layers=2, caption_channels=16)
_TINY_WAN_BLOCKS = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4,
                        out_channels=4, text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2)
_TINY_WAN = dict(_TINY_WAN_BLOCKS, rope_max_seq_len=32)
_TINY_HUNYUAN_VIDEO = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=1,
                           num_single_layers=1, num_refiner_layers=1, text_embed_dim=16, pooled_projection_dim=8,
                           rope_axes_dim=(4, 6, 6))
_TINY_FLUX = dict(in_channels=8, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
                  joint_attention_dim=16, pooled_projection_dim=8, axes_dims_rope=(4, 6, 6))

_LTX_2B = dict(in_channels=128, out_channels=128, patch_size=1, patch_size_t=1, num_attention_heads=32,
               attention_head_dim=64, cross_attention_dim=2048, num_layers=28, caption_channels=4096)
_WAN_1_3B = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16,
                 out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30)
_WAN_14B = dict(_WAN_1_3B, num_attention_heads=40, ffn_dim=13824, num_layers=40)
_WAN22_TI2V_5B = dict(_WAN_1_3B, num_attention_heads=24, ffn_dim=14336, in_channels=48, out_channels=48)
_HUNYUAN_VIDEO = dict(in_channels=16, out_channels=16, num_attention_heads=24, attention_head_dim=128, num_layers=20,
                      num_single_layers=40, num_refiner_layers=2, patch_size=2, patch_size_t=1, text_embed_dim=4096,
                      pooled_projection_dim=768, rope_axes_dim=(16, 56, 56), guidance_embeds=True)
_COGVIDEOX_5B = dict(num_attention_heads=48, attention_head_dim=64, in_channels=16, out_channels=16, num_layers=42,
                     text_embed_dim=4096, time_embed_dim=512, max_text_seq_length=226, patch_size=2,
                     sample_frames=49, sample_height=60, sample_width=90, use_rotary_positional_embeddings=True)
_FLUX_DEV = dict(in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128, num_attention_heads=24,
                 joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56))

PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset("tiny-ltx", "ltx", "LTX-Video, 2 layers, 2 heads x 16, 2x4x4 latent (32 tokens)", _TINY_LTX,
                    dict(frames=2, height=4, width=4, text=8)),
        ModelPreset("tiny-ltx2", "ltx2", "LTX-2 (video and audio), 1 layer, 2 heads x 16, 2x4x4 latent (32 video "
                    "tokens), 10 audio frames", dict(in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=16,
                                   cross_attention_dim=32, audio_in_channels=8, audio_out_channels=8,
                                   audio_num_attention_heads=2, audio_attention_head_dim=16,
                                   audio_cross_attention_dim=32, num_layers=1, caption_channels=16),
                    dict(frames=2, height=4, width=4, text=8, audio=10)),
        ModelPreset("tiny-wan", "wan", "Wan 2.1, 2 layers, 2 heads x 16, 2x8x8 latent (32 tokens)", _TINY_WAN,
                    dict(frames=2, height=8, width=8, text=8, patch_area=4)),
        ModelPreset("tiny-wan-vace", "wan_vace", "Wan VACE, 2 layers (control blocks at layer 0), 2x8x8 latent (32 "
                    "tokens)",
                    dict(_TINY_WAN, vace_layers=[0], vace_in_channels=8),
                    dict(frames=2, height=8, width=8, text=8, patch_area=4)),
        ModelPreset("tiny-skyreels-v2", "skyreels_v2", "SkyReels-V2, 2 layers, 2 heads x 16, 2x8x8 latent (32 tokens)",
                    _TINY_WAN, dict(frames=2, height=8, width=8, text=8, patch_area=4)),
        ModelPreset("tiny-chronoedit", "chronoedit", "ChronoEdit, 2 layers, 2 heads x 16, 2x8x8 latent (32 tokens)",
                    _TINY_WAN, dict(frames=2, height=8, width=8, text=8, patch_area=4)),
        ModelPreset("tiny-wan-animate", "wan_animate", "Wan Animate, 2 layers, 2 heads x 16, 3x8x8 latent (16 "
                    "reference + 32 video tokens), 8x8 face video",
                    dict(_TINY_WAN, in_channels=12, latent_channels=4, motion_encoder_size=8,
                         motion_encoder_channel_sizes={"8": 8, "4": 8}, motion_style_dim=8, motion_dim=4,
                         motion_encoder_dim=8, face_encoder_hidden_dim=16, face_encoder_num_heads=2,
                         inject_face_latents_blocks=1),
                    dict(frames=3, height=8, width=8, text=8, patch_area=4)),
        ModelPreset("tiny-helios", "helios", "Helios, 2 layers, 2 heads x 16, 2x8x8 latent window (37 history + 32 "
                    "video tokens)", dict(_TINY_WAN_BLOCKS, rope_dim=(4, 6, 6)),
                    dict(frames=2, height=8, width=8, text=8, history_4x=4, patch_area=4)),
        ModelPreset("tiny-framepack", "framepack", "HunyuanVideo Framepack, 1+1 layers, 2 heads x 16, 2x8x8 latent "
                    "window (37 history + 32 video + 3 image + 6 of 8 text tokens)",
                    dict(_TINY_HUNYUAN_VIDEO, has_image_proj=True, image_proj_dim=16, has_clean_x_embedder=True),
                    dict(frames=2, height=8, width=8, text=8, image=3, history_4x=4, patch_area=4)),
        ModelPreset("tiny-hunyuan-video", "hunyuan_video", "HunyuanVideo, 1+1 layers, 2 heads x 16, 2x8x8 latent "
                    "(32 video + 8 text tokens, 2 of them padding)",
                    _TINY_HUNYUAN_VIDEO, dict(frames=2, height=8, width=8, text=8, patch_area=4)),
        ModelPreset("tiny-hunyuan-video15", "hunyuan_video15", "HunyuanVideo 1.5, 1 layer, 2 heads x 16, 2x8x8 "
                    "latent (128 video tokens, then 5 image, 4 glyph and 8 prompt tokens: 9 valid)",
                    dict(in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=1,
                         num_refiner_layers=1, text_embed_dim=16, text_embed_2_dim=16, image_embed_dim=16,
                         rope_axes_dim=(4, 6, 6)),
                    dict(frames=2, height=8, width=8, text=8, glyph_text=4, image=5)),
        ModelPreset("tiny-motif-video", "motif_video", "Motif Video (image to video), 1+2 layers (the last a decoder "
                    "block), 2 heads x 16, 2x8x8 latent (32 video + 3 image + 6 of 8 text tokens)",
                    dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=1,
                         num_single_layers=2, num_decoder_layers=1, text_embed_dim=16, image_embed_dim=16,
                         rope_axes_dim=(4, 6, 6)),
                    dict(frames=2, height=8, width=8, text=8, image=3, patch_area=4)),
        ModelPreset("tiny-mochi", "mochi", "Mochi, 2 layers, 2 heads x 16, 2x8x8 latent (32 video + 6 of 8 text "
                    "tokens)", dict(patch_size=2, num_attention_heads=2, attention_head_dim=16, num_layers=2,
                                    pooled_projection_dim=16, in_channels=4, text_embed_dim=16, time_embed_dim=16,
                                    max_sequence_length=8),
                    dict(frames=2, height=8, width=8, text=8, patch_area=4)),
        ModelPreset("tiny-cosmos", "cosmos", "Cosmos, 2 layers, 2 heads x 16, 2x8x8 latent (32 tokens; no padding "
                    "mask channel, which needs torchvision)",
                    dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=2,
                         text_embed_dim=16, adaln_lora_dim=8, max_size=(8, 16, 16), patch_size=(1, 2, 2),
                         encoder_hidden_states_channels=16, crossattn_proj_in_channels=16,
                         concat_padding_mask=False),
                    dict(frames=2, height=8, width=8, text=8, patch_area=4)),
        ModelPreset("tiny-flux", "flux", "Flux, 1+1 layers, 2 heads x 16, 8x8 latent (16 image + 8 text)", _TINY_FLUX,
                    dict(height=8, width=8, text=8, patch_area=4)),
        ModelPreset("tiny-cogvideox", "cogvideox", "CogVideoX, 2 layers (calls F.scaled_dot_product_attention), 8 text + "
                    "32 video tokens",
                    dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
                         time_embed_dim=8, text_embed_dim=16, num_layers=2, sample_width=8, sample_height=8,
                         sample_frames=5, patch_size=2, max_text_seq_length=8),
                    dict(frames=2, height=8, width=8, text=8, patch_area=4)),
        ModelPreset("tiny-consisid", "consisid", "ConsisID, 2 layers (CogVideoX's packing, without the face "
                    "encoder), 8 text + 32 video tokens", dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
                                     time_embed_dim=8, text_embed_dim=16, num_layers=2, sample_width=8,
                                     sample_height=8, sample_frames=5, patch_size=2, max_text_seq_length=8),
                    dict(frames=2, height=8, width=8, text=8, patch_area=4)),
        ModelPreset("tiny-easyanimate", "easyanimate", "EasyAnimate, 2 layers, 2 heads x 16, 2x8x8 latent (8 text + "
                    "32 video tokens)", dict(num_attention_heads=2, attention_head_dim=16, in_channels=4,
                                             out_channels=4, patch_size=2, sample_width=8, sample_height=8,
                                             num_layers=2, mmdit_layers=2, time_embed_dim=8, text_embed_dim=16),
                    dict(frames=2, height=8, width=8, text=8, patch_area=4)),
        ModelPreset("tiny-kandinsky5", "kandinsky5", "Kandinsky 5, 1 text and 2 visual blocks, 2 heads x 16, 2x8x8 "
                    "latent (32 tokens)", dict(in_visual_dim=4, in_text_dim=16, in_text_dim2=8, time_dim=16,
                                               out_visual_dim=4, model_dim=32, ff_dim=64, num_text_blocks=1,
                                               num_visual_blocks=2, axes_dims=(4, 6, 6)),
                    dict(frames=2, height=8, width=8, text=8, patch_area=4), redrawn=("modulation.out_layer",)),
        ModelPreset("tiny-kandinsky6", "kandinsky6", "Kandinsky 6 (image and text to video and audio), 1 text and 2 "
                    "fused blocks, 2 heads x 16, 2x8x8 latent (32 video tokens, then the reference frame's 16), 10 "
                    "audio frames", dict(in_visual_dim=4, out_visual_dim=4, in_text_dim=16, in_text_dim2=8,
                                         time_dim=16, model_dim=32, ff_dim=64, num_text_blocks=1,
                                         num_visual_blocks=2, axes_dims=(4, 6, 6), in_audio_dim=4, out_audio_dim=4,
                                         model_dim_a=32, time_dim_a=16, ff_dim_a=64, axes_dims_a=(16,),
                                         visual_token_type_num_embeddings=2),
                    dict(frames=2, height=8, width=8, text=8, audio=10, patch_area=4)),
        ModelPreset("tiny-allegro", "allegro", "Allegro, 2 layers, 2 heads x 16, 2x8x8 latent (32 tokens)",
                    dict(patch_size=2, num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
                         num_layers=2, cross_attention_dim=32, sample_height=8, sample_width=8, sample_frames=2,
                         caption_channels=16),
                    dict(frames=2, height=8, width=8, text=8, patch_area=4)),
        ModelPreset("tiny-pixart", "pixart", "PixArt, 2 layers (diffusers Attention + AttnProcessor2_0)",
                    dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=8, num_layers=2,
                         norm_num_groups=4, cross_attention_dim=32, sample_size=8, caption_channels=16),
                    dict(height=8, width=8, text=8, patch_area=4)),
        ModelPreset("ltx-2b-768x512x121", "ltx", "LTX-Video 2B, 768x512, 121 frames (6144 tokens)", _LTX_2B,
                    dict(frames=16, height=16, width=24, text=128)),
        ModelPreset("ltx-2b-1216x704x257", "ltx", "LTX-Video 2B, 1216x704, 257 frames (27588 tokens)", _LTX_2B,
                    dict(frames=33, height=22, width=38, text=128)),
        ModelPreset("wan-1.3b-480p-81f", "wan", "Wan 2.1 1.3B, 832x480, 81 frames (32760 tokens)", _WAN_1_3B,
                    dict(frames=21, height=60, width=104, text=512, patch_area=4)),
        ModelPreset("wan-14b-480p-81f", "wan", "Wan 2.1 14B, 832x480, 81 frames (32760 tokens)", _WAN_14B,
                    dict(frames=21, height=60, width=104, text=512, patch_area=4)),
        ModelPreset("hunyuan-video-544x960x129", "hunyuan_video", "HunyuanVideo 13B, 960x544, 129 frames (67320 "
                    "video + 256 text tokens)", _HUNYUAN_VIDEO, dict(frames=33, height=68, width=120, text=256,
                                                                       patch_area=4)),
        ModelPreset("hunyuan-video15-848x480x121", "hunyuan_video15", "HunyuanVideo 1.5 (8.3B, its class's default "
                    "configuration), 848x480, 121 frames, text to video (49290 video tokens, then 729 image, 256 "
                    "glyph and 1000 prompt slots: 942 valid)", dict(num_layers=54),
                    dict(frames=31, height=30, width=53, text=1000, glyph_text=256, image=729)),
        ModelPreset("cogvideox-5b-720x480x49", "cogvideox", "CogVideoX 5B, 720x480, 49 frames (226 text + 17550 "
                    "video tokens; the rotary embedding its pipeline passes is left out)", _COGVIDEOX_5B,
                    dict(frames=13, height=60, width=90, text=226, patch_area=4)),
        ModelPreset("wan-animate-14b-720p-77f", "wan_animate", "Wan 2.2 Animate 14B, 1280x720, a 77-frame segment "
                    "(3600 reference + 72000 video tokens)",
                    dict(num_layers=40, inject_face_latents_blocks=5, added_kv_proj_dim=5120),
                    dict(frames=21, height=90, width=160, text=512, clip_image=257, patch_area=4)),
        ModelPreset("wan22-ti2v-5b-1280x704x121", "wan", "Wan 2.2 TI2V 5B from an image, 1280x704, 121 frames (880 "
                    "starting-frame + 26400 video tokens)", _WAN22_TI2V_5B,
                    dict(frames=31, height=44, width=80, text=512, start_frames=1, patch_area=4)),
        ModelPreset("framepack-720p-9f", "framepack", "HunyuanVideo Framepack 13B, 1280x720, a 9-frame window after "
                    "16 + 2 + 2 history frames (9080 history + 32400 video + 729 image + 192 of 256 text tokens)",
                    dict(_HUNYUAN_VIDEO, has_image_proj=True, image_proj_dim=1152, has_clean_x_embedder=True),
                    dict(frames=9, height=90, width=160, text=256, image=729, history_4x=16, patch_area=4)),
        ModelPreset("kandinsky5-lite-768x512x121", "kandinsky5", "Kandinsky 5 Lite (its class's default "
                    "configuration), 768x512, 121 frames (47616 video tokens)", dict(num_visual_blocks=32),
                    dict(frames=31, height=64, width=96, text=256, patch_area=4), redrawn=("modulation.out_layer",)),
        ModelPreset("mochi-848x480x163", "mochi", "Mochi 1 (10B, its class's default configuration), 848x480, 163 "
                    "frames (44520 video + up to 256 text tokens)", dict(num_layers=48),
                    dict(frames=28, height=60, width=106, text=256, patch_area=4)),
        ModelPreset("flux-dev-1024", "flux", "Flux.1-dev, 1024x1024 (4096 image + 512 text tokens)", _FLUX_DEV,
                    dict(height=128, width=128, text=512, patch_area=4)),
    )
}

DEMO_PRESETS = ("tiny-ltx", "tiny-wan", "tiny-hunyuan-video", "tiny-flux")


def preset_class_name(preset: ModelPreset) -> str:
    """The diffusers class a preset builds, by name (without importing diffusers)."""
    return _FAMILY_CLASS[preset.family].class_name


def get_preset(name: str) -> ModelPreset:
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]
