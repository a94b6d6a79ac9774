"""Pool blocks and the block list: splices, lookups by address, coalescing.

A :class:`Block` is a 512-aligned piece of a pool's arena. The blocks of a pool tile its arena:
a doubly linked list (``prev``/``next``) held by a :class:`BlockList`, which indexes them by
address without a sorted container on the hot path:
- ``by_addr``: start address -> block (exact lookups: frees, fast paths);
- ``starts``: granule number -> sorted start addresses of the blocks starting in that granule
  (small lists: a split or a merge is a ``bisect.insort`` or ``list.remove`` in one of them);
  granules are counted from ``origin``, the arena's base, so they are the arena's own (an
  arena's first chunk is one granule whatever the base's alignment);
- ``granules``: sorted granule numbers whose ``starts`` list is not empty (it changes only when
  a granule gains its first block start or loses its last one, not on every split);
- ``first``/``last``: the blocks at the bottom and the top of the arena.
Every change of the list is a splice made here (:meth:`BlockList.link_after`,
:meth:`BlockList.absorb`, :func:`split`), so that the links and the indexes never disagree, and
so is every merge of free neighbours (:func:`coalesce`); the pool's fast paths
(:mod:`streamrt.pool.fast`) write ``split`` and ``absorb`` out in line, and must change with
them.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from sortedcontainers import SortedList

if TYPE_CHECKING:
    from ..stream import Stream

__all__ = ["Block", "BlockList", "coalesce", "split"]

_new = object.__new__


class Block:
    """A piece of an arena: live, pending (freed on ``stream`` at ``pos``) or ready; ``fresh``:
    free memory no allocation has used yet (the rest of a grown chunk), which ``stats()`` counts
    apart from reuse (split keeps it, coalescing keeps it only if both blocks are fresh)."""

    __slots__ = ("addr", "size", "req", "prev", "next", "live", "stream", "pos", "clock", "fl",
                 "fresh")

    def __init__(self, addr: int, size: int) -> None:
        self.addr = addr
        self.size = size
        self.req = size  # while live: the bytes requested (``size`` is them rounded)
        self.prev: Block | None = None
        self.next: Block | None = None
        self.live = False
        self.stream: Stream | None = None  # pending free on this stream; None = ready
        self.pos = 0
        self.clock: dict[int, int] | None = None  # the freeing stream's clock (instrumented runs)
        self.fl: Any = None  # the FreeList holding it (None: live, or being moved)
        self.fresh = False


class BlockList:
    """The blocks tiling one arena, linked in address order and indexed by address."""

    __slots__ = ("by_addr", "starts", "granules", "shift", "origin", "first", "last")

    def __init__(self, granule: int) -> None:
        self.by_addr: dict[int, Block] = {}
        self.starts: dict[int, list[int]] = {}
        self.granules = SortedList()
        self.shift = granule.bit_length() - 1  # granule is a power of two
        self.origin = 0  # the arena's base (set, the list empty, when the arena is reserved)
        self.first: Block | None = None
        self.last: Block | None = None

    def __len__(self) -> int:
        return len(self.by_addr)

    def __bool__(self) -> bool:
        return bool(self.by_addr)

    def get(self, addr: int) -> Block | None:
        """The block starting at ``addr``, or None."""
        return self.by_addr.get(addr)

    def values(self) -> Iterator[Block]:
        """Every block, in address order."""
        b = self.first
        while b is not None:
            yield b
            b = b.next

    def clear(self) -> None:
        self.by_addr.clear()
        self.starts.clear()
        self.granules.clear()
        self.first = self.last = None

    def _index(self, addr: int) -> None:
        g = (addr - self.origin) >> self.shift
        lst = self.starts.get(g)
        if lst is None:
            self.starts[g] = [addr]
            self.granules.add(g)
        else:
            insort(lst, addr)

    def _unindex(self, addr: int) -> None:
        g = (addr - self.origin) >> self.shift
        lst = self.starts[g]
        if len(lst) == 1:
            del self.starts[g]
            self.granules.remove(g)
        else:
            lst.remove(addr)

    def link_after(self, prev: Block | None, b: Block) -> None:
        """Put the new block ``b`` into the list right after ``prev`` (None: into an empty list)."""
        assert prev is not None or not self.by_addr
        nxt = prev.next if prev is not None else None
        b.prev, b.next = prev, nxt
        if nxt is not None:
            nxt.prev = b
        else:
            self.last = b
        if prev is not None:
            prev.next = b
        else:
            self.first = b
        self.by_addr[b.addr] = b
        self._index(b.addr)

    def absorb(self, lo: Block, hi: Block) -> None:
        """``lo`` takes the bytes of ``hi``, its next block, which leaves the list (dead: no tags)."""
        lo.size += hi.size
        nxt = lo.next = hi.next
        if nxt is not None:
            nxt.prev = lo
        else:
            self.last = lo
        addr = hi.addr
        del self.by_addr[addr]
        lst = self.starts[(addr - self.origin) >> self.shift]
        if len(lst) > 1:  # (_unindex's common case, inline)
            lst.remove(addr)
        else:
            self._unindex(addr)
        hi.stream = None

    def holding(self, ptr: int) -> Block | None:
        """The block starting at ``ptr``, or else the one below it (``ptr`` may be inside it)."""
        b = self.by_addr.get(ptr)
        if b is not None:
            return b
        g = (ptr - self.origin) >> self.shift
        lst = self.starts.get(g)
        if lst is not None and lst[0] <= ptr:
            return self.by_addr[lst[bisect_right(lst, ptr) - 1]]
        i = self.granules.bisect_left(g) - 1  # the nearest granule below with a block start
        return self.by_addr[self.starts[self.granules[i]][-1]] if i >= 0 else None


def split(blocks: BlockList, b: Block, size: int) -> Block:
    """Cut ``b`` after its first ``size`` bytes; returns the rest, a new block with b's tags."""
    addr = b.addr + size
    rest = _new(Block)  # every slot set here (Block.__init__ and link_after, inline: this is
    rest.addr = addr  # the path of every allocation that splits)
    rest.size = rest.req = b.size - size
    rest.live = False
    rest.stream, rest.pos, rest.clock, rest.fl, rest.fresh = b.stream, b.pos, b.clock, None, b.fresh
    b.size = size
    nxt = rest.next = b.next
    rest.prev = b
    b.next = rest
    if nxt is not None:
        nxt.prev = rest
    else:
        blocks.last = rest
    blocks.by_addr[addr] = rest
    lst = blocks.starts.get((addr - blocks.origin) >> blocks.shift)
    if lst is None:
        blocks._index(addr)
    else:
        insort(lst, addr)
    return rest


def absorbs(b: Block, nb: Block) -> bool:
    """Whether free ``b`` takes its neighbour ``nb`` when coalescing: a free one that is ready, or
    pending on ``b``'s stream (a merged block never makes a later free look earlier)."""
    return not nb.live and (nb.stream is None or nb.stream is b.stream)


def coalesce(blocks: BlockList, b: Block, ran: Callable[[Block], bool] | None = None) -> Block:
    """Merge ``b`` (free, in no free list) with the free neighbours it may absorb, each taken off
    its free list. Coalescing never loses ordering knowledge: a block freed on
    stream F takes ready neighbours and those freed on F (the whole stays pending on F at the
    later position: other streams lose nothing they could prove), and, given ``ran`` (a pool
    that allows opportunistic reuse), those freed on another stream whose free ``ran`` says has
    run: their memory is as reusable as F's own, for whoever may take F's (the whole takes F's
    tag); a ready block takes ready neighbours. Repeated until no neighbour qualifies: a ready
    neighbour taken may have one freed on F beyond it."""
    stream = b.stream
    if stream is None:
        ran = None  # (a ready block never takes a pending one: it would look proven)
    while True:
        nb = b.prev
        if nb is None or nb.live or (nb.stream is not None and nb.stream is not stream and (
                ran is None or not ran(nb))):
            nb = b.next
            if nb is None or nb.live or (nb.stream is not None and nb.stream is not stream and (
                    ran is None or not ran(nb))):
                return b
        nb.fl.remove(nb)
        lo, hi = (nb, b) if nb.addr < b.addr else (b, nb)
        if nb.stream is not None and nb.stream is not stream:  # another stream's, run: F's tag
            nb.stream, nb.pos, nb.clock = stream, b.pos, b.clock
        # one stream: the later free's position and clock know more (ties: the lower block's)
        if lo.stream is None:
            if hi.stream is not None:
                lo.stream, lo.pos, lo.clock = hi.stream, hi.pos, hi.clock
        elif hi.stream is not None and hi.pos > lo.pos:
            lo.pos, lo.clock = hi.pos, hi.clock
        lo.fresh = lo.fresh and hi.fresh
        blocks.absorb(lo, hi)
        b = lo


def merged_dirty(blocks: BlockList, dirty: set[Block]) -> tuple[list[tuple[int, int]], set[Block]]:
    """``(addr, size)`` of each dirty block (a fast-path free whose merge with ready neighbours
    is deferred) as the deferred merges would leave it, without making them: each takes the run
    of free neighbours coalescing would merge, in the same order; and the blocks merged into them."""
    runs: list[tuple[int, int]] = []
    taken: set[Block] = set()
    for b in sorted(dirty, key=lambda x: x.addr):
        if b in taken or b.live or b.stream is None or blocks.get(b.addr) is not b:
            continue
        lo, size = b.addr, b.size
        for nb, step in ((b.prev, "prev"), (b.next, "next")):
            while nb is not None and nb not in taken and absorbs(b, nb):
                size += nb.size
                lo = min(lo, nb.addr)
                taken.add(nb)
                nb = getattr(nb, step)
        taken.add(b)
        runs.append((lo, size))
    return runs, taken


def settled_runs(blocks: BlockList, dirty: set[Block]) -> list[tuple[int, int]]:
    """``(addr, size)`` of every free block as the deferred merges would leave them."""
    runs, taken = merged_dirty(blocks, dirty)
    return runs + [(b.addr, b.size) for b in blocks.values() if not b.live and b not in taken]
