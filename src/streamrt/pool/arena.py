"""A pool's arena: one reserved address range, physical memory mapped into it by granule.

Mixed into :class:`~streamrt.pool.MemPool` (all state is the pool's, guarded by its lock):
``_arena`` (base address, 0 before the first allocation), ``_va`` (its size: the device's
capacity), ``_top`` (where the blocks end), ``_mapped`` (offsets of mapped granules; reserved
bytes are ``len(_mapped) * _granule``, see :func:`granule_for`) and ``_holes`` (some granule
below the top is unmapped).
Growth extends the top free block or appends one; release unmaps granules lying wholly inside
ready free blocks; an allocation maps the granules it lands on, within ``max_size``.
"""

from __future__ import annotations

import mmap
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import InvalidAddressError, OutOfMemoryError, StreamRTError
from . import registry
from .freelist import Block as _Block
from .freelist import FreeList as _FreeList

if TYPE_CHECKING:
    from ..stream import Stream

ALIGN = 512
GRANULE = 2 << 20  # physical memory is mapped into a pool's arena in granules of this size
SMALL_REQUEST = 1 << 20  # requests up to this are small: placed at the high end of a block


def granule_for(max_size: int) -> int:
    """A pool's granule: ``GRANULE``, or for a ``max_size`` below it a power of two about a
    sixteenth of it (at least a page), so that a small pool maps memory at all and wastes
    little of its limit to rounding."""
    if not max_size or max_size >= GRANULE:
        return GRANULE
    return max(mmap.PAGESIZE, 1 << max(0, (max_size // 16).bit_length() - 1))


class ArenaMixin:
    """Granule mapping of a pool's address range (see the module docstring)."""

    def _grow(self, a: Stream, size: int) -> _Block | None:
        """More of the arena: extend the top free block when ``a`` may use it (ready, or freed
        on ``a``), else start a new block at the top; the granules are mapped on allocation."""
        if not self._arena:
            self._reserve_arena()
        top = self._top
        last = self._blocks.peekitem(-1)[1] if self._blocks else None
        extend = (last is not None and not last.live and last.addr + last.size == self._arena + top
                  and (last.stream is None or last.stream is a))
        base = last.addr - self._arena if extend else top
        gr = self._granule
        new_top = min((base + size + gr - 1) // gr * gr, self._va)
        if base + size > new_top:
            return None  # the arena (the device's capacity) is full
        if new_top <= top:
            return None  # the top block is large enough already: what it lacks is mapping
        # map the new granules and those the allocation will land on (where _malloc places
        # it), all or nothing: a failed growth changes nothing
        lo, hi = (new_top - size, new_top) if size <= SMALL_REQUEST else (base, base + size)
        missing = set(self._missing(top, new_top)) | set(self._missing(lo, hi))
        try:
            self._map(sorted(missing))
        except OutOfMemoryError:
            return None
        self._top = new_top
        self._holes = new_top != len(self._mapped) * gr
        if extend:
            self._remove_free(last)
            last.size = self._arena + new_top - last.addr
            return last
        b = _Block(self._arena + base, new_top - base, self._arena)
        b.prev = last
        if last is not None:
            last.next = b
        self._blocks[b.addr] = b
        return b

    def _reserve_arena(self) -> None:
        impl = self.device._impl
        # addresses for the whole device: max_size limits mapped memory, not addresses, so
        # free blocks a stream cannot use yet never stop the arena from growing
        gr = self._granule
        self._va = max(gr, (impl.capacity + gr - 1) // gr * gr)
        # enqueue-time copies and memsets into the arena are checked against its live blocks
        ref = weakref.ref(self)  # neither the backend nor the registry keeps the pool alive
        self._arena = base = impl.reserve(self._va, check=_checker(ref))
        # a pool dropped without destroy() gives its memory back when it is collected (it
        # cannot be while it has live allocations: ``_owners`` refers to it)
        self._finalizer = weakref.finalize(self, impl.reclaim, _release_arena, impl, base,
                                          self._mapped, self._granule)
        registry._arenas[base] = ref

    def _release_granules(self, keep: int) -> None:
        """Unmap mapped granules lying wholly inside ready free blocks, from the top of the
        arena down, while ``reserved - granule >= keep``. The blocks stay free: an allocation
        landing on an unmapped granule maps it again."""
        if self._reserved <= keep or not self._arena:
            return
        base, mapped, gr = self._arena, self._mapped, self._granule
        for b in sorted(self._ready.blocks(), key=lambda x: -x.addr):
            g0 = (b.addr - base + gr - 1) // gr * gr
            g = (b.addr + b.size - base) // gr * gr - gr
            while g >= g0:
                if self._reserved - gr < keep:
                    return
                if g in mapped:
                    self.device._impl.decommit(base, g, gr)
                    mapped.discard(g)
                    self._reserved -= gr
                    self._stats["release_count"] += 1
                    self._holes = True
                g -= gr

    def _fully_mapped(self, b: _Block) -> bool:
        base, gr = self._arena, self._granule
        first = (b.addr - base) // gr * gr
        return all(g in self._mapped for g in range(first, b.addr + b.size - base, gr))

    def _mappable(self, b: _Block, size: int) -> bool:
        """Whether an allocation of ``size`` placed in ``b`` can map what it lands on under
        ``max_size`` (a block over unmapped granules is usable only if it can)."""
        off = b.addr - self._arena
        lo, hi = (off + b.size - size, off + b.size) if size <= SMALL_REQUEST else (off, off + size)
        more = len(self._missing(lo, hi)) * self._granule
        return not more or not self.max_size or self._reserved + more <= self.max_size

    def _missing(self, lo: int, hi: int) -> list[int]:
        """Offsets of the unmapped granules overlapping arena offsets ``[lo, hi)``."""
        gr, mapped = self._granule, self._mapped
        return [g for g in range(lo // gr * gr, hi, gr) if g not in mapped]

    def _map_range(self, addr: int, nbytes: int) -> None:
        """Map the granules under ``[addr, addr + nbytes)`` that are not."""
        off = addr - self._arena
        self._map(self._missing(off, off + nbytes))

    def _map(self, missing: list[int]) -> None:
        """Map granules (``OutOfMemoryError`` past ``max_size`` or the device's capacity)."""
        if not missing:
            return
        mapped = self._mapped
        more = len(missing) * self._granule
        if self.max_size and self._reserved + more > self.max_size:
            raise OutOfMemoryError("max_size")
        self.device._impl.commit(more)
        mapped.update(missing)
        self._holes = self._top != len(mapped) * self._granule
        self._reserved += more
        if self._reserved > self._reserved_high:
            self._reserved_high = self._reserved

    def _idle(self) -> bool:
        """No live block and no free still pending on a stream: the arena can go."""
        return not any(x.live or x.stream is not None for x in self._blocks.values())

    def _drop_arena(self) -> None:
        """A destroyed pool with nothing left: give its address range back."""
        for g in sorted(self._mapped):
            self.device._impl.decommit(self._arena, g, self._granule)
            self._reserved -= self._granule
        self._mapped.clear()
        self._finalizer.detach()
        registry._arenas.pop(self._arena, None)  # first: once unreserved, the base may be reused
        self.device._impl.unreserve(self._arena)
        self._blocks.clear()
        self._ready = _FreeList()
        self._arena = self._top = 0
        self._holes = False


def _checker(ref: weakref.ref) -> Callable[[int, int], None]:
    """The arena's ``check(ptr, nbytes)`` for the backend: the range lies in one live block."""
    def check(ptr: int, nbytes: int) -> None:
        pool = ref()
        if pool is None:
            raise InvalidAddressError(f"{hex(ptr)} is in the arena of a pool that was collected")
        pool._check_range(ptr, nbytes)
    return check


def _release_arena(impl: Any, base: int, mapped: set[int], granule: int) -> None:
    registry._arenas.pop(base, None)
    try:
        for g in mapped:
            impl.decommit(base, g, granule)
        mapped.clear()
        impl.unreserve(base)
    except (StreamRTError, KeyError):
        pass  # the device was reset meanwhile: the arena is already gone
