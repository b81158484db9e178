"""Which models of a pipeline are denoisers (the models ditgate attaches to).

A diffusers pipeline names its components; the denoisers are the ``torch.nn.Module`` components
named ``transformer``, ``transformer_2``, ``unet``, ``prior`` and the like. Text encoders and VAEs are
left alone: their attention runs once per generation, not once per step.
"""

from __future__ import annotations

import torch
from torch._dynamo.eval_frame import OptimizedModule

DENOISER_PREFIXES = ("transformer", "unet", "prior", "denoiser")


class NoDenoiserError(ValueError):
    pass


def unwrap_compiled(model: torch.nn.Module) -> torch.nn.Module:
    """The model a ``torch.compile(model)`` wrapper (an ``OptimizedModule``) holds, else the model itself: ditgate
    attaches to the model, under the wrapper, whose compiled code then recompiles with the routes (its guards
    see the routed processors). Site names are the model's own, compiled or not."""
    inner = getattr(model, "_orig_mod", None)
    return inner if isinstance(inner, torch.nn.Module) and isinstance(model, OptimizedModule) else model


def compiled_wrappers(target: object, model: torch.nn.Module) -> list[torch.nn.Module]:
    """The ``torch.compile`` wrappers of ``model`` that ``target`` holds: ``target`` itself for a bare wrapper, each
    component of a pipeline that wraps it (one model may be a pipeline's component under two names)."""
    held = [target] if isinstance(target, torch.nn.Module) else list(getattr(target, "components", {}).values())
    return [w for w in held if isinstance(w, OptimizedModule) and unwrap_compiled(w) is model]


def denoisers_of(target: object) -> list[tuple[str, torch.nn.Module]]:
    """(component name, model) pairs; a bare model is its own single denoiser with an empty name. A compiled
    model (``torch.compile(model)``, bare or as a pipeline's component) stands for the model it wraps; a model
    under two component names counts once."""
    if isinstance(target, torch.nn.Module):
        return [("", unwrap_compiled(target))]
    components = getattr(target, "components", None)
    if not isinstance(components, dict):
        raise TypeError(
            f"attach() takes a diffusers pipeline or a torch.nn.Module, not {type(target).__name__}"
        )
    found: list[tuple[str, torch.nn.Module]] = []
    for name, comp in components.items():
        model = unwrap_compiled(comp) if isinstance(comp, torch.nn.Module) else None
        # one model under two names (transformer and transformer_2 of a two-expert pipeline given the same model) is
        # one denoiser, under its first name
        if model is not None and name.startswith(DENOISER_PREFIXES) and all(model is not m for _, m in found):
            found.append((name, model))
    if not found:
        raise NoDenoiserError(
            f"no denoiser among the pipeline's components {sorted(components)}; "
            f"expected a torch module named {' / '.join(DENOISER_PREFIXES)}*"
        )
    return found
