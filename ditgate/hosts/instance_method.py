"""A function bound to one object as an instance attribute, and taken off again: how a plan changes what one model's
or pipeline's own methods do while it is attached (a cast, a copy) and nothing else's.

A method object (``types.MethodType``) rather than a closure: a copy of the object (``copy.deepcopy`` copies a bound
method by binding its function to the copy) gets the function bound to itself, never to the original.
"""

from __future__ import annotations

import types
from collections.abc import Callable


def bind_on(obj: object, name: str, function: Callable) -> Callable[[], None]:
    """``function`` bound to ``obj`` as its instance attribute ``name``; returns the way to take it off, which leaves
    whatever replaced it meanwhile in place. An object with its own ``name`` on the instance already is left as it
    is (and the way back does nothing)."""
    if name in vars(obj):
        return lambda: None
    setattr(obj, name, types.MethodType(function, obj))

    def remove() -> None:
        bound = vars(obj).get(name)
        if isinstance(bound, types.MethodType) and bound.__func__ is function:
            del vars(obj)[name]

    return remove
