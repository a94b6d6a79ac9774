"""What a synchronize, ``trim_to``, ``destroy`` and a device reset do to an arena pool
(DESIGN.md §3): functions over an :class:`~streamrt.pool.arena_pool.ArenaPool`'s state.

A synchronize promotes the frees it proved (each pending list pops what lies at or below the
freeing stream's host position: O(log n) per block proven, nothing for the others), then, above
the release threshold, unmaps the granules lying wholly inside ready blocks of a granule or
more (the ready list's ``big``, not every free block). ``trim_to`` releases down to its
argument whatever the threshold; ``destroy`` releases everything it can and gives the arena
back once nothing is live or pending; a device reset forgets everything (the backend freed it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import instrument
from .block import coalesce
from .freelist import ReadyList
from .registry import _busy, _owners

if TYPE_CHECKING:
    from .arena_pool import ArenaPool

__all__ = ["destroy", "on_sync", "reset", "trim"]


def on_sync(pool: ArenaPool) -> None:
    """Promote the frees a host synchronize proved, then apply the release threshold."""
    arena = pool._arena
    if not (pool._pending or pool._destroyed
            or arena.reserved - arena.granule >= pool._opts.release_threshold):
        return  # nothing to promote or release (read without the lock: a hint)
    with pool._lock:
        if pool._dirty:
            pool._settle()
        for sid in list(pool._pending):
            fl = pool._pending[sid]
            for b in fl.proven(pool._pstream[sid]._host):
                b.stream = None
                pool._insert_free(coalesce(pool._blocks, b))
            if not fl.count:
                del pool._pending[sid], pool._pstream[sid]
                pool._seams.pop(sid, None)
        if not pool._pending:
            _busy.discard(pool)
        pool._release(0 if pool._destroyed else pool._opts.release_threshold)


def trim(pool: ArenaPool, keep: int) -> None:
    """``trim_to(keep)`` of a live pool."""
    with pool._lock:
        if pool._dirty:
            pool._settle()
        pool._release(keep)
    if instrument.listeners:  # the trace's reserved counter
        instrument.notify("freed", None, pool)


def destroy(pool: ArenaPool) -> None:
    """``destroy()``: release what is free; the arena goes once nothing is live or pending."""
    with pool._lock:
        pool._destroyed = True
        pool.device._forget_pool(pool)
        pool._settle()
        pool._release(0)
        if pool._arena.base and _idle(pool):
            _drop_arena(pool)
    if instrument.listeners:
        instrument.notify("freed", None, pool)


def destroyed_free(pool: ArenaPool) -> None:
    """A block of a destroyed pool was freed (the lock held): release, and give the arena
    back once nothing is live or pending."""
    pool._release(0)
    if _idle(pool):
        _drop_arena(pool)


def _idle(pool: ArenaPool) -> bool:
    """No live block and no free still pending on a stream: the arena can go."""
    st = pool._stats
    live = st["alloc_count"] + pool._fast_allocs - st["free_count"] - pool._fast_frees
    return not live and not any(fl.count for fl in pool._pending.values())


def _drop_arena(pool: ArenaPool) -> None:
    """A destroyed pool with nothing left: give its address range back."""
    pool._arena.drop()
    pool._blocks.clear()
    pool._ready = ReadyList(pool._arena.granule)
    pool._seams.clear()


def reset(pool: ArenaPool) -> None:
    """Device reset: the backend released the arena; forget every block."""
    with pool._lock:
        for b in pool._blocks.values():
            if b.live:
                _owners.pop(b.addr, None)
                pool._gone += 1
        pool._arena.forget()
        pool._blocks.clear()
        pool._dirty.clear()
        pool._ready = ReadyList(pool._arena.granule)
        pool._pending.clear()
        pool._pstream.clear()
        pool._seams.clear()
        _busy.discard(pool)
        pool._used = 0
        pool._destroyed = True
