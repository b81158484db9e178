"""Which models of a pipeline are denoisers (the models ditgate attaches to).

A diffusers pipeline names its components; the denoisers are the ``torch.nn.Module`` components
named ``transformer``, ``transformer_2``, ``unet``, ``prior`` and the like. Text encoders and VAEs are
left alone: their attention runs once per generation, not once per step.
"""

from __future__ import annotations

import torch

DENOISER_PREFIXES = ("transformer", "unet", "prior", "denoiser")


class NoDenoiserError(ValueError):
    pass


def denoisers_of(target: object) -> list[tuple[str, torch.nn.Module]]:
    """(component name, model) pairs; a bare model is its own single denoiser with an empty name."""
    if isinstance(target, torch.nn.Module):
        return [("", target)]
    components = getattr(target, "components", None)
    if not isinstance(components, dict):
        raise TypeError(
            f"attach() takes a diffusers pipeline or a torch.nn.Module, not {type(target).__name__}"
        )
    found = [
        (name, comp)
        for name, comp in components.items()
        if isinstance(comp, torch.nn.Module) and name.startswith(DENOISER_PREFIXES)
    ]
    if not found:
        raise NoDenoiserError(
            f"no denoiser among the pipeline's components {sorted(components)}; "
            f"expected a torch module named {' / '.join(DENOISER_PREFIXES)}*"
        )
    return found
