"""A pool's arena: one reserved address range, physical memory mapped into it by granule.

An :class:`Arena` belongs to one :class:`~streamrt.pool.arena_pool.ArenaPool` and is changed
only under that pool's lock. State and invariants:
- ``base``: the range's address (0 until the pool's first growth, and again once dropped);
  ``va``: its size, the device's capacity rounded up to a granule, as CUDA's pools reserve
  virtual addresses for the whole device (``max_size`` bounds mapped memory, not addresses, so
  free blocks a stream cannot use yet never stop the arena from growing).
- ``granule``: the unit of mapping, 2 MiB (a pool whose ``max_size`` is below that: about a
  sixteenth of it, see :func:`granule_for`); ``mapped``: arena offsets of the granules backed by
  physical memory (one set object for the arena's life: its finalizer holds it);
  ``reserved == len(mapped) * granule`` (``reserved_high``: its high watermark) and
  ``reserved <= limit`` when there is a limit (the pool's ``max_size``).
- ``top``: the offset where the pool's blocks end (they tile ``[base, base + top)``), a multiple
  of the granule; ``holes``: some granule below the top is not mapped.
Growth moves the top (mapping the new granules, all or nothing); release unmaps granules lying
wholly inside ready free blocks, from the top down; an allocation maps what it lands on.
"""

from __future__ import annotations

import mmap
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..errors import InvalidAddressError, OutOfMemoryError, StreamRTError
from . import registry

if TYPE_CHECKING:
    from .arena_pool import ArenaPool
    from .block import Block

ALIGN = 512  # every block size is a multiple of this, every address aligned to it
GRANULE = 2 << 20  # physical memory is mapped into a pool's arena in granules of this size
SMALL_REQUEST = 1 << 20  # requests up to this are small: placed at the high end of a block


def granule_for(max_size: int) -> int:
    """A pool's granule: ``GRANULE``, or for a ``max_size`` below it a power of two about a
    sixteenth of it (at least a page), so that a small pool maps memory at all and wastes
    little of its limit to rounding."""
    if not max_size or max_size >= GRANULE:
        return GRANULE
    return max(mmap.PAGESIZE, 1 << max(0, (max_size // 16).bit_length() - 1))


def landing(off: int, end: int, size: int) -> tuple[int, int]:
    """Arena offsets an allocation of ``size`` placed in the free span ``[off, end)`` lands on: a
    small request takes the high end of its block, a larger one the low end."""
    return (end - size, end) if size <= SMALL_REQUEST else (off, off + size)


class Arena:
    """One pool's reserved address range and its mapped granules (see the module docstring)."""

    __slots__ = ("_impl", "limit", "granule", "base", "va", "top", "mapped", "holes",
                 "reserved", "reserved_high", "_finalizer")

    def __init__(self, impl: Any, limit: int) -> None:
        self._impl = impl  # the device's DeviceImpl: reserve, commit, decommit, unreserve
        self.limit = limit
        self.granule = granule_for(limit)
        self.base = self.va = self.top = 0
        self.mapped: set[int] = set()
        self.holes = False
        self.reserved = self.reserved_high = 0
        self._finalizer: weakref.finalize | None = None

    def reserve(self, pool: ArenaPool) -> None:
        """Reserve the range for ``pool``. Enqueue-time copies and memsets into it are checked
        against its live blocks (``check``); a pool dropped without ``destroy()`` gives the range
        back when it is collected (it cannot be while it has live allocations or unproven frees:
        the registry refers to it then)."""
        impl, gr = self._impl, self.granule
        self.va = max(gr, (impl.capacity + gr - 1) // gr * gr)
        ref = weakref.ref(pool)  # neither the backend nor the registry keeps the pool alive
        self.base = base = impl.reserve(self.va, check=_checker(ref))
        self._finalizer = weakref.finalize(pool, impl.reclaim, _release, impl, base, self.mapped,
                                           gr)
        registry._arenas[base] = ref

    def extend(self, start: int, size: int) -> bool:
        """Move the top so that ``size`` bytes fit from offset ``start`` (the top free block's, or
        the top), mapping the new granules and those the allocation will land on; all or nothing:
        False (nothing changed) when the arena is full, the top is far enough already, or the
        memory cannot be mapped."""
        top, gr = self.top, self.granule
        new_top = min((start + size + gr - 1) // gr * gr, self.va)
        if start + size > new_top or new_top <= top:
            return False  # the arena (the device's capacity) is full, or what lacks is mapping
        lo, hi = landing(start, new_top, size)
        try:
            self.map(sorted(set(self.missing(top, new_top)) | set(self.missing(lo, hi))))
        except OutOfMemoryError:
            return False
        self.top = new_top
        self.holes = new_top != len(self.mapped) * gr
        return True

    def missing(self, lo: int, hi: int) -> list[int]:
        """Offsets of the unmapped granules overlapping arena offsets ``[lo, hi)``."""
        gr, mapped = self.granule, self.mapped
        return [g for g in range(lo // gr * gr, hi, gr) if g not in mapped]

    def fully_mapped(self, b: Block) -> bool:
        """Whether every granule under block ``b`` is mapped."""
        base, gr = self.base, self.granule
        first = (b.addr - base) // gr * gr
        return all(g in self.mapped for g in range(first, b.addr + b.size - base, gr))

    def lands_mapped(self, b: Block, size: int) -> bool:
        """Whether an allocation of ``size`` placed in ``b`` lands on mapped memory only."""
        off = b.addr - self.base
        return not self.missing(*landing(off, off + b.size, size))

    def mappable(self, b: Block, size: int) -> bool:
        """Whether an allocation of ``size`` placed in ``b`` can map what it lands on under the
        limit (a block over unmapped granules is usable only if it can)."""
        off = b.addr - self.base
        return self.fits(*landing(off, off + b.size, size))

    def fits(self, lo: int, hi: int) -> bool:
        """Whether the unmapped granules under offsets ``[lo, hi)`` can be mapped under the limit."""
        more = len(self.missing(lo, hi)) * self.granule
        return not more or not self.limit or self.reserved + more <= self.limit

    def map_range(self, addr: int, nbytes: int) -> None:
        """Map the granules under ``[addr, addr + nbytes)`` that are not."""
        off = addr - self.base
        self.map(self.missing(off, off + nbytes))

    def map(self, missing: list[int]) -> None:
        """Map granules (``OutOfMemoryError`` past the limit or the device's capacity)."""
        if not missing:
            return
        more = len(missing) * self.granule
        if self.limit and self.reserved + more > self.limit:
            raise OutOfMemoryError("max_size")
        self._impl.commit(more)
        self.mapped.update(missing)
        self.holes = self.top != len(self.mapped) * self.granule
        self.reserved += more
        if self.reserved > self.reserved_high:
            self.reserved_high = self.reserved

    def release(self, keep: int, ready: Iterable[Block]) -> int:
        """Unmap mapped granules lying wholly inside the ``ready`` free blocks (those of at least
        a granule), from the top of the arena down, while ``reserved - granule >= keep``; returns
        how many. The blocks stay free: an allocation landing on an unmapped granule maps it
        again."""
        if self.reserved - self.granule < keep or not self.base:
            return 0
        base, mapped, gr = self.base, self.mapped, self.granule
        released = 0
        for b in sorted(ready, key=lambda x: -x.addr):  # (only blocks of a granule or more)
            g0 = (b.addr - base + gr - 1) // gr * gr
            g = (b.addr + b.size - base) // gr * gr - gr
            while g >= g0:
                if self.reserved - gr < keep:
                    return released
                if g in mapped:
                    self._impl.decommit(base, g, gr)
                    mapped.discard(g)
                    self.reserved -= gr
                    released += 1
                    self.holes = True
                g -= gr
        return released

    def largest_mapped(self, runs: Iterable[tuple[int, int]]) -> int:
        """The largest part of the free ``(addr, size)`` runs that has memory behind it (free
        addresses whose memory went back to the device are not free memory of the pool)."""
        gr, base, mapped = self.granule, self.base, self.mapped
        best = 0
        for addr, size in runs:
            lo, end = addr - base, addr + size - base
            while lo < end:
                g = lo // gr * gr
                if g not in mapped:
                    lo = g + gr
                    continue
                hi = g + gr
                while hi < end and hi in mapped:
                    hi += gr
                best = max(best, min(hi, end) - lo)
                lo = hi
        return best

    def drop(self) -> None:
        """Give the whole range back (the pool is destroyed and has nothing left in it)."""
        base = self.base
        for g in sorted(self.mapped):
            self._impl.decommit(base, g, self.granule)
        self.forget()  # first: once unreserved, another pool may reserve the same base
        self._impl.unreserve(base)

    def forget(self) -> None:
        """Forget the range (dropped, or gone with a device reset)."""
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        registry._arenas.pop(self.base, None)
        self.mapped.clear()
        self.base = self.top = self.reserved = 0
        self.holes = False


def _checker(ref: weakref.ref[ArenaPool]) -> Callable[[int, int], None]:
    """The arena's ``check(ptr, nbytes)`` for the backend: the range lies in one live block."""
    def check(ptr: int, nbytes: int) -> None:
        pool = ref()
        if pool is None:
            raise InvalidAddressError(f"{hex(ptr)} is in the arena of a pool that was collected")
        pool._check_range(ptr, nbytes)
    return check


def _release(impl: Any, base: int, mapped: set[int], granule: int) -> None:
    """A collected pool's arena goes back (its finalizer)."""
    registry._arenas.pop(base, None)
    try:
        for g in mapped:
            impl.decommit(base, g, granule)
        mapped.clear()
        impl.unreserve(base)
    except (StreamRTError, KeyError):
        pass  # the device was reset meanwhile: the arena is already gone
