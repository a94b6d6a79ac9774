"""Free lists: best fit with exact-size bins, and the order in which pending frees are proven.

A :class:`FreeList` holds free blocks: a :class:`ReadyList` a pool's ready blocks, a
:class:`PendingList` those pending on one stream.
State and invariants:
- ``bins``: size -> FIFO queue of blocks (oldest first: best fit's tie-break); ``sizes``: the
  sorted keys of ``bins`` (a plain list: best fit is a ``bisect``, a new or emptied size one
  ``insort``/``del``). An entry is *valid* while its block's ``fl`` is this list and its size is
  the bin's. Removing a block from the front or the back of a bin, or from a short bin, drops
  its entry; from the middle of a long bin it only clears ``fl`` (the entry goes stale and is
  dropped when a search reaches it, or by a compaction once stale entries outnumber the blocks),
  so every change is O(log n) whatever the bin's length. (A block that comes back to such a bin
  before its stale entry is dropped is found at the older entry: a tie-break among equal sizes
  only.) A bin may hold only stale entries until a search passes over it.
- ``newest``: the block added last, kept out of the bins (the one before it goes into its bin
  when another comes): a split's remainder and the block its free merges back are usually it,
  so a split and a coalesce in a row touch no bin and no size index. Every bin entry is older
  than it: best fit takes it only when it is strictly smaller than the best of the bins.
- ``count``: the valid blocks; ``big`` (the ready list's): those of at least ``big_min`` bytes,
  the only blocks that can hold a whole granule (what a release looks at).
- ``order`` (a pending list's): ``(pos, block)`` of its binned blocks, in non-decreasing
  ``pos`` (frees come in stream order), and ``late`` a heap of the entries that came out of
  order (split remainders keep their free's position): a synchronize proving position ``host``
  pops what lies at or below it, O(log n) per block proven, and looks at ``newest`` apart (a
  block gets its entry when it goes into a bin: one freed and taken again never has one). An
  entry is valid while its block is in this list at or below that position (a merge moves a
  block to a later position, with a new entry once binned).
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Iterator
from heapq import heappop, heappush
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .block import Block

__all__ = ["FreeList", "PendingList", "ReadyList"]

_seq = itertools.count()  # heap tie-break: blocks do not compare


class FreeList:
    """Free blocks binned by exact size, with a sorted list of the sizes for best fit."""

    __slots__ = ("bins", "sizes", "count", "stale", "newest")

    def __init__(self) -> None:
        self.bins: dict[int, deque[Block]] = {}
        self.sizes: list[int] = []
        self.count = 0
        self.stale = 0
        self.newest: Block | None = None

    def add(self, b: Block) -> None:
        """Put free ``b`` into the list (the newest of all)."""
        b.fl = self
        if self.newest is not None:
            self._bin(self.newest)
        self.newest = b
        self.count += 1

    def _bin(self, b: Block) -> None:
        """Put ``b`` at the back of its bin."""
        lst = self.bins.get(b.size)
        if lst is None:
            self.bins[b.size] = deque((b,))
            insort(self.sizes, b.size)
        else:
            lst.append(b)

    def remove(self, b: Block) -> None:
        """Take ``b`` out (O(1): an entry in the middle of a long bin goes stale)."""
        b.fl = None
        self.count -= 1
        if b is self.newest:
            self.newest = None
            return
        size = b.size
        lst = self.bins[size]
        if lst[0] is b:
            lst.popleft()
            if not lst:
                del self.bins[size]
                del self.sizes[bisect_left(self.sizes, size)]
        elif lst[-1] is b:
            lst.pop()
        elif len(lst) <= 16:  # a short bin: removed at once (a stale entry could come back valid
            lst.remove(b)  # if b returned to this bin, and make it look older than it is)
        else:
            self.stale += 1
            if self.stale > self.count + 64:
                self._compact()

    def _front(self, lst: deque[Block], size: int) -> Block | None:
        """The oldest valid block of a bin (stale entries before it are dropped)."""
        while lst:
            b = lst[0]
            if b.fl is self and b.size == size:
                return b
            lst.popleft()
            self.stale -= 1
        return None

    def _pick(self, lst: deque[Block], size: int, ok: Callable[[Block], bool] | None) -> Block | None:
        b = self._front(lst, size)
        if ok is None or b is None:
            return b
        for b in lst:
            if b.fl is self and b.size == size and ok(b):
                return b
        return None

    def best(self, size: int, ok: Callable[[Block], bool] | None = None) -> Block | None:
        """The smallest block of at least ``size`` bytes accepted by ``ok`` (oldest free first);
        it stays in the list."""
        if not self.count:
            return None
        found = self._best_binned(size, ok) if self.sizes else None
        v = self.newest
        if v is not None and v.size >= size and (found is None or v.size < found.size) and (
                ok is None or ok(v)):
            return v
        return found

    def _best_binned(self, size: int, ok: Callable[[Block], bool] | None) -> Block | None:
        bins, sizes = self.bins, self.sizes
        i = bisect_left(sizes, size)
        while i < len(sizes):
            s = sizes[i]
            lst = bins[s]
            if ok is None and lst and (first := lst[0]).fl is self and first.size == s:
                return first  # (the common case of _pick, inline)
            found = self._pick(lst, s, ok)
            if found is not None:
                return found
            if lst:
                i += 1
            else:  # only stale entries were left
                del bins[s], sizes[i]
        return None

    def take(self, size: int, ok: Callable[[Block], bool] | None = None) -> Block | None:
        """``best``, taken out of the list."""
        b = self.best(size, ok)
        if b is not None:
            self.remove(b)
        return b

    def largest(self) -> int:
        """The size of the largest block (0: none)."""
        bins, sizes = self.bins, self.sizes
        top = 0
        for s in reversed(sizes):
            if self._front(bins[s], s) is not None:
                top = s
                break
        return max(top, self.newest.size) if self.newest is not None else top

    def blocks(self) -> list[Block]:
        """Every block, once each."""
        found = dict.fromkeys(b for s, lst in self.bins.items() for b in lst
                              if b.fl is self and b.size == s)
        if self.newest is not None:
            found[self.newest] = None
        return list(found)

    def _compact(self) -> None:
        """Drop every stale entry (amortized O(1) per removal)."""
        bins: dict[int, deque[Block]] = {}
        for s, lst in self.bins.items():
            keep = deque(dict.fromkeys(b for b in lst if b.fl is self and b.size == s))
            if keep:
                bins[s] = keep
        self.bins = bins
        self.sizes = sorted(bins)
        self.stale = 0


class ReadyList(FreeList):
    """The ready blocks, with ``big``: those of at least ``big_min`` bytes."""

    __slots__ = ("big", "big_min")

    def __init__(self, big_min: int) -> None:
        super().__init__()
        self.big: set[Block] = set()
        self.big_min = big_min

    def add(self, b: Block) -> None:
        """Put free ``b`` into its bin (the newest of its size)."""
        FreeList.add(self, b)
        if b.size >= self.big_min:
            self.big.add(b)

    def remove(self, b: Block) -> None:
        """Take ``b`` out."""
        FreeList.remove(self, b)
        if b.size >= self.big_min:
            self.big.discard(b)


class PendingList(FreeList):
    """The blocks pending on one stream, with ``order``/``late``: their frees' positions."""

    __slots__ = ("order", "late")

    def __init__(self) -> None:
        super().__init__()
        self.order: deque[tuple[int, Block]] = deque()
        self.late: list[tuple[int, int, Block]] = []

    def add(self, b: Block) -> None:
        """Put free ``b`` into the list (the newest of all); the block it displaces into the
        bins is indexed by its position (the newest is looked at apart by ``proven``)."""
        b.fl = self
        v = self.newest
        if v is not None:
            self._bin(v)
            self.track(v)
        self.newest = b
        self.count += 1

    def track(self, b: Block) -> None:
        """Index pending ``b`` by its free's position (see ``proven``)."""
        order, pos = self.order, b.pos
        if not order or order[-1][0] <= pos:
            order.append((pos, b))
        else:
            heappush(self.late, (pos, next(_seq), b))
        if len(order) + len(self.late) > 2 * self.count + 64:
            self._reorder()

    def proven(self, host: int) -> Iterator[Block]:
        """Take out and yield the pending blocks freed at or before position ``host``."""
        order, late = self.order, self.late
        while True:
            if order and order[0][0] <= host:
                pos, b = order.popleft()
            elif late and late[0][0] <= host:
                pos, _, b = heappop(late)
            else:
                break
            if b.fl is self and b.pos <= host:
                self.remove(b)
                yield b
        v = self.newest
        if v is not None and v.pos <= host:
            self.remove(v)
            yield v

    def _reorder(self) -> None:
        """Rebuild the position index from the valid blocks (amortized O(log n) per free)."""
        self.order = deque((b.pos, b) for b in sorted(self.blocks(), key=lambda x: x.pos))
        self.late = []
