"""diffusers' context parallelism as one attention call sees it, and the scoped way into its local op.

``model.enable_parallelism(config=ContextParallelConfig(...))`` splits a denoiser's sequence over ranks and hands
each processor the ``parallel_config``, which it passes to ``dispatch_attention_fn``. The backend then runs
diffusers' templated context-parallel attention: Ulysses exchanges sequence shards for head shards (all-to-all),
calls the backend's *local op* on the whole sequence and the rank's heads, and exchanges back; ring passes
key/value chunks around the ranks and merges the local op's partial results by their log-sum-exp; unified does
both. Everything but the local op is diffusers' own, and stays so.

``templated_backend`` gives the backend function the host would call, re-bound to a private copy of its module's
globals in which ``_templated_context_parallel_attention`` first hands the backend's local op to a wrapper: the
exchange runs unchanged and only the local op is routed. Nothing process-wide is patched.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch

TEMPLATED = "_templated_context_parallel_attention"
# diffusers' forward-op signature: (ctx, q, k, v, mask, dropout, causal, scale, gqa, return_lse, *, _save_ctx, ...)
LocalOp = Callable[..., object]


@dataclass(frozen=True)
class ContextParallel:
    """The context-parallel configuration of a denoiser (no process group: that is ``group_of``'s)."""

    ring_degree: int
    ulysses_degree: int
    world_size: int
    ulysses_anything: bool = False
    ring_anything: bool = False

    @classmethod
    def of(cls, config: object) -> ContextParallel | None:
        """From a ``ParallelConfig`` or ``ContextParallelConfig`` (set up), or a model's ``_parallel_config``;
        None when it holds no context parallelism over more than one rank."""
        cp = getattr(config, "context_parallel_config", config)
        if cp is None or not hasattr(cp, "ulysses_degree") or not (getattr(cp, "_world_size", None) or 0) > 1:
            return None
        return cls(int(cp.ring_degree), int(cp.ulysses_degree), int(cp._world_size), bool(cp.ulysses_anything),
                   bool(cp.ring_anything))

    @classmethod
    def of_model(cls, model: torch.nn.Module) -> ContextParallel | None:
        return cls.of(getattr(model, "_parallel_config", None))

    @property
    def merges_by_lse(self) -> bool:
        """Ring (alone or inside unified) merges partial results by their log-sum-exp."""
        return self.ring_degree > 1

    def refusal(self) -> str:
        """Why ditgate keeps every call under this configuration on the host ("" when it need not)."""
        if self.ulysses_anything or self.ring_anything:
            mode = "ulysses_anything" if self.ulysses_anything else "ring_anything"
            return (f"context parallelism with {mode}: ranks may hold different lengths, so one verdict per site "
                    "and shape cannot hold for all of them")
        return ""

    def text(self) -> str:
        return f"ulysses {self.ulysses_degree} x ring {self.ring_degree} over {self.world_size} ranks"

    def record(self) -> dict:
        """What a receipt keeps: measured routes hold for this configuration only."""
        return {"ulysses_degree": self.ulysses_degree, "ring_degree": self.ring_degree,
                "world_size": self.world_size, "ulysses_anything": self.ulysses_anything,
                "ring_anything": self.ring_anything}


def group_of(model: torch.nn.Module):
    """The process group over all ranks of ``model``'s context parallelism, or None when it has none."""
    if ContextParallel.of_model(model) is None:
        return None
    return model._parallel_config.context_parallel_config._flattened_mesh.get_group()


def is_diffusers_dispatch(fn: Callable) -> bool:
    from diffusers.models import attention_dispatch

    return fn is attention_dispatch.dispatch_attention_fn


def backend_name(backend: object) -> str:
    """The backend ``dispatch_attention_fn`` would use for ``backend`` (None: the process's active one)."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    if backend is None:
        return _AttentionBackendRegistry.get_active_backend()[0].value
    return AttentionBackendName(backend).value


@dataclass(frozen=True)
class TemplatedBackend:
    """A backend function whose context-parallel path routes its local op through ``wrap``."""

    name: str
    call: Callable[..., torch.Tensor] | None
    arguments: frozenset[str]
    reason: str = ""  # why there is none, when ``call`` is None


def templated_backend(name: str, wrap: Callable[[LocalOp], LocalOp]) -> TemplatedBackend:
    """The backend ``name`` re-bound so that the local op it hands diffusers' templated attention goes through
    ``wrap`` first (``wrap(forward_op)`` returns the op diffusers then calls, after its exchange)."""
    from diffusers.models import attention_dispatch
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    fn = _AttentionBackendRegistry._backends.get(AttentionBackendName(name))
    if not isinstance(fn, types.FunctionType) or TEMPLATED not in fn.__code__.co_names:
        return TemplatedBackend(name, None, frozenset(),
                                f"backend {name} does not run diffusers' templated context-parallel attention")

    def templated(*args, forward_op, backward_op, **kwargs):
        return getattr(attention_dispatch, TEMPLATED)(*args, forward_op=wrap(forward_op), backward_op=backward_op,
                                                       **kwargs)

    scoped = dict(fn.__globals__)
    scoped[TEMPLATED] = templated
    rebound = types.FunctionType(fn.__code__, scoped, fn.__name__, fn.__defaults__, fn.__closure__)
    rebound.__kwdefaults__ = fn.__kwdefaults__
    return TemplatedBackend(name, rebound, frozenset(inspect.signature(fn).parameters))


def parallel_records(denoisers: list[tuple[str, torch.nn.Module]]) -> dict[str, dict]:
    """Each context-parallel denoiser's configuration, by name (what a receipt records and checks)."""
    found = {name: ContextParallel.of_model(model) for name, model in denoisers}
    return {name: cp.record() for name, cp in found.items() if cp is not None}
