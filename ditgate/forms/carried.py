"""What a form keeps per site to quantize in one read at the statistics the site's previous call left.

fa3_fp8 (``kernels.fp8_heads_carried``) and ditgate's own 8-bit forms (``kernels.quant_passes_carried``) both make
a site's first call at a shape in two passes, which leave the statistics, and each later call in one pass at the
last call's statistics, which leaves its own for the next; a statistic that did not hold is repaired on the device
and counted. This keeps, per (site, query shape, key shape, device), the two buffers those calls alternate between
(from the form's workspace pool) and which one holds the last call's statistics, and a repair counter per device.

A call without a site (a benchmark's, the context-parallel path's) takes two passes and keeps nothing. A dry call
(``kernels.launches.recording``, compiling ahead) records both paths' launches on scratch buffers: its torch
operations run, so it must not touch the site's own statistics.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .base import AttentionInputs
from .workspace import WorkspacePool

# first(into): a quantize function that makes the copies in two passes and leaves the statistics in ``into``;
# carried(last, into, repaired): one that makes them in one pass at ``last``'s statistics, leaving its own in ``into``
# and counting repairs in ``repaired``
First = Callable[[torch.Tensor], Callable]
Carried = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Callable]


class CarriedStatistics:
    """Per-site statistics buffers of ``size(q, k)`` elements of ``dtype``, named ``{prefix}:carried:...`` in the pool."""

    def __init__(self, prefix: str, size: Callable[[torch.Tensor, torch.Tensor], int], dtype: torch.dtype) -> None:
        self._prefix, self._size, self._dtype = prefix, size, dtype
        self._last: dict[tuple, int] = {}  # key -> which of its two buffers holds the last call's statistics
        self._buffers: dict[tuple, list[torch.Tensor]] = {}  # key -> its two buffers (the pool's)
        self._repaired: dict[str, torch.Tensor] = {}  # device -> heads repaired there (int32 on that device)

    def quantizer(self, pool: WorkspacePool, inputs: AttentionInputs, first: First, carried: Carried,
                  dry: bool) -> Callable:
        """The quantize function for this call (module docstring). The site's buffers change hands only once the
        call's quantization has returned, so a call that raised leaves the site where it was."""
        q, k = inputs.query, inputs.key
        repaired = self.counter(q.device)
        if dry:
            scratch = [torch.empty(self._size(q, k), dtype=self._dtype, device=q.device) for _ in range(2)]
            two_passes, one_pass = first(scratch[0]), carried(scratch[0], scratch[1], repaired)

            def both(*args, **kwargs):
                two_passes(*args, **kwargs)
                return one_pass(*args, **kwargs)
            return both
        key, buffers = self.site_buffers(pool, inputs)
        last = self._last.get(key)
        quantize = first(buffers[0]) if last is None else carried(buffers[last], buffers[1 - last], repaired)
        after = 0 if last is None else 1 - last

        def call(*args, **kwargs):
            copies = quantize(*args, **kwargs)
            self._last[key] = after
            return copies
        return call

    def site_buffers(self, pool: WorkspacePool, inputs: AttentionInputs) -> tuple[tuple, list[torch.Tensor]]:
        """The key of a site's statistics at this call's shapes and its two buffers (the pool's, one pair per key:
        two shapes whose buffers would be the same size, such as cond and uncond calls with keys cut to their own
        prompts' lengths, must not read each other's)."""
        q, k = inputs.query, inputs.key
        key = (inputs.site, q.shape, k.shape, q.device)
        buffers = self._buffers.get(key)
        if buffers is None:
            size = self._size(q, k)
            name = f"{self._prefix}:carried:{inputs.site}:{tuple(q.shape)}:{tuple(k.shape)}"
            buffers = self._buffers[key] = [pool.get((size,), self._dtype, q.device, f"{name}:{i}") for i in (0, 1)]
        return key, buffers

    def kept(self) -> int:
        """How many (site, shapes, device) keys hold a last call's statistics."""
        return len(self._last)

    def counter(self, device: torch.device) -> torch.Tensor:
        counter = self._repaired.get(str(device))
        if counter is None:
            counter = self._repaired[str(device)] = torch.zeros(1, dtype=torch.int32, device=device)
        return counter

    def repaired_heads(self) -> int:
        """Heads quantized again since these statistics were made or cleared, because what the site's previous call
        left did not hold (reads the device's counters: synchronises)."""
        return sum(int(counter.item()) for counter in self._repaired.values())

    def clear(self) -> None:
        self._last.clear()
        self._buffers.clear()
        self._repaired.clear()
