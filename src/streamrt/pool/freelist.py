"""Pool blocks and free lists: best fit in O(log n) with exact-size bins (DESIGN.md §3).

A :class:`Block` is a 512-aligned piece of a pool's arena, linked to its neighbours so that free
ones coalesce. A :class:`FreeList` bins free blocks by exact size (a FIFO queue per size, so the
common exact reuse is a dict lookup and a pop) and keeps a sorted index of the sizes for best
fit; sizes whose bin emptied stay indexed until a search passes over them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from sortedcontainers import SortedList

if TYPE_CHECKING:
    from ..stream import Stream

__all__ = ["Block", "FreeList"]


class Block:
    """A piece of a chunk: live, pending (freed on ``stream`` at ``pos``) or ready."""

    __slots__ = ("addr", "size", "chunk", "prev", "next", "live", "stream", "pos", "clock")

    def __init__(self, addr: int, size: int, chunk: int) -> None:
        self.addr = addr
        self.size = size
        self.chunk = chunk  # base address of the pool's arena
        self.prev: Block | None = None
        self.next: Block | None = None
        self.live = False
        self.stream: Stream | None = None  # pending free on this stream; None = ready
        self.pos = 0
        self.clock: dict[int, int] | None = None  # the freeing stream's clock (instrumented runs)


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
