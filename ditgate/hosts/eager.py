"""Running a denoiser eagerly where torch.compile holds it: for the forwards that measure.

Measuring needs real tensors and real time, so it never happens inside a compiled graph. While a plan measures
on a model's forwards it puts an ``EagerForward`` on that model: the model's ``forward`` (an instance attribute,
so only this model is touched) becomes a function that dynamo skips (a graph break, there only while measuring),
and while it runs, the model's own modules compiled in place (``module.compile()``, diffusers'
``compile_repeated_blocks``) run their original code. Compiled callables of ditgate's forms stay compiled: they
are measured as they will serve. Once the plan is done, it removes the ``EagerForward``; a compiled wrapper's
guard on ``forward`` then fails once and it recompiles with the plan's routes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch

Around = Callable[[tuple, dict, Callable[[], object]], object]


@contextlib.contextmanager
def uncompiled(model: torch.nn.Module) -> Iterator[None]:
    """While open, modules of ``model`` compiled in place call their original ``_call_impl``."""
    compiled = [(m, m._compiled_call_impl) for m in model.modules()
                if getattr(m, "_compiled_call_impl", None) is not None]
    for m, _ in compiled:
        m._compiled_call_impl = None
    try:
        yield
    finally:
        for m, fn in compiled:
            m._compiled_call_impl = fn


_ASIDE = "_ditgate_set_aside"  # the model's record of what its EagerForwards set aside: {(holder, name): [held, n]}


def _aside_record(model: torch.nn.Module) -> dict:
    return model.__dict__.get(_ASIDE, {})


def _same(held: object, stand_in: object) -> bool:
    """Whether ``held`` is still the stand-in (a bound method is made anew at each access: compared by equality)."""
    return held is stand_in or (stand_in is not None and held == stand_in)


def _set_aside(model: torch.nn.Module, holder: object, name: str, stand_in: object) -> tuple[object, str, object]:
    """Put ``stand_in`` in ``holder.name`` (the model's compiled call, a wrapper's compiled forward) and remember what
    was there, once for every EagerForward on ``model``: one stacked on another counts itself in and never records the
    first one's stand-in as the original."""
    record = model.__dict__.setdefault(_ASIDE, {})
    key = (holder, name)
    if key in record:
        record[key][1] += 1
    else:
        record[key] = [holder.__dict__[name], 1]
        holder.__dict__[name] = stand_in
    return holder, name, stand_in


def _put_back(model: torch.nn.Module, holder: object, name: str, stand_in: object) -> None:
    """``holder.name`` back as it was when the last EagerForward on ``model`` that set it aside goes, unless something
    replaced the stand-in meanwhile (a wrapper's forward the caller set while the plan measured: theirs is kept)."""
    record = _aside_record(model)
    entry = record.get((holder, name))
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] == 0:
        if _same(holder.__dict__.get(name), stand_in):
            holder.__dict__[name] = entry[0]
        del record[(holder, name)]
        if not record:
            del model.__dict__[_ASIDE]


class EagerForward:
    """Until ``remove()``, ``model``'s forward runs outside any compiled graph, as ``around(args, kwargs, run)``,
    ``run`` being the forward it replaced. Several may be stacked on one model; each removes only itself.

    Where the model itself is compiled (``model.compile()``, its ``_compiled_call_impl``) or ``wrappers`` (the
    ``torch.compile(model)`` wrappers the caller holds) wrap it, their compiled calls are set aside too while it is
    on, so that the model is called eagerly from the start: under ``fullgraph=True`` a compiled call whose frame is
    this disabled forward compiles nothing, which torch refuses ("found no compiled frames")."""

    def __init__(self, model: torch.nn.Module, around: Around, wrappers: Sequence[torch.nn.Module] = ()) -> None:
        self.model = model
        self._had = "forward" in model.__dict__
        self._previous = model.__dict__.get("forward")
        self.removed = False
        real = model.forward
        # the compiled calls this one set aside (or counted itself in, where another had): (holder, name, stand-in)
        self._aside: list[tuple[object, str, object]] = []
        if getattr(model, "_compiled_call_impl", None) is not None or (model, "_compiled_call_impl") in _aside_record(model):
            self._aside.append(_set_aside(model, model, "_compiled_call_impl", None))
        for wrapper in wrappers:
            if callable(wrapper.__dict__.get("forward")) or (wrapper, "forward") in _aside_record(model):
                self._aside.append(_set_aside(model, wrapper, "forward", model.__call__))  # its call, eagerly

        @torch.compiler.disable
        def measuring(args, kwargs):
            with uncompiled(model):
                return around(args, kwargs, lambda: real(*args, **kwargs))

        def forward(*args, **kwargs):
            # removed beneath a later one, or left in a hook chain that outlives it (a diffusers hook registered after
            # attach puts this forward back when it goes): a plain pass-through, which dynamo traces
            if self.removed:
                return real(*args, **kwargs)
            return measuring(args, kwargs)  # outside any graph

        forward._ditgate_eager = self
        self._forward = forward
        model.forward = forward

    def remove(self) -> None:
        self.removed = True
        for holder, name, stand_in in reversed(self._aside):  # the compiled calls back, as the last one goes
            _put_back(self.model, holder, name, stand_in)
        self._aside.clear()
        if self.model.__dict__.get("forward") is not self._forward:
            return  # a later one sits on top: it skips this one when it goes
        had, previous = self._had, self._previous
        while had and getattr(previous, "_ditgate_eager", None) is not None and previous._ditgate_eager.removed:
            below = previous._ditgate_eager
            had, previous = below._had, below._previous
        if had:
            self.model.forward = previous
        else:
            del self.model.forward
