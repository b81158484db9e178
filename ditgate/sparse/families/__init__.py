"""Token layouts read from what each host family passes its denoiser, for families verified to pack so.

A layout is only ever read from the arguments of the denoiser's forward (shapes, the latent grid, the
text stream's length); it is never guessed from a sequence length. Each module here verifies a
lineage of families (and ``tests/test_sparse_families.py`` on the real classes: perturbing the text, the latent or a
reference image changes exactly the rows the layout gives it at the first attention site).

Any other class has no layout: its sites stay dense and say so.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .base import KEY_PADDING, PAIR_PADDING, ForwardLayouts
from .hunyuan import framepack, hunyuan_video, hunyuan_video15, motif_video
from .joint import cogvideox, easyanimate, flux, mochi
from .ltx import ltx, ltx2
from .visual import allegro, kandinsky5, kandinsky6
from .wan import helios, wan, wan_animate

__all__ = ["FAMILIES", "FAMILIES_WITH_PADDING_MASKS", "KEY_PADDING", "PAIR_PADDING", "ForwardLayouts",
           "layouts_of_forward"]

FAMILIES: dict[str, Callable[..., ForwardLayouts]] = {
    "WanTransformer3DModel": wan,
    "WanVACETransformer3DModel": wan,
    "SkyReelsV2Transformer3DModel": wan,
    "CosmosTransformer3DModel": wan,
    "ChronoEditTransformer3DModel": wan,
    "WanAnimateTransformer3DModel": wan_animate,
    "AllegroTransformer3DModel": allegro,
    "CogVideoXTransformer3DModel": cogvideox,
    "ConsisIDTransformer3DModel": cogvideox,
    "EasyAnimateTransformer3DModel": easyanimate,
    "HeliosTransformer3DModel": helios,
    "Kandinsky5Transformer3DModel": kandinsky5,
    "Kandinsky6Transformer3DModel": kandinsky6,
    "HunyuanVideoFramepackTransformer3DModel": framepack,
    "HunyuanVideoTransformer3DModel": hunyuan_video,
    "HunyuanVideo15Transformer3DModel": hunyuan_video15,
    "MochiTransformer3DModel": mochi,
    "MotifVideoTransformer3DModel": motif_video,
    "LTXVideoTransformer3DModel": ltx,
    "LTX2VideoTransformer3DModel": ltx2,
    "FluxTransformer2DModel": flux,
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
