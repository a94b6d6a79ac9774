"""Pool blocks, the block list and free lists: best fit in O(log n) with exact-size bins.

A :class:`Block` is a 512-aligned piece of a pool's arena. The blocks of a pool tile its arena:
a doubly linked list (``prev``/``next``) indexed by address (a ``SortedDict``, addr -> block);
every change of that list is a splice made here (:func:`link_after`, :func:`absorb`,
:func:`split`), so that the links and the index never disagree, and so is every merge of free
neighbours (:func:`coalesce`). A :class:`FreeList` bins free
blocks by exact size (a FIFO queue per size, so the common exact reuse is a dict lookup and a
pop) and keeps a sorted index of the sizes for best fit; sizes whose bin emptied stay indexed
until a search passes over them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from operator import attrgetter
from typing import TYPE_CHECKING

from sortedcontainers import SortedList

if TYPE_CHECKING:
    from sortedcontainers import SortedDict

    from ..stream import Stream

__all__ = ["Block", "FreeList"]

by_addr = attrgetter("addr")


class Block:
    """A piece of an arena: live, pending (freed on ``stream`` at ``pos``) or ready."""

    __slots__ = ("addr", "size", "prev", "next", "live", "stream", "pos", "clock")

    def __init__(self, addr: int, size: int) -> None:
        self.addr = addr
        self.size = size
        self.prev: Block | None = None
        self.next: Block | None = None
        self.live = False
        self.stream: Stream | None = None  # pending free on this stream; None = ready
        self.pos = 0
        self.clock: dict[int, int] | None = None  # the freeing stream's clock (instrumented runs)


# -- the block list -------------------------------------------------------------------------
def link_after(blocks: SortedDict, prev: Block | None, b: Block) -> None:
    """Put the new block ``b`` into the list right after ``prev`` (None: into an empty list)."""
    assert prev is not None or not blocks
    nxt = prev.next if prev is not None else None
    b.prev, b.next = prev, nxt
    if nxt is not None:
        nxt.prev = b
    if prev is not None:
        prev.next = b
    blocks[b.addr] = b


def absorb(blocks: SortedDict, lo: Block, hi: Block) -> None:
    """``lo`` takes the bytes of ``hi``, its next block, which leaves the list (dead: no tags)."""
    lo.size += hi.size
    lo.next = hi.next
    if hi.next is not None:
        hi.next.prev = lo
    del blocks[hi.addr]
    hi.stream = None


def split(blocks: SortedDict, b: Block, size: int) -> Block:
    """Cut ``b`` after its first ``size`` bytes; returns the rest, a new block with b's tags."""
    rest = Block(b.addr + size, b.size - size)
    rest.stream, rest.pos, rest.clock = b.stream, b.pos, b.clock
    b.size = size
    link_after(blocks, b, rest)
    return rest


def holding(blocks: SortedDict, ptr: int) -> Block | None:
    """The block starting at ``ptr``, or else the one below it (``ptr`` may be inside it)."""
    b = blocks.get(ptr)
    if b is None:
        i = blocks.bisect_right(ptr) - 1
        b = blocks.peekitem(i)[1] if i >= 0 else None
    return b


def absorbs(b: Block, nb: Block) -> bool:
    """Whether free ``b`` takes its neighbour ``nb`` when coalescing: a free one that is ready, or
    pending on ``b``'s stream (a merged block never makes a later free look earlier)."""
    return not nb.live and (nb.stream is None or nb.stream is b.stream)


def coalesce(blocks: SortedDict, b: Block, unindex: Callable[[Block], None]) -> Block:
    """Merge ``b`` (free, in no free list) with the free neighbours it may absorb, each taken off
    its free list by ``unindex``. Coalescing never loses ordering knowledge: a block freed on
    stream F takes ready neighbours and those freed on F (the whole stays pending on F at the
    later position: other streams lose nothing they could prove); a ready block takes ready
    neighbours. Repeated until no neighbour qualifies: a ready neighbour taken may have one
    freed on F beyond it."""
    while True:
        for nb in (b.prev, b.next):
            if nb is not None and absorbs(b, nb):
                break
        else:
            return b
        unindex(nb)
        lo, hi = (nb, b) if nb.addr < b.addr else (b, nb)
        pending = [x for x in (lo, hi) if x.stream is not None]
        if pending:  # one stream: the later free's position and clock know more
            latest = max(pending, key=lambda x: x.pos)
            lo.stream, lo.pos, lo.clock = latest.stream, latest.pos, latest.clock
        absorb(blocks, lo, hi)
        b = lo


def merged_dirty(blocks: SortedDict, dirty: set[Block]) -> tuple[list[tuple[int, int]], set[Block]]:
    """``(addr, size)`` of each dirty block (a fast-path free whose merge with ready neighbours
    is deferred) as the deferred merges would leave it, without making them: each takes the run
    of free neighbours coalescing would merge, in the same order; and the blocks merged into them."""
    runs: list[tuple[int, int]] = []
    taken: set[Block] = set()
    for b in sorted(dirty, key=by_addr):
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


def settled_runs(blocks: SortedDict, dirty: set[Block]) -> list[tuple[int, int]]:
    """``(addr, size)`` of every free block as the deferred merges would leave them."""
    runs, taken = merged_dirty(blocks, dirty)
    return runs + [(b.addr, b.size) for b in blocks.values() if not b.live and b not in taken]


# -- free lists ------------------------------------------------------------------------------
class FreeList:
    """Free blocks binned by exact size, with a sorted index of sizes for best fit."""

    __slots__ = ("bins", "sizes", "count")

    def __init__(self) -> None:
        self.bins: dict[int, deque[Block]] = {}  # oldest free first: best fit's tie-break
        self.sizes = SortedList()  # may keep sizes whose bin is empty; pruned while searching
        self.count = 0

    def add(self, b: Block) -> None:
        lst = self.bins.get(b.size)
        if lst is None:
            self.bins[b.size] = deque((b,))
            self.sizes.add(b.size)
        else:
            lst.append(b)
        self.count += 1

    def remove(self, b: Block) -> None:
        self.bins[b.size].remove(b)
        self.count -= 1

    def best(self, size: int, ok: Callable[[Block], bool] | None = None) -> Block | None:
        """The smallest block of at least ``size`` bytes accepted by ``ok`` (oldest free first)."""
        if not self.count:
            return None
        lst = self.bins.get(size)
        if lst:
            found = pick(lst, ok)
            if found is not None:
                return found
        empty = []
        found = None
        for s in self.sizes.irange(minimum=size):
            lst = self.bins[s]
            if not lst:
                empty.append(s)
                continue
            found = pick(lst, ok)
            if found is not None:
                break
        for s in empty:
            self.sizes.remove(s)
            del self.bins[s]
        return found

    def largest(self) -> int:
        for s in reversed(self.sizes):
            if self.bins[s]:
                return s
        return 0

    def blocks(self) -> list[Block]:
        return [b for lst in self.bins.values() for b in lst]


def pick(lst: deque[Block], ok: Callable[[Block], bool] | None) -> Block | None:
    if ok is None:
        return lst[0]
    for b in lst:
        if ok(b):
            return b
    return None
