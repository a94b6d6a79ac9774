"""The arena pool's fast paths: ``ArenaPool._malloc`` and ``ArenaPool._free`` (see arena_pool.py).

They cover the common cases of a non-blocking stream that is not capturing, with the splices
of :mod:`streamrt.pool.block` written out in line (this is the path of every ``s.malloc`` /
``s.free`` pair, where a call costs as much as a splice):
- malloc, step 1 of DESIGN.md §3: an exact-size block freed on the stream (the oldest binned
  one, else the newest), or the stream's newest pending block split in place when it is step
  1's best fit (every binned size that fits is larger): the high end (``arena.landing``) goes
  live, the rest stays the newest, at the same position;
- free: a block with no free neighbour that coalescing would take goes to the stream's pending
  list as its newest (ready neighbours are absorbed later, ``_dirty``); a block whose only
  mergeable neighbour is the stream's newest pending block below it (a split's remainder) is
  absorbed by it in place, which stays the newest at the free's position.
Layout, tags, positions and counters are those the general path (``_alloc``, ``coalesce``) would
leave; every other case goes there. Both run under the pool's lock, taken with ``acquire`` /
``release``: a ``with`` block's lookups would double the cost of these paths.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import TYPE_CHECKING, Any

from .. import instrument
from .arena import ALIGN, SMALL_REQUEST
from .block import Block
from .registry import _owners

if TYPE_CHECKING:
    from ..stream import Stream
    from .arena_pool import ArenaPool

_new = object.__new__


def malloc(pool: ArenaPool, stream: Stream, nbytes: int) -> int:
    """``ArenaPool._malloc``: the fast paths, else ``_alloc`` / ``_malloc_rest``."""
    if stream._slow or pool._destroyed or stream.device is not pool.device:
        return pool._malloc_rest(stream, nbytes)
    size = (nbytes + ALIGN - 1) // ALIGN * ALIGN or ALIGN
    lock = pool._lock
    lock.acquire()
    try:
        fl = pool._pending.get(stream.id)
        if fl is not None:
            bins = fl.bins
            lst = bins.get(size) if bins else None
            if lst:  # an exact-size bin: its oldest block (older than the newest)
                b = lst[0]
                if b.fl is fl and b.size == size and (
                        not pool._arena.holes or pool._arena.fully_mapped(b)):
                    # (with unmapped granules in the arena, a block may need mapping first; a
                    # block left in _dirty is skipped by _settle once it is live)
                    if b is fl.newest:  # (a stale entry of the newest that came back valid)
                        fl.newest = None
                    else:
                        lst.popleft()
                    return _take(pool, fl, b, size, nbytes)
            elif (v := fl.newest) is not None:
                vs = v.size
                if vs == size:
                    if not pool._arena.holes or pool._arena.fully_mapped(v):
                        fl.newest = v.fl = None  # (_take, in line: the exact-size pair's path)
                        fl.count -= 1
                        v.live = True
                        v.req = nbytes
                        v.stream = None
                        addr = v.addr
                        _owners[addr] = pool
                        used = pool._used = pool._used + size
                        if used > pool._used_high:
                            pool._used_high = used
                        pool._fast_allocs += 1
                        return addr  # type: ignore[no-any-return]
                elif (vs > size and size <= SMALL_REQUEST and not pool._arena.holes
                      and not pool._dirty and (
                          not (sizes := fl.sizes) or (i := bisect_left(sizes, size)) == len(sizes)
                          or sizes[i] > vs)):
                    # step 1's best fit is the newest (every binned size that fits is larger; a
                    # stale bin only hides a larger one): block.split, in line, the new block
                    # the high end, live (a block the free path absorbed, else a new one)
                    rest = vs - size
                    addr = v.addr + rest
                    b = pool._spare
                    if b is None:
                        b = _new(Block)
                        b.stream, b.pos, b.clock, b.fl = None, 0, None, None
                    else:  # (its other slots are those absorb left: no tags, no list)
                        pool._spare = None
                    b.addr = addr
                    b.size = size
                    b.req = nbytes
                    b.live = True
                    b.fresh = False
                    v.size = rest
                    nxt = b.next = v.next
                    b.prev = v
                    v.next = b
                    blocks = pool._blocks
                    if nxt is not None:
                        nxt.prev = b
                    else:
                        blocks.last = b
                    blocks.by_addr[addr] = b
                    starts = blocks.starts.get((addr - blocks.origin) >> blocks.shift)
                    if starts is None:
                        blocks._index(addr)
                    else:
                        insort(starts, addr)
                    _owners[addr] = pool
                    used = pool._used = pool._used + size
                    if used > pool._used_high:
                        pool._used_high = used
                    pool._fast_allocs += 1
                    return addr
        return pool._alloc(stream, size, nbytes)
    finally:
        lock.release()


def _take(pool: ArenaPool, fl: Any, b: Block, size: int, nbytes: int) -> int:
    """Make ``b``, just taken off pending list ``fl``, live for ``nbytes`` (``size`` rounded)."""
    b.fl = None
    fl.count -= 1
    b.live = True
    b.req = nbytes
    b.stream = None
    _owners[b.addr] = pool
    used = pool._used = pool._used + size
    if used > pool._used_high:
        pool._used_high = used
    pool._fast_allocs += 1  # alloc_count and reuse_same_stream, see stats()
    return b.addr  # type: ignore[no-any-return]


def free(pool: ArenaPool, stream: Stream, ptr: int) -> None:
    """``ArenaPool._free``: the fast paths, else the general free (``_free_rest``)."""
    if stream._slow or pool._destroyed or stream.device is not pool.device:
        return pool._free_rest(stream, ptr)
    lock = pool._lock
    lock.acquire()
    try:
        b = pool._by_addr.get(ptr)
        if b is not None and b.live:
            prev, nxt = b.prev, b.next
            if prev is not None and not prev.live and prev.stream is stream:
                fl = prev.fl
                if (fl.newest is prev and not pool._dirty and not instrument.listeners
                        and (nxt is None or nxt.live or (
                            nxt.stream is not None and nxt.stream is not stream and not pool._takes(nxt)))
                        and ((vp := prev.prev) is None or vp.live or (
                            vp.stream is not None and not pool._takes(vp)))):
                    # the one neighbour to merge is the stream's newest pending block (a split's
                    # remainder) with no ready neighbour: it takes b in place (BlockList.absorb, in
                    # line) and stays the newest, at b's later position
                    del _owners[ptr]
                    b.live = False
                    size = b.size
                    prev.size += size
                    prev.next = nxt
                    blocks = pool._blocks
                    if nxt is not None:
                        nxt.prev = prev
                    else:
                        blocks.last = prev
                    del blocks.by_addr[ptr]
                    starts = blocks.starts[(ptr - blocks.origin) >> blocks.shift]
                    if len(starts) > 1:
                        starts.remove(ptr)
                    else:
                        blocks._unindex(ptr)
                    b.stream = None
                    pool._spare = b  # (the next split's new block: no tags, in no list)
                    prev.pos, prev.clock = stream._pos, None
                    prev.fresh = False
                    pool._used -= size
                    pool._fast_frees += 1
                    return None
            elif ((prev is None or prev.live or (
                    pool._defers_past(prev.prev, stream) if prev.stream is None
                    else not pool._takes(prev)))
                  and (nxt is None or nxt.live or (
                      pool._defers_past(nxt.next, stream) if nxt.stream is None
                      else nxt.stream is not stream and not pool._takes(nxt)))):
                # no free neighbour coalescing would take but ready ones, which _settle absorbs
                # later (and what lies beyond them freed on this stream): the next exact-size
                # malloc takes b as it is
                if (prev is not None and not prev.live and prev.stream is None) or (
                        nxt is not None and not nxt.live and nxt.stream is None):
                    pool._dirty.add(b)
                del _owners[ptr]
                b.live = False
                b.stream = stream
                if instrument.listeners:  # the clock's own position (see _release_block)
                    b.clock = clock = stream._snapshot()
                    b.pos = clock[stream.id]
                else:  # (no clock: one left from an earlier tag would claim a wrong order)
                    b.pos, b.clock = stream._pos, None
                pool._used -= b.size
                pool._fast_frees += 1  # free_count, see stats()
                fl = pool._pending.get(stream.id)
                if fl is None:
                    pool._insert_free(b)
                else:  # PendingList.add, in line
                    b.fl = fl
                    v = fl.newest
                    if v is not None:
                        fl._bin(v)
                        fl.track(v)
                    fl.newest = b
                    fl.count += 1
                return None
            # a neighbour coalescing takes: coalesce now (the general path; _free_block, in line)
            if pool._dirty:
                pool._settle()
            del _owners[ptr]
            b.live = False
            b.stream = stream
            if instrument.listeners:
                b.clock = clock = stream._snapshot()
                b.pos = clock[stream.id]
            else:
                b.pos, b.clock = stream._pos, None
            pool._used -= b.size
            pool._stats["free_count"] += 1
            pool._insert_free(pool._coalesce(b))
            return None
    finally:
        lock.release()
    return pool._free_rest(stream, ptr)  # (b is not a live block: an error, raised there)
