"""Device buffers a form keeps between calls, shared by every site of a plan that calls it at one shape."""

from __future__ import annotations

import torch

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
