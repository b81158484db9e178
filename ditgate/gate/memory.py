"""Memory accounting: the peak a form adds during a call, and what it keeps resident afterwards.

Workspaces (quantized copies, index lists) live in a ``WorkspacePool`` held by each form instance (one
per plan), keyed by (shape, dtype, device, variant), so that every site of one shape shares one set and
pooled storage is counted once. Forms that lost the gate everywhere are released and hold nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..forms.workspace import WorkspacePool  # noqa: F401  (re-exported: forms own their pools)


@dataclass(frozen=True)
class MemoryUse:
    peak_bytes: int  # above what was allocated before the call (outputs included); 0 off-GPU
    resident_bytes: int  # still held by the form after the call (its workspaces)


def measure_memory(fn: Callable[[], object], device: torch.device, resident: Callable[[], int]) -> MemoryUse:
    """Run ``fn`` once and account its memory. On CUDA this resets the device's peak statistic."""
    before_resident = resident()
    if device.type != "cuda":
        fn()
        return MemoryUse(0, resident() - before_resident)
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del out
    return MemoryUse(int(peak), int(resident() - before_resident))
