"""An arena pool's attributes and statistics (``cudaMemPoolGetAttribute``, ``stats()``), read
from its state (arena_pool.py) under its lock; reading never changes the pool."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .attrs import OPTIONS, MemPoolAttr
from .block import merged_dirty, settled_runs

if TYPE_CHECKING:
    from .arena_pool import ArenaPool

# the step counters of DESIGN.md §3 and the rest ``stats()`` counts (every key documented there)
COUNTERS = ("alloc_count", "free_count", "reuse_same_stream", "reuse_after_sync",
            "reuse_event_dependency", "reuse_opportunistic", "reuse_merged", "fresh_count",
            "grow_count", "reuse_internal_dependency", "oom_count", "release_count")


def attr_of(pool: ArenaPool, attr: MemPoolAttr) -> int:
    """The value of a parsed attribute: flags as 0/1, sizes in bytes."""
    if attr in OPTIONS:  # the reuse flags and the release threshold
        return int(getattr(pool._opts, OPTIONS[attr]))
    return {
        MemPoolAttr.RESERVED_MEM_CURRENT: pool._arena.reserved,
        MemPoolAttr.RESERVED_MEM_HIGH: pool._arena.reserved_high,
        MemPoolAttr.USED_MEM_CURRENT: pool._used,
        MemPoolAttr.USED_MEM_HIGH: pool._used_high,
    }[attr]


def stats_of(pool: ArenaPool) -> dict[str, Any]:
    """``stats()``: the attributes, the counters of the reuse steps, and what the free lists
    hold (the caller holds the lock)."""
    out = {a.name.lower(): attr_of(pool, a) for a in MemPoolAttr}
    out.update(pool._stats)
    out["alloc_count"] += pool._fast_allocs  # the fast paths count apart (see ArenaPool)
    out["reuse_same_stream"] += pool._fast_allocs
    out["free_count"] += pool._fast_frees
    # the deferred merges counted, not made: reading statistics must not change which block a
    # later allocation gets (the fast path takes unmerged exact-size blocks)
    arena, blocks, dirty = pool._arena, pool._blocks, pool._dirty
    out["largest_free_block"] = (
        arena.largest_mapped(settled_runs(blocks, dirty)) if arena.holes else max(
            [pool._ready.largest(), *(size for _, size in merged_dirty(blocks, dirty)[0]),
             *(fl.largest() for fl in pool._pending.values())]))
    out["live_allocations"] = out["alloc_count"] - out["free_count"] - pool._gone
    out["chunks"] = len(arena.mapped)  # mapped granules
    return out
