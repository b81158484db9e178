"""The first calls of a contest's new entrants, run side by side in threads before the contest measures anything.

Why: in a fresh process a form's first call at a shape key is mostly kernel compiles (Triton's front end and ptxas,
which release the GIL), and the contest made those calls one form after another: on an H100 the speed profile's
first calls at Wan 1.3B's key took 11.8 s (fp8), 9.2 (int8), 3.7 (fa3_fp8), 2.8 (sage) in a row. Every entrant that
the book knows nothing of is run at least once by the contest anyway (its accuracy sample), so running those first
calls at once costs no extra work; it only overlaps their compiles. What follows is measured as before, on warm
forms, one at a time: nothing timed runs beside anything else.

Only on CUDA: Triton's CPU interpreter swaps module-wide functions while a kernel runs, so two interpreted kernels in
two threads would see each other's. And only forms that opt in (``Form.warms_in_thread``): ditgate's Triton forms and
sage. On an H100 two others broke in threads: fa3-fwd's kernels failed with an illegal instruction (TMA descriptor
715), and torch's SDPA forms, which pin their backend through the process-wide flags of ``sdpa_kernel``, left those
flags changed when two threads restored them out of order (the host then ran memory-efficient attention, 1.75x
slower at Wan's cross-attention).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

MAX_THREADS = 8
WARM_DEVICE_TYPES = ("cuda",)  # where first calls are made ahead in threads (tests add "cpu" for torch-only forms)


@dataclass(frozen=True)
class WarmCall:
    """One entrant's first call to make ahead: its name and the call (on the site's live input)."""

    name: str
    run: Callable[[], torch.Tensor]


def _first_call(call: WarmCall, device: torch.device, stream) -> tuple[str, float, str]:
    """One first call in a worker thread: (name, milliseconds, why it raised or ""). On the caller's CUDA stream,
    since a thread starts on the default stream: the inputs were written on the caller's, and workspaces first
    allocated here are used there afterwards."""
    started = time.perf_counter()
    try:
        if device.type == "cuda":
            with torch.cuda.device(device), torch.cuda.stream(stream), torch.no_grad():
                call.run()
                torch.cuda.synchronize(device)
        else:
            with torch.no_grad():
                call.run()
    except Exception as exc:  # the contest's own call of it says why, and refuses it there
        return call.name, (time.perf_counter() - started) * 1e3, f"{type(exc).__name__}: {exc}"
    return call.name, (time.perf_counter() - started) * 1e3, ""


def allowed_on(device: torch.device) -> bool:
    """Whether first calls may run in threads on ``device``: a device type in ``WARM_DEVICE_TYPES`` and no Triton
    interpreter (``TRITON_INTERPRET=1`` on a CUDA machine runs the kernels in Python too)."""
    return device.type in WARM_DEVICE_TYPES and os.environ.get("TRITON_INTERPRET") != "1"


def warm_ahead(calls: Sequence[WarmCall], device: torch.device) -> dict[str, float]:
    """Each call once, all at the same time (one thread each, at most ``MAX_THREADS``): name -> milliseconds its
    first call took, overlapped with the others'. Raising calls are left out (the contest runs them again and
    refuses them with the reason). Nothing is returned for fewer than two calls: there is nothing to overlap."""
    if len(calls) < 2:
        return {}
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    with ThreadPoolExecutor(max_workers=min(MAX_THREADS, len(calls)), thread_name_prefix="ditgate-warm") as pool:
        done = list(pool.map(lambda c: _first_call(c, device, stream), calls))
    return {name: ms for name, ms, error in done if not error}
