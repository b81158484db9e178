"""diffusers' stateful hooks held still while ditgate runs forwards of its own.

Cache hooks (``apply_pyramid_attention_broadcast``, ``apply_first_block_cache``, FasterCache, TaylorSeer ...) sit
in a module's ``HookRegistry`` (``module._diffusers_hook``) and count the forwards they see, keep the last outputs,
and decide from both whether the next call computes or reuses. The whole-model check runs extra forwards on the
calibrating forward's inputs: counted by those hooks, they move the cache's schedule, and the generation that
calibrates differs from diffusers' own. ``hooks_held`` saves each stateful hook's attributes, and those of the state
objects it holds (one level down: ``hook.state.iteration``, ``hook.state.cache``), and puts them back after: the
hooks rebind these attributes rather than change tensors in place, so the saved references are their state.
A hook whose state lives deeper (a dict of per-context states that its forwards change in place) is not restored;
the review that found this saw Pyramid Attention Broadcast move, and First Block Cache and TaylorSeer not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def _stateful_hooks(model: torch.nn.Module) -> list[object]:
    found = []
    for module in model.modules():
        registry = getattr(module, "_diffusers_hook", None)
        for hook in getattr(registry, "hooks", {}).values():
            if getattr(hook, "_is_stateful", False):
                found.append(hook)
    return found


def _plain_object(value: object) -> bool:
    """An object whose attributes are state to save: not a module, a tensor, a function or a class."""
    return hasattr(value, "__dict__") and not isinstance(value, (torch.nn.Module, torch.Tensor, type)) \
        and not callable(value)


@contextlib.contextmanager
def hooks_held(model: torch.nn.Module) -> Iterator[int]:
    """While open, forwards of ``model`` may move its stateful diffusers hooks; on exit their attributes (and their
    state objects' attributes) are as they were on entry. Yields how many stateful hooks it holds."""
    saved = []
    for hook in _stateful_hooks(model):
        own = dict(vars(hook))
        inner = {name: (value, dict(vars(value))) for name, value in own.items() if _plain_object(value)}
        saved.append((hook, own, inner))
    try:
        yield len(saved)
    finally:
        for hook, own, inner in saved:
            vars(hook).clear()
            vars(hook).update(own)
            for value, attributes in inner.values():
                vars(value).clear()
                vars(value).update(attributes)
