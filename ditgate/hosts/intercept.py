"""Intercepting the attention call of one processor, scoped to that processor alone.

Nothing process-wide is patched. For each attention module, ditgate puts in place a *clone* of its
processor whose ``__call__`` is the original code object re-bound to a private copy of its module's
globals, in which ``dispatch_attention_fn`` (and ``F``, for processors that call
``F.scaled_dot_product_attention`` directly) are this site's router entries. The host's projections,
norms, rotary embeddings and output gates run unchanged; only the attention call itself is redirected.
Detach puts the original processor object back, so the model is exactly as it was.
"""

from __future__ import annotations

import copy
import enum
import functools
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .instance_method import bind_on


class Convention(str, enum.Enum):
    """How the host calls attention: diffusers' dispatcher (B, S, H, D) or torch SDPA (B, H, S, D)."""

    DISPATCH = "dispatch_attention_fn"
    SDPA = "F.scaled_dot_product_attention"


@dataclass(frozen=True)
class InterceptionPlan:
    conventions: frozenset[Convention]
    reason: str = ""  # why the processor cannot be intercepted, when conventions is empty


def _call_function(processor: object):
    fn = getattr(type(processor), "__call__", None)
    return fn if isinstance(fn, types.FunctionType) else None


def _names_used(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:  # nested functions see the same (re-bound) globals
        if isinstance(const, types.CodeType):
            names |= _names_used(const)
    return names


def plan_interception(processor: object) -> InterceptionPlan:
    if isinstance(processor, torch.nn.Module):
        return InterceptionPlan(frozenset(), "processor holds weights (an nn.Module); left on the host path")
    fn = _call_function(processor)
    if fn is None:
        return InterceptionPlan(frozenset(), f"{type(processor).__name__}.__call__ is not a Python function")
    if not hasattr(processor, "__dict__"):
        return InterceptionPlan(frozenset(), f"{type(processor).__name__} has no instance dict to clone")
    names = _names_used(fn.__code__)
    conventions = set()
    if "dispatch_attention_fn" in names and "dispatch_attention_fn" in fn.__globals__:
        conventions.add(Convention.DISPATCH)
    if "scaled_dot_product_attention" in names and fn.__globals__.get("F") is F:
        conventions.add(Convention.SDPA)
    if not conventions:
        return InterceptionPlan(
            frozenset(),
            f"{type(processor).__name__}.__call__ calls neither dispatch_attention_fn nor "
            "F.scaled_dot_product_attention directly",
        )
    return InterceptionPlan(frozenset(conventions))


class _FunctionalView(types.ModuleType):
    """``torch.nn.functional`` as seen by one processor: everything real except SDPA."""

    def __init__(self, sdpa: Callable) -> None:
        super().__init__("torch.nn.functional")
        self.scaled_dot_product_attention = sdpa

    def __getattr__(self, name: str):
        return getattr(F, name)


def original_entry(processor: object, convention: Convention) -> Callable:
    """The function the host itself would call for ``convention`` (the host path)."""
    if convention is Convention.DISPATCH:
        return _call_function(processor).__globals__["dispatch_attention_fn"]
    return F.scaled_dot_product_attention


class AttachedCopyError(TypeError):
    """Copying or pickling a model (or a processor) that routes into an attached plan."""


_COPY_ADVICE = ("detach the plan (plan.detach()), copy, and attach a plan to each model: a copy would share the "
                "plan's routes, forward and hooks with the original")


def _refuse_pickle(self, *args):
    """A routed processor's ``__reduce_ex__``: its class holds the plan's routers, which no pickle can carry."""
    raise AttachedCopyError(f"ditgate: {type(self).__name__} routes into an attached plan and cannot be pickled "
                            f"(pickle, torch.save of a model with a plan attached); {_COPY_ADVICE}")


def _copy_unrouted(self):
    """A routed processor's ``__copy__``: a processor of the original class with the same attributes (what diffusers'
    ``ComponentsManager`` and ``copy.copy`` of the processors want: their settings, not the plan's routes)."""
    copied = object.__new__(type(self).__mro__[1])
    copied.__dict__.update(self.__dict__)
    return copied


def _deepcopy_unrouted(self, memo):
    """A routed processor's ``__deepcopy__``: as ``_copy_unrouted``, its attributes copied deeply. A model with a plan
    attached refuses a deep copy itself (``guard_copies``), so this serves copies of the processors alone."""
    copied = object.__new__(type(self).__mro__[1])
    memo[id(self)] = copied
    copied.__dict__.update(copy.deepcopy(self.__dict__, memo))
    return copied


def _refuse_deepcopy(self, memo=None):
    raise AttachedCopyError(f"ditgate: {type(self).__name__} has a plan attached and cannot be copied "
                            f"(copy.deepcopy); {_COPY_ADVICE}")


def guard_copies(model: torch.nn.Module) -> types.SimpleNamespace:
    """Refuse ``copy.deepcopy(model)`` while a plan is attached (its processors, forward and hooks route into the
    plan: a copy shared them with the original, calibrated the original's plan, or returned the original's output).
    An instance attribute, bound to this model; returns a handle whose ``remove()`` takes it off."""
    return types.SimpleNamespace(remove=bind_on(model, "__deepcopy__", _refuse_deepcopy))


def _routed_call(self, *args, **kwargs):
    """The routed clone's ``__call__``: a fresh invocation (call index 0), then the host's own code, re-bound."""
    cls = type(self)
    cls._ditgate_on_invocation()
    return cls._ditgate_rebound(self, *args, **kwargs)


def routed_processor(
    processor: object,
    entries: dict[Convention, Callable],
    on_invocation: Callable[[], None],
) -> object:
    """A clone of ``processor`` whose attention calls go to ``entries``.

    The clone is an instance of a fresh subclass of the processor's class (so ``isinstance`` checks
    and class attributes still hold), sharing the original's instance attribute dict. Its ``__call__``
    keeps the original signature (diffusers filters keyword arguments by it). What the call needs is held
    by the subclass, not by closures, so that torch.compile traces it (and guards on the subclass: a graph
    traced with the routes recompiles once the original processor is back).
    """
    fn = _call_function(processor)
    scoped = dict(fn.__globals__)
    # Without a module name the copy is what it is, a scope of its own: dynamo takes globals that carry one to be
    # that module's and would guard on the module's real ``dispatch_attention_fn`` instead of this scope's entry.
    if "__name__" not in _names_used(fn.__code__):
        scoped.pop("__name__", None)
    if Convention.DISPATCH in entries:
        scoped["dispatch_attention_fn"] = entries[Convention.DISPATCH]
    if Convention.SDPA in entries:
        scoped["F"] = _FunctionalView(entries[Convention.SDPA])
    rebound = types.FunctionType(fn.__code__, scoped, fn.__name__, fn.__defaults__, fn.__closure__)
    rebound.__kwdefaults__ = fn.__kwdefaults__
    call = types.FunctionType(_routed_call.__code__, _routed_call.__globals__, "__call__")
    functools.update_wrapper(call, fn)  # the original's name, docs and (through __wrapped__) signature

    cls = type(processor)
    routed_cls = type(cls.__name__, (cls,), {
        "__call__": call, "__module__": cls.__module__, "_ditgate_routed": True,
        "_ditgate_rebound": staticmethod(rebound), "_ditgate_on_invocation": staticmethod(on_invocation),
        "__copy__": _copy_unrouted, "__deepcopy__": _deepcopy_unrouted, "__reduce_ex__": _refuse_pickle})
    clone = object.__new__(routed_cls)
    # one attribute dict for both: what is set on the clone while attached (``enable_parallelism``'s
    # ``_parallel_config``, ``set_attention_backend``'s backend) is the original's after detach too
    clone.__dict__ = processor.__dict__
    return clone


def disarm(clone: object) -> None:
    """Make a routed clone (``routed_processor``) call its class's own ``__call__`` again, holding nothing of the
    plan: at detach, for a clone the caller kept (``saved = model.attn_processors`` while attached, then
    ``set_attn_processor(saved)`` after), which would otherwise route into a detached plan."""
    routed_cls = type(clone)
    if not routed_cls.__dict__.get("_ditgate_routed"):
        return
    for name in ("__call__", "_ditgate_rebound", "_ditgate_on_invocation", "__copy__", "__deepcopy__",
                 "__reduce_ex__"):
        if name in routed_cls.__dict__:
            delattr(routed_cls, name)
    routed_cls._ditgate_routed = False
    clone.__class__ = routed_cls.__mro__[1]  # the original class itself: a model holding it pickles again


def is_routed(processor: object) -> bool:
    return bool(getattr(type(processor), "_ditgate_routed", False))
