"""Guards on a denoiser while a plan holds some of its linear weights: what would change the model partway and then
fail at the first held weight is refused before it changes anything.

``nn.Module._apply`` (``.to(dtype)``, ``.half()``, a pipeline's ``.to(torch.float16)``) and ``load_state_dict``
walk the modules in order: a cast reaches a held site's stand-in (``linear_weights.HeldWeight``) only after it has
cast every module before it, and a load copies every tensor before the first held one, so either would stop with the
model half changed. Each guard makes the same check on the held weights first, at the model's root: an instance
attribute (``_apply``) and a load hook of that model alone, both taken off at detach. What reaches a submodule
directly (``model.blocks[0].half()``) is not guarded; it still stops at its first held weight with the reason.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .instance_method import bind_on
from .linear_weights import HeldWeight, HeldWeightError


def _held(model: torch.nn.Module) -> list[tuple[str, HeldWeight]]:
    """The held weights under ``model`` with their state-dict keys (a scan: casts and loads are rare)."""
    found = []
    for name, module in model.named_modules():
        weight = module._parameters.get("weight")
        if isinstance(weight, HeldWeight):
            found.append((f"{name}.weight" if name else "weight", weight))
    return found


def _guarded_apply(self: torch.nn.Module, fn, recurse: bool = True):
    """``_apply`` with ``fn`` run on the held stand-ins first: a dtype change raises there, a move makes new stand-ins
    and changes nothing. Bound to its model as a method object, so that a copy of the model (``copy.deepcopy``)
    rebinds it to the copy."""
    for _, weight in _held(self):
        fn(weight)
    return type(self)._apply(self, fn, recurse)


def guard_casts(model: torch.nn.Module) -> Callable[[], None]:
    """Run every cast or move of ``model`` on its held stand-ins first (``_guarded_apply``); returns the way to take
    the guard off. A model that already has an ``_apply`` of its own on the instance is left as it is."""
    return bind_on(model, "_apply", _guarded_apply)


def _dtype_asked(args: tuple, kwargs: dict) -> torch.dtype | None:
    """The dtype a ``DiffusionPipeline.to(...)`` call asks for, positional or by name (None: a move alone)."""
    asked = kwargs.get("dtype")
    return asked if isinstance(asked, torch.dtype) else next((a for a in args if isinstance(a, torch.dtype)), None)


def _guarded_pipeline_to(self, *args, **kwargs):
    """``DiffusionPipeline.to`` refused before its first component is cast when a component holds a weight of another
    dtype than the one asked for (the pipeline casts its components one after another); bound to its pipeline as a
    method object, as ``_guarded_apply`` is."""
    dtype = _dtype_asked(args, kwargs)
    if dtype is not None:
        for name, component in getattr(self, "components", {}).items():
            if isinstance(component, torch.nn.Module):
                held = [(key, w) for key, w in _held(component) if w.dtype != dtype]
                if held:
                    raise HeldWeightError(
                        f"ditgate: the pipeline's .to({dtype}) refused before it changed anything: {len(held)} "
                        f"weight(s) of {name} are held by an attached plan (first: {held[0][0]}, {held[0][1].held_as})"
                        "; detach the plan (plan.detach()), cast, and attach again")
    return type(self).to(self, *args, **kwargs)


def guard_pipeline_casts(pipeline: object) -> Callable[[], None]:
    """Refuse a cast of ``pipeline`` (one with ``components`` and ``to``, a diffusers pipeline) to another dtype than
    its held weights' before any component changes; the way to take the guard off. A pipeline with a ``to`` of its own
    on the instance is left as it is."""
    if not callable(getattr(pipeline, "to", None)) or not isinstance(getattr(pipeline, "components", None), dict):
        return lambda: None
    return bind_on(pipeline, "to", _guarded_pipeline_to)


def _refuse_held_loads(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                       error_msgs) -> None:
    loading = [prefix + key for key, _ in _held(module) if prefix + key in state_dict]
    if loading:
        raise HeldWeightError(
            f"ditgate: load_state_dict refused before it changed anything: {len(loading)} of the weights it would "
            f"load are quantized by an attached plan (first: {loading[0]}); detach the plan (plan.detach()), load, "
            "and attach again, so that the new weights are quantized and measured anew")


def guard_load_state_dict(model: torch.nn.Module) -> Callable[[], None]:
    """Refuse ``model.load_state_dict`` before it copies anything when the state dict holds a held weight: the plan's
    8-bit weights were made, and measured, from the values it holds. Returns the way to take the guard off."""
    return model.register_load_state_dict_pre_hook(_refuse_held_loads).remove
