"""Room in dynamo's recompile limit for regional compilation of an attached model.

diffusers' ``model.compile_repeated_blocks()`` compiles each block class once and expects every instance of it to
reuse that graph. An attached block's attention calls go through its own sites' routers, which its graph guards
on, so each instance compiles a graph of its own. Dynamo keeps at most ``recompile_limit`` graphs per code object
(8 by default): the ninth block of a 30-block Wan would run eagerly with a warning, or raise
``FailOnRecompileLimitHit`` under ``fullgraph=True`` (the setting diffusers' docs recommend). Attach raises the limit to
twice the largest count of one repeated block class plus a margin (room for every block to recompile once when a
verdict changes), or, where an earlier plan raised it already, by one graph per block more (that plan's graphs stay
cached), and detach leaves it raised: the graphs compiled while attached stay in dynamo's cache and count against
it, so putting it back would make the detached blocks' own recompiles fail. The limit is only ever raised.
Regional compilation of an attached model therefore compiles every block apart: its compile time is that of the
whole model's, not of one block's.
"""

from __future__ import annotations

import logging
from collections import Counter

import torch

logger = logging.getLogger("ditgate")

_MARGIN = 8  # graphs the limit keeps beyond the blocks' own, for whatever else compiles that code


def repeated_block_counts(models: list[torch.nn.Module]) -> Counter:
    """Instances per class name of each model's ``_repeated_blocks`` (what ``compile_repeated_blocks`` compiles)."""
    counts: Counter = Counter()
    for model in models:
        names = set(getattr(model, "_repeated_blocks", None) or ())
        if names:
            counts.update(type(m).__name__ for m in model.modules() if type(m).__name__ in names)
    return counts


def make_room(models: list[torch.nn.Module]) -> tuple[int, int] | None:
    """Raise dynamo's recompile limits so that every repeated block of ``models`` may keep two graphs; the limits
    set, or None where they were high enough (or no model names repeated blocks)."""
    counts = repeated_block_counts(models)
    if not counts:
        return None
    config = torch._dynamo.config
    before = (config.recompile_limit, config.accumulated_recompile_limit)
    blocks = max(counts.values())
    needed = 2 * blocks + _MARGIN
    # a limit an earlier plan raised already holds that plan's graphs, which stay in dynamo's cache after its
    # detach: one graph more per block for this plan's routes (the blocks' code is shared by every plan and model)
    limit = before[0] + blocks if before[0] >= needed else needed
    set_to = (limit, max(before[1], limit * len(counts)))
    if set_to == before:
        return None
    config.recompile_limit, config.accumulated_recompile_limit = set_to
    logger.info("ditgate: torch._dynamo.config.recompile_limit %d -> %d (regional compilation compiles each of the "
                "%d %s blocks apart)", before[0], set_to[0], max(counts.values()), counts.most_common(1)[0][0])
    return set_to
