"""The reuse decision of DESIGN.md §3, as functions over an arena pool's state (its lock held).

``s.malloc(n)`` on stream A takes, in order (each counted in ``stats()``): 1. a block freed on
A; 2. a ready block (its free proven by a host synchronize); 3. (event dependencies) a block
freed on F at p with ``clock[A][F] >= p``; 4. (opportunistic) one whose free F has already
executed (``done[F] >= p``); then, before growing, a run of adjacent blocks that are ready or
pending on A, merged if it fits (``reuse_merged``); 5. growth; 6. (internal dependencies) any
pending block, after enqueueing a wait of A on F at p; 7. ``OutOfMemoryError``. Within a step,
best fit wins (the closest size, the oldest free block among equals); a block whose unmapped
granules cannot be mapped under ``max_size`` is skipped. The flags switch off steps 3, 4 and 6.
Memory a synchronize released went back to the device, and mapping it again grows what the pool
reserves: steps 1-4 are tried first on blocks where the allocation lands on mapped memory, then
on the rest.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import OutOfMemoryError
from ..sync import ran
from .arena import ALIGN
from .block import Block, coalesce

if TYPE_CHECKING:
    from ..stream import Stream
    from .arena import Arena
    from .arena_pool import ArenaPool


def find(pool: ArenaPool, a: Stream, size: int, requested: int) -> tuple[Block, str]:
    """The free block ``a`` may take for ``size`` bytes (taken off its free list) and the counter
    of the step that found it, by the first step that has one; raises
    :class:`OutOfMemoryError` when none has. Counters move only once the caller succeeded.

    Memory a synchronize released went back to the device (``arena.holes``): taking it again
    maps it, as growth does, so steps 1-4 look first at blocks where the allocation lands on
    mapped memory, and only then at those where it would map some."""
    opts, arena = pool._opts, pool._arena
    others = [(sid, fl) for sid, fl in pool._pending.items() if sid != a.id and fl.count]
    ok: Callable[[Block], bool] | None = None
    found = None
    if arena.holes:
        found = _reuse(pool, a, size, others, lambda blk: arena.lands_mapped(blk, size))
        ok = functools.partial(_mappable, arena, size)
    if found is None:
        found = _reuse(pool, a, size, others, ok)
    if found is not None:
        return found
    b = _merge_for(pool, a, size)
    if b is not None:
        return b, "reuse_merged"
    b = _grow(pool, a, size)
    if b is not None:
        return b, "grow_count"
    if others and opts.reuse_allow_internal_dependencies:
        b = _best_of(others, size, None, ok)
        if b is not None:
            f = b.stream
            assert f is not None
            # a real wait: later work on A follows the free (and what the free followed)
            a._order_after(f, b.pos, b.clock or {f.id: b.pos}, "pool reuse")
            return b, "reuse_internal_dependency"
    raise oom(pool, requested, size, a)


def _mappable(arena: Arena, size: int, blk: Block) -> bool:
    return arena.mappable(blk, size)


def _reuse(pool: ArenaPool, a: Stream, size: int, others: list,
           ok: Callable[[Block], bool] | None) -> tuple[Block, str] | None:
    """Steps 1-4 over the blocks ``ok`` accepts (None: all): the block and its counter, or None."""
    opts = pool._opts
    own = pool._pending.get(a.id)
    if own is not None:
        b = own.take(size, ok)
        if b is not None:
            return b, "reuse_same_stream"
    b = pool._ready.take(size, ok)
    if b is not None:  # (never used: not a reuse)
        return b, "fresh_count" if b.fresh else "reuse_after_sync"
    if others and opts.reuse_follow_event_dependencies:
        clock = a._clock
        b = _best_of(others, size, lambda sid: clock.get(sid, 0), ok)
        if b is not None:
            return b, "reuse_event_dependency"
    if others and opts.reuse_allow_opportunistic:
        b = _best_of(others, size, lambda sid: ran(pool._pstream[sid]), ok)
        if b is not None:
            return b, "reuse_opportunistic"
    return None


def oom(pool: ArenaPool, requested: int, size: int, a: Stream) -> OutOfMemoryError:
    """The error of a failed allocation by ``a`` (counted in ``oom_count``); it says how many
    bytes other streams freed that are not yet reusable by ``a`` (a synchronize proves them)."""
    pool._stats["oom_count"] += 1
    limit = f"max_size {pool.max_size}" if pool.max_size else "no pool limit"
    free, total = pool.device.memory_info()
    pending = [fl for sid, fl in pool._pending.items() if sid != a.id and fl.count]
    held = sum(b.size for fl in pending for b in fl.blocks())
    note = (f"; {held} bytes are freed on streams but not yet reusable by {a!r}: synchronize "
            "(the streams that freed them, or the device) and allocate again, or free memory on "
            "the stream that reuses it") if held else ""
    return OutOfMemoryError(
        f"{pool.device.name}: stream-ordered allocation of {requested} bytes ({size} after "
        f"rounding to {ALIGN}) failed: pool reserves "
        f"{pool._arena.reserved} bytes ({pool._used} used), {limit}; device has {free} of "
        f"{total} bytes free{note}"
    )


def _grow(pool: ArenaPool, a: Stream, size: int) -> Block | None:
    """More of the arena: extend the top free block when ``a`` may use it (ready, or freed on
    ``a``), else start a new block at the top; the granules are mapped on allocation."""
    arena, blocks = pool._arena, pool._blocks
    if not arena.base:
        arena.reserve(pool)
        assert not blocks
        blocks.origin = arena.base  # (granules counted from the base: see BlockList)
    last = blocks.last
    extend = (last is not None and not last.live and last.addr + last.size == arena.base + arena.top
              and (last.stream is None or last.stream is a))
    start = last.addr - arena.base if extend and last is not None else arena.top
    if not arena.extend(start, size):
        return None
    if extend and last is not None:
        last.fl.remove(last)
        last.size = arena.base + arena.top - last.addr
        return last
    b = Block(arena.base + start, arena.top - start)
    b.fresh = True  # what the allocation leaves of it has never been used
    blocks.link_after(last, b)
    return b


def merge_run(pool: ArenaPool, a: Stream, size: int) -> list[Block] | None:
    """The smallest run of two or more adjacent free blocks, each ready or freed on ``a``, that
    fits ``size`` (the lowest such run among equals), or None. Free neighbours of one kind are
    coalesced, so such a run holds a ready block next to one freed on ``a``: the runs are found
    from ``pool._seams[a.id]`` (pruned of what no longer qualifies), without looking at any
    other block."""
    seams = pool._seams.get(a.id)
    if not seams:
        return None
    ready = pool._ready
    starts: dict[int, Block] = {}
    for r in list(seams):
        p, n = r.prev, r.next
        if r.fl is not ready or not (
                (p is not None and not p.live and p.stream is a)
                or (n is not None and not n.live and n.stream is a)):
            seams.discard(r)  # taken, merged, or no longer next to a block freed on a
            continue
        x = r
        while (q := x.prev) is not None and not q.live and (q.stream is None or q.stream is a):
            x = q
        starts[x.addr] = x
    best: list[Block] | None = None
    best_size = 0
    for addr in sorted(starts):  # address order, as a scan of every block would go
        run: deque[Block] = deque()
        total = 0
        b: Block | None = starts[addr]
        while b is not None and not b.live and (b.stream is None or b.stream is a):
            run.append(b)
            total += b.size
            while total - run[0].size >= size:  # shortest run ending here
                total -= run.popleft().size
            if total >= size and len(run) > 1 and (best is None or total < best_size):
                best, best_size = list(run), total
            b = b.next
    return best


def _merge_for(pool: ArenaPool, a: Stream, size: int) -> Block | None:
    """Before growing: merge :func:`merge_run` into one block for ``a``. Both kinds are usable by
    ``a`` (steps 1-2), so the merged block is tagged as freed on ``a`` (it must not become usable
    by other streams)."""
    best = merge_run(pool, a, size)
    if best is None:
        return None
    arena = pool._arena
    off = best[0].addr - arena.base  # the allocation takes the run's first bytes
    if arena.holes and not arena.fits(off, off + size):
        return None  # it could not map what it would land on
    pieces = [(b.addr, b.size, b.stream, b.pos, b.fresh) for b in best]
    for b in best:
        b.fl.remove(b)
    lo = best[0]
    lo.pos = max((b.pos for b in best if b.stream is a), default=0)
    lo.stream = a
    for hi in best[1:]:
        pool._blocks.absorb(lo, hi)
    # give the part past the request back with its original tags (ready stays ready)
    end = lo.addr + lo.size
    lo.size = size
    parts: list[list] = []
    for addr, psize, stream, pos, fresh in pieces:
        start = max(addr, lo.addr + size)
        if start >= addr + psize:
            continue
        if parts and parts[-1][2] is stream:  # same kind next to each other: one block
            parts[-1][1] = addr + psize - parts[-1][0]
            parts[-1][3] = max(parts[-1][3], pos)
            parts[-1][4] = parts[-1][4] and fresh
        else:
            parts.append([start, addr + psize - start, stream, pos, fresh])
    tail = lo
    created = []
    for start, psize, stream, pos, fresh in parts:
        rest = Block(start, psize)
        rest.stream, rest.pos, rest.fresh = stream, pos, fresh
        pool._blocks.link_after(tail, rest)
        created.append(rest)
        tail = rest
    assert tail.addr + tail.size == end
    lo.live = True  # taken: the pieces must not coalesce back into it
    for r in created:
        pool._insert_free(coalesce(pool._blocks, r))
    return lo


def _best_of(others: list, size: int, limit_of: Any,
             ok: Callable[[Block], bool] | None) -> Block | None:
    """Best fit among other streams' pending blocks accepted by ``ok`` whose free is at most
    ``limit_of(F)`` (any, for None), taken off its free list."""
    best: Block | None = None
    for sid, fl in others:
        if limit_of is None:
            b = fl.best(size, ok)
        else:
            lim = limit_of(sid)
            b = fl.best(size, lambda blk, lim=lim: blk.pos <= lim and (ok is None or ok(blk)))
        if b is not None and (best is None or b.size < best.size):
            best = b
    if best is not None:
        best.fl.remove(best)
    return best
