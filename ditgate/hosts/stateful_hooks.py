"""diffusers' stateful hooks stepped over while ditgate runs forwards of its own.

Cache hooks (Pyramid Attention Broadcast, First Block Cache, FasterCache, TaylorSeer, MagCache ...) sit in a module's
``HookRegistry`` (``module._diffusers_hook``): they count the forwards they see, keep outputs and Taylor factors, and
decide from these whether the next call computes or reuses; several need the pipeline's cache context or current
timestep, set only inside the pipeline's own loop. The whole-model check runs extra forwards on the calibrating
forward's inputs: through those hooks they moved the cache's schedule (the calibrating generation then differed from
diffusers' own), failed outside the pipeline's loop (``attach(..., calibrate=fn)`` with a cache on), or reused a
cached output in place of the blocks the check is there to check.

``stateful_hooks_skipped`` makes every stateful hook of a model (and every hook reading a cache's shared state) a
pass-through while it is open: its function
reference (what the registry's chain calls) calls the forward beneath it with no pre- or post-step, so the hook
neither reads nor changes its state. Stateless hooks (group offloading, layerwise casting) still run: the forward
needs them. On exit each reference is as it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def _pass_args(module, *args, **kwargs):
    return args, kwargs


def _pass_output(module, output):
    return output


def _keeps_state(hook: object) -> bool:
    """A hook that declares state (``_is_stateful``), or reads a cache's shared state (a ``state_manager``: First Block
    Cache's hooks after the head block declare none, and still need the pipeline's cache context)."""
    return bool(getattr(hook, "_is_stateful", False)) or getattr(hook, "state_manager", None) is not None


@contextlib.contextmanager
def stateful_hooks_skipped(model: torch.nn.Module) -> Iterator[int]:
    """While open, forwards of ``model`` step over its stateful diffusers hooks; yields how many it steps over."""
    saved = []
    for module in model.modules():
        registry = getattr(module, "_diffusers_hook", None)
        hooks = getattr(registry, "hooks", None)
        if not isinstance(hooks, dict):
            continue
        for hook in hooks.values():
            ref = getattr(hook, "fn_ref", None)
            if ref is None or not _keeps_state(hook):
                continue
            saved.append((ref, ref.pre_forward, ref.forward, ref.post_forward))
            ref.pre_forward, ref.post_forward = _pass_args, _pass_output
            if getattr(ref, "original_forward", None) is not None:  # a hook with a forward of its own
                ref.forward = ref.original_forward
    try:
        yield len(saved)
    finally:
        for ref, pre, forward, post in saved:
            if ref.pre_forward is _pass_args:  # not where a hook removed meanwhile left it (it would come back)
                ref.pre_forward, ref.forward, ref.post_forward = pre, forward, post
