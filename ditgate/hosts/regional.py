"""Room in dynamo's recompile limit for regional compilation of an attached model.

diffusers' ``model.compile_repeated_blocks()`` compiles each block class once and expects every instance of it to
reuse that graph. An attached block's attention calls go through its own sites' routers, which its graph guards
on, so each instance compiles a graph of its own. Dynamo keeps at most ``recompile_limit`` graphs per code object
(8 by default): the ninth block of a 30-block Wan would run eagerly with a warning, or raise
``FailOnRecompileLimitHit`` under ``fullgraph=True`` (the setting diffusers' docs recommend). Attach raises the limit to
the graphs dynamo already caches for the blocks' code (an earlier plan's stay cached after its detach) plus twice the
largest count of one repeated block class plus a margin (room for every block to compile twice: a verdict that
changes, a second shape), and detach leaves it raised: the graphs compiled while attached stay in dynamo's cache and count against
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


def _cached_graphs(models: list[torch.nn.Module], names: set[str], limit: int) -> int:
    """The most graphs dynamo caches for the ``forward`` code of one of these block classes (what
    ``compile_repeated_blocks`` compiles). Where torch does not say (``_debug_get_cache_entry_list`` is a debugging
    API), as many as the limit allows already, so that the room is added on top of it."""
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    except ImportError:
        return limit
    codes = {type(m).forward.__code__ for model in models for m in model.modules() if type(m).__name__ in names}
    try:
        return max((len(_debug_get_cache_entry_list(code)) for code in codes), default=0)
    except Exception:  # its signature changed
        return limit


def make_room(models: list[torch.nn.Module]) -> tuple[int, int] | None:
    """Raise dynamo's recompile limits so that every repeated block of ``models`` may keep two graphs; the limits
    set, or None where they were high enough (or no model names repeated blocks)."""
    counts = repeated_block_counts(models)
    if not counts:
        return None
    config = torch._dynamo.config
    before = (config.recompile_limit, config.accumulated_recompile_limit)
    blocks = max(counts.values())
    # the graphs dynamo holds already for these blocks' code (an earlier plan's stay cached after its detach, and
    # count against the limit), and room for each block to compile twice more
    limit = _cached_graphs(models, set(counts), before[0]) + 2 * blocks + _MARGIN
    set_to = (max(before[0], limit), max(before[1], limit * len(counts)))
    if set_to == before:
        return None
    config.recompile_limit, config.accumulated_recompile_limit = set_to
    logger.info("ditgate: torch._dynamo.config.recompile_limit %d -> %d (regional compilation compiles each of the "
                "%d %s blocks apart)", before[0], set_to[0], max(counts.values()), counts.most_common(1)[0][0])
    return set_to
