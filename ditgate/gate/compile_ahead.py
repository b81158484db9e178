"""The kernels of a contest's new entrants, compiled all at once before their first calls.

Why: in a fresh process a form's first call is mostly Triton compiles, and they come one after another: a form's
quantization passes, then its attention kernel, then the next form's. Running first calls in threads (``warm``)
overlaps forms, not the kernels inside one form, and on an H100 the speed profile's first calls at Wan 1.3B's key
still took about 8 s that way, most of them in compiles. Here each entrant's first call is made once with Triton's
launches recorded instead of run (``kernels.launches``: a dry call; torch's own operations still run, so every
launch sees the shapes, strides and dtypes it will see), and every recorded launch is then compiled in a pool of
threads through Triton's ``AsyncCompileMode`` (its front end, its passes and ptxas, which release the GIL for most of
their time). The contest's own first calls then find their kernels compiled.

Only forms that opt in (``Form.compiles_ahead``): in a dry call Triton's kernels write nothing, so a form whose
Python read a value its own kernels made (a count, a flag), or whose torch operations index by one (a scatter by a
kernel's list of blocks), would act on whatever the memory held. ditgate's 8-bit forms (their block lists come from
the layout), sage's and fa3_fp8's quantization, and the Triton linear forms do neither. The recorded launches keep
their argument tensors alive until the step ends: one first call's worth of memory per form that opted in. A dry
call that raises leaves its form to its ordinary first call; a kernel that fails to compile here is compiled again
by that call, which raises there.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from . import warm
from .warm import WarmCall

MAX_WORKERS = 16


@dataclass(frozen=True)
class CompiledAhead:
    """What one compile-ahead step did: the forms whose dry call went through (their kernels then compiled or
    already known), the launches it compiled, the dry calls that raised (name -> why), and its wall time."""

    names: tuple[str, ...] = ()
    launches: int = 0
    raised: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


def unavailable_reason() -> str:
    """Why compiling ahead cannot work here and now ("" where it can): Triton missing, too old to compile
    asynchronously (``triton.runtime._async_compile``, Triton 3.4 and later), or a caller's own ``AsyncCompileMode``
    already active in this context (Inductor's, say), which Triton does not let a second one join."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    try:
        from triton.runtime._async_compile import active_mode
    except ImportError:
        return "this Triton cannot compile asynchronously (3.4 or later can)"
    if active_mode.get() is not None:
        return "another AsyncCompileMode is active in this context"
    return ""


def compile_launches(launches: Sequence, workers: int) -> int:
    """Compile every launch in ``launches`` (``kernels.launches.Launch``) for the current device, ``workers`` at a
    time, without running any; returns how many went to the compiler. Launches of one kernel with one
    specialization compile once (Triton's own cache key), and those compiled before load from memory. A compile that
    fails is left out: the launch compiles again when it runs, and raises there. A kernel with ``triton.autotune``
    would compile here with whatever configuration its arguments name, not the tuned one; no form that opts in has
    one."""
    from triton.runtime._async_compile import AsyncCompileMode

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="ditgate-compile") as pool:
        with AsyncCompileMode(pool, ignore_errors=True) as mode:
            for launch in launches:
                try:
                    launch.kernel.warmup(*launch.args, grid=(1,), **launch.kwargs)
                except Exception:  # its own launch says why, in the contest
                    continue
            submitted = len(mode.raw_futures)
    return submitted


def compile_ahead(calls: Sequence[WarmCall], device: torch.device, workers: int | None = None) -> CompiledAhead:
    """Each call once with its Triton launches recorded (one after another, in this thread), then all their kernels
    compiled side by side (``workers`` threads; default: the machine's cores, at most ``MAX_WORKERS``). Nothing on a
    device where first calls are not made ahead (``warm.allowed_on``), or where this Triton cannot."""
    if not calls or not warm.allowed_on(device) or unavailable_reason():
        return CompiledAhead()
    from ..kernels.launches import recorded_launches

    started = time.perf_counter()
    names: list[str] = []
    raised: dict[str, str] = {}
    launches: list = []
    on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with on_device, torch.no_grad():
        for call in calls:
            with recorded_launches() as mine:
                try:
                    call.run()
                except Exception as exc:
                    raised[call.name] = f"{type(exc).__name__}: {exc}"[:300]
                    continue
            names.append(call.name)
            launches += mine
        try:
            compiled = compile_launches(launches, workers or min(MAX_WORKERS, os.cpu_count() or 1)) if launches else 0
        except Exception as exc:  # the pool itself failed: every form compiles at its own first call, as without this
            why = f"compiling ahead: {type(exc).__name__}: {exc}"[:300]
            return CompiledAhead((), 0, {**raised, **{name: why for name in names}}, time.perf_counter() - started)
    return CompiledAhead(tuple(names), compiled, raised, time.perf_counter() - started)
