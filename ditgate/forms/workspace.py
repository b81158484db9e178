"""Device buffers a form keeps between calls, shared by every site of a plan that calls it at one shape."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch

WorkspaceKey = tuple[tuple[int, ...], torch.dtype, str, str]


class WorkspacePool:
    """Buffers shared by all sites of a plan; one per (shape, dtype, device, variant)."""

    def __init__(self) -> None:
        self._buffers: dict[WorkspaceKey, torch.Tensor] = {}
        self._kept: dict[Hashable, Any] = {}

    def get(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, variant: str) -> torch.Tensor:
        key = (tuple(shape), dtype, str(device), variant)
        buf = self._buffers.get(key)
        if buf is None:
            buf = torch.empty(shape, dtype=dtype, device=device)
            self._buffers[key] = buf
        return buf

    def memo(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """``make()``'s value, made once per ``key`` while these buffers live: host-side objects built over them
        (a kernel's tensor descriptors, a constant tile), which would otherwise be remade on every call. The key
        must name everything the value depends on (an address, a shape, strides); ``release`` drops them all,
        since they may hold the buffers it frees."""
        value = self._kept.get(key)
        if value is None:
            value = self._kept[key] = make()
        return value

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
        self._kept.clear()
        for key in [k for k in self._buffers if k[3].startswith(variant_prefix)]:
            del self._buffers[key]
