"""Memory accounting: the peak a form adds during a call, and what it keeps resident afterwards.

Workspaces (quantized copies, index lists) live in a ``WorkspacePool`` owned by the plan, keyed by
(shape, dtype, device, variant), so that every site of one shape shares one set and pooled storage
is counted once. Forms that lost the gate everywhere are released and hold nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


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


WorkspaceKey = tuple[tuple[int, ...], torch.dtype, str, str]


class WorkspacePool:
    """Buffers shared by all sites of a plan; one per (shape, dtype, device, variant)."""

    def __init__(self) -> None:
        self._buffers: dict[WorkspaceKey, torch.Tensor] = {}

    def get(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, variant: str) -> torch.Tensor:
        key = (tuple(shape), dtype, str(device), variant)
        buf = self._buffers.get(key)
        if buf is None:
            buf = torch.empty(shape, dtype=dtype, device=device)
            self._buffers[key] = buf
        return buf

    def bytes(self, variant_prefix: str = "") -> int:
        seen, total = set(), 0
        for (_, _, _, variant), buf in self._buffers.items():
            if not variant.startswith(variant_prefix):
                continue
            ptr = buf.untyped_storage().data_ptr()
            if ptr not in seen:
                seen.add(ptr)
                total += buf.untyped_storage().nbytes()
        return total

    def release(self, variant_prefix: str = "") -> None:
        for key in [k for k in self._buffers if k[3].startswith(variant_prefix)]:
            del self._buffers[key]
