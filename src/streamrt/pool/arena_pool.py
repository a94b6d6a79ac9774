"""Stream-ordered memory pools (DESIGN.md §3): best-fit blocks, the reuse policy, threshold, trim.

State and invariants (per pool, all guarded by ``_lock``):
- Each pool reserves one address range (the arena, as large as the device, as CUDA's pools
  reserve virtual addresses) and maps physical memory into it in 2 MiB granules
  (``_mapped``; a pool whose ``max_size`` is below that, in granules of about a sixteenth of
  it, see ``arena.granule_for``); ``reserved`` is the mapped bytes. Blocks tile
  ``[arena, arena + top)`` as a doubly linked list, also indexed by address. Free blocks may
  cross granule boundaries, so free space never stays split at a reservation edge.
- A block is live (allocated, in ``_owners``) or free. A free block is either *pending*: freed
  on stream F at position p (``block.stream``/``block.pos``), indexed in ``_pending[F.id]``;
  or *ready*: its free was proven complete by a host synchronize (``block.stream is None``),
  indexed in ``_ready``. A synchronize promotes the pending blocks it proved. Live and pending
  blocks lie on mapped granules, except that a free may absorb a ready neighbour whose
  granules went back to the device (``_holes``); an allocation maps what it lands on.
- Coalescing never loses ordering knowledge: a free on F absorbs ready neighbours and those
  freed on F (the whole is pending on F at the later position); ready blocks merge with ready
  ones. The fast free path defers absorbing ready neighbours (``_dirty``) until a decision
  looks at sizes (``_settle``); an exact-size reuse on the fast path takes the block as it is,
  and ``stats()`` counts the deferred merges without making them, so observing the pool
  never changes where a later block goes. Before growing, a run of adjacent blocks that are ready or
  pending on the allocating stream A is merged if it fits (``reuse_merged``).
- Placement: best fit (the closest size, the oldest free block among equals); a request of at
  most 1 MiB takes the high end of its block, a larger one the low end, which keeps small and
  large blocks apart. Growing extends the top free block when A may use it, else appends a
  block at the top, and maps the granules it needs (``max_size`` bounds mapped bytes).
- ``used`` is the bytes of live blocks (rounded to 512), as CUDA's USED_MEM_CURRENT ("in use by
  the application"); ``used <= reserved`` always. High watermarks only grow, and reset only to
  the current value.
- ``s.malloc(n)`` on stream A takes, in order (each counted in ``stats()``): 1. a block freed
  on A; 2. a ready block; 3. (event dependencies) a block freed on F at p with
  ``clock[A][F] >= p``; 4. (opportunistic) one whose free F has already executed
  (``done[F] >= p``); 5. growth; 6. (internal dependencies) any pending block, after
  enqueueing a wait of A on F at p; 7. ``OutOfMemoryError``. Within a step, best fit wins; a
  block whose unmapped granules cannot be mapped under ``max_size`` is skipped.
- The release threshold is applied only at synchronize points, after promoting the frees the
  synchronize proved: granules lying wholly in ready free blocks are unmapped, from the top
  down, while reserved stays at or above the threshold; ``trim_to`` does the same down to its
  argument, whatever the threshold.
"""

from __future__ import annotations

import threading
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from sortedcontainers import SortedDict

from .. import instrument
from ..device import Device
from ..errors import (
    InvalidAddressError,
    InvalidHandleError,
    InvalidValueError,
    OutOfMemoryError,
)
from .arena import ALIGN, SMALL_REQUEST, ArenaMixin, granule_for
from .attrs import OPTIONS, MemPoolAttr, PoolOptions, nonneg, with_attr_properties
from .attrs import parse as parse_attr
from .attrs import value as attr_value
from .freelist import Block as _Block
from .freelist import FreeList as _FreeList
from .registry import _arenas, _busy, _owners, _pools
from .reuse import ReuseMixin

_addr = attrgetter("addr")


def _absorbs(b: _Block, nb: _Block) -> bool:
    """Whether free ``b`` takes its neighbour ``nb`` when coalescing: a free one that is ready, or
    pending on ``b``'s stream (a merged block never makes a later free look earlier)."""
    return not nb.live and (nb.stream is None or nb.stream is b.stream)

if TYPE_CHECKING:
    from ..stream import Stream

def _round(n: int) -> int:
    return (max(n, 1) + ALIGN - 1) // ALIGN * ALIGN


@with_attr_properties
class MemPool(ArenaMixin, ReuseMixin):
    """A stream-ordered memory pool (``cudaMemPool_t`` / ``aclrtMemPool``)."""

    def __init__(
        self,
        device: Any = None,
        *,
        max_size: int = 0,
        release_threshold: int = 0,
        reuse_follow_event_dependencies: bool = True,
        reuse_allow_opportunistic: bool = True,
        reuse_allow_internal_dependencies: bool = True,
    ) -> None:
        self.device = Device(device)
        self._opts = PoolOptions(max_size, release_threshold, reuse_follow_event_dependencies,
                                 reuse_allow_opportunistic, reuse_allow_internal_dependencies)
        self._is_default = False
        self._destroyed = False
        self._lock = threading.Lock()
        self._arena = 0  # base of the pool's reserved address range (0: none yet)
        self._va = 0  # its size
        self._granule = granule_for(self.max_size)  # the unit of mapping (see arena.py)
        self._top = 0  # offset where the blocks end: they tile [arena, arena + top)
        self._mapped: set[int] = set()  # offsets of the granules backed by physical memory
        self._holes = False  # some granule below the top is not mapped
        self._blocks: SortedDict = SortedDict()  # addr -> block (live and free)
        self._dirty: set[_Block] = set()  # fast-path frees not yet merged with ready neighbours
        self._ready = _FreeList()
        self._pending: dict[int, _FreeList] = {}
        self._pstream: dict[int, Stream] = {}  # stream id -> stream, for pending lists
        self._reserved = self._reserved_high = 0
        self._used = self._used_high = 0
        self._stats = dict.fromkeys(
            (
                "alloc_count", "free_count", "reuse_same_stream", "reuse_after_sync",
                "reuse_event_dependency", "reuse_opportunistic", "reuse_merged", "grow_count",
                "reuse_internal_dependency", "oom_count", "release_count",
            ),
            0,
        )
        self._fast_allocs = self._fast_frees = 0  # counted apart: the fast paths stay short
        self.device._pools.add(self)
        _pools.add(self)

    def __new__(cls, device: Any = None, **kwargs: Any) -> MemPool:
        if cls is MemPool and Device(device)._impl.pools is not None:
            from .native import NativeMemPool  # the backend's own pools (cudaMemPool_t)

            return object.__new__(NativeMemPool)
        return object.__new__(cls)

    @classmethod
    def _make_default(cls, device: Device) -> MemPool:
        if device._impl.pools is not None:
            from .native import NativeMemPool

            return NativeMemPool._make_default(device)
        pool = cls(device)
        pool._is_default = True
        return pool

    @property
    def max_size(self) -> int:
        """The most bytes the pool may reserve (0: the device's capacity)."""
        return self._opts.max_size

    def __repr__(self) -> str:
        kind = "default " if self._is_default else ""
        return (
            f"<MemPool {kind}{self.device.name} reserved={self._reserved} used={self._used}"
            f"{' destroyed' if self._destroyed else ''}>"
        )

    def _check_alive(self) -> None:
        if self._destroyed:
            raise InvalidHandleError(f"{self!r} was destroyed")

    # -- attributes ---------------------------------------------------------------------------
    def get_attr(self, attr: MemPoolAttr | int) -> int:
        """``cudaMemPoolGetAttribute``: flags as 0/1, sizes in bytes."""
        attr = parse_attr(attr)
        if attr in OPTIONS:  # the reuse flags and the release threshold
            return int(getattr(self._opts, OPTIONS[attr]))
        return {
            MemPoolAttr.RESERVED_MEM_CURRENT: self._reserved,
            MemPoolAttr.RESERVED_MEM_HIGH: self._reserved_high,
            MemPoolAttr.USED_MEM_CURRENT: self._used,
            MemPoolAttr.USED_MEM_HIGH: self._used_high,
        }[attr]

    def set_attr(self, attr: MemPoolAttr | int, value: Any) -> None:
        """``cudaMemPoolSetAttribute``: the three flags, the threshold, and ``*_HIGH`` = 0 (reset)."""
        attr = parse_attr(attr)
        self._check_alive()
        self._store_attr(attr, attr_value(attr, value))

    def _store_attr(self, attr: MemPoolAttr, value: int) -> None:
        """Apply a validated attribute write (a ``*_HIGH`` write resets the watermark)."""
        with self._lock:  # one write at a time: another thread's option change is not lost
            if attr in OPTIONS:
                self._opts = self._opts.with_attr(attr, value)
            elif attr is MemPoolAttr.RESERVED_MEM_HIGH:
                self._reserved_high = self._reserved
            else:
                self._used_high = self._used

    def stats(self) -> dict[str, int]:
        """The eight attributes, the per-step reuse counters, and ``largest_free_block``."""
        with self._lock:
            out = {a.name.lower(): self.get_attr(a) for a in MemPoolAttr}
            out.update(self._stats)
            out["alloc_count"] += self._fast_allocs
            out["reuse_same_stream"] += self._fast_allocs
            out["free_count"] += self._fast_frees
            # the deferred merges counted, not made: reading statistics must not change which
            # block a later allocation gets (the fast path takes unmerged exact-size blocks)
            out["largest_free_block"] = (self._largest_mapped_free() if self._holes else max(
                [self._ready.largest(), *self._settled_sizes(),
                 *(fl.largest() for fl in self._pending.values())]))
            out["live_allocations"] = sum(1 for b in self._blocks.values() if b.live)
            out["chunks"] = len(self._mapped)  # mapped granules
        return out

    # -- allocation -----------------------------------------------------------------------------
    def _malloc(self, stream: Stream, nbytes: int) -> int:
        if not stream._slow and not self._destroyed and stream.device is self.device:
            # fast path of step 1: an exact-size block freed on this (non-blocking) stream
            size = (nbytes + ALIGN - 1) // ALIGN * ALIGN or ALIGN
            lock = self._lock
            lock.acquire()  # not ``with``: its enter/exit lookups double the cost of this path
            try:
                fl = self._pending.get(stream.id)
                lst = fl.bins.get(size) if fl is not None else None
                if lst and (not self._holes or self._fully_mapped(lst[0])):
                    # (with unmapped granules in the arena, a block may need mapping first;
                    # a block left in _dirty is skipped by _settle once it is live)
                    b = lst.popleft()
                    fl.count -= 1
                    b.live = True
                    b.stream = None
                    _owners[b.addr] = self
                    used = self._used = self._used + size
                    if used > self._used_high:
                        self._used_high = used
                    self._fast_allocs += 1  # alloc_count and reuse_same_stream, see stats()
                    return b.addr
            finally:
                lock.release()
        self._check_alive()
        if stream.device is not self.device:
            raise InvalidValueError(
                f"{self!r} cannot serve a stream of {stream.device.name}: pools are per device"
            )
        cap = stream._capture  # once: another thread may end the capture
        if cap is not None:
            return cap.add_mem_alloc(stream, self, nbytes)
        size = _round(nbytes)
        if not stream.non_blocking:
            # The allocation is a stream operation, as the free is (see ``_free``): legacy
            # default-stream ordering applies before it. Without this, a block freed on the other
            # side of the implicit barrier looked unordered (clock not yet merged) and the pool
            # grew instead of reusing it by the event-dependency rule (DESIGN.md §2, §3 step 3).
            stream._implicit()
        with self._lock:
            if self._dirty:
                self._settle()
            counts = dict(self._stats)  # restored if the device cannot back the block
            block = self._find(stream, size, nbytes)
            if block.size - size >= ALIGN:
                # small requests at the high end of the block, large ones at the low end: the
                # two kinds keep apart, which leaves fewer unusable holes between them
                block = self._split_high(block, size) if size <= SMALL_REQUEST else self._split(
                    block, size)
            try:
                self._map_range(block.addr, block.size)
            except OutOfMemoryError:  # the device itself is full (max_size was checked)
                block.live = False
                self._insert_free(self._coalesce(block))
                self._stats = counts
                raise self._oom(nbytes, size) from None
            block.live = True
            block.stream = None
            _owners[block.addr] = self
            self._used += block.size
            if self._used > self._used_high:
                self._used_high = self._used
            self._stats["alloc_count"] += 1
        return block.addr

    def _check_range(self, ptr: int, nbytes: int) -> None:
        """The arena's ``check``: ``[ptr, ptr + nbytes)`` must lie in one live block."""
        with self._lock:
            b = self._holding(ptr)
            if b is None or not b.live or ptr + nbytes > b.addr + b.size:
                where = (f"its block [{hex(b.addr)}, {hex(b.addr + b.size)})" if b is not None
                         and b.live else "no live stream-ordered allocation")
                raise InvalidAddressError(
                    f"range {hex(ptr)}+{nbytes} is not inside one live pool allocation: "
                    f"{hex(ptr)} is in {where}"
                )

    def _split(self, b: _Block, size: int) -> _Block:
        """Keep the first ``size`` bytes in ``b``; the rest is a free block with b's tags."""
        rest = _Block(b.addr + size, b.size - size, b.chunk)
        rest.stream, rest.pos, rest.clock = b.stream, b.pos, b.clock
        rest.prev, rest.next = b, b.next
        if b.next is not None:
            b.next.prev = rest
        b.next = rest
        b.size = size
        self._blocks[rest.addr] = rest
        self._insert_free(rest)
        return b

    def _split_high(self, b: _Block, size: int) -> _Block:
        """The last ``size`` bytes of ``b`` as a new block; ``b`` keeps the rest, free."""
        hi = _Block(b.addr + b.size - size, size, b.chunk)
        hi.stream, hi.pos, hi.clock = b.stream, b.pos, b.clock
        hi.prev, hi.next = b, b.next
        if b.next is not None:
            b.next.prev = hi
        b.next = hi
        b.size -= size
        self._blocks[hi.addr] = hi
        self._insert_free(b)
        return hi

    def _insert_free(self, b: _Block) -> None:
        if b.stream is None:
            self._ready.add(b)
        else:
            sid = b.stream.id
            fl = self._pending.get(sid)
            if fl is None:
                fl = self._pending[sid] = _FreeList()
                self._pstream[sid] = b.stream
                _busy.add(self)  # work may still use its memory: not collectable until proven
            fl.add(b)

    def _remove_free(self, b: _Block) -> None:
        if b.stream is None:
            self._ready.remove(b)
        else:
            self._pending[b.stream.id].remove(b)

    def _settle(self) -> None:
        """Merge the blocks the fast free path left next to ready neighbours (before any
        decision that looks at block sizes: best fit, statistics, release)."""
        dirty, self._dirty = self._dirty, set()
        for b in sorted(dirty, key=_addr):  # in address order: who absorbs a shared neighbour
            if not b.live and b.stream is not None and self._blocks.get(b.addr) is b:
                self._remove_free(b)
                self._insert_free(self._coalesce(b))

    def _largest_mapped_free(self) -> int:
        """With granules released under free blocks: the largest run of free bytes that still
        has memory behind it (free addresses whose memory went back to the device are not free
        memory of the pool), in the blocks the deferred merges would make."""
        gr, base, mapped = self._granule, self._arena, self._mapped
        best = 0
        for addr, size in self._settled_runs():
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

    def _settled_sizes(self) -> list[int]:
        """The sizes the dirty blocks would have after :meth:`_settle`, which this does not do."""
        return [size for _addr, size in self._merged_dirty()[0]]

    def _merged_dirty(self) -> tuple[list[tuple[int, int]], set[_Block]]:
        """``(addr, size)`` of each dirty block after :meth:`_settle` (not done here): each takes
        the run of free neighbours ``_coalesce`` would merge, in the same order; and the blocks
        merged into them."""
        runs: list[tuple[int, int]] = []
        taken: set[_Block] = set()
        for b in sorted(self._dirty, key=_addr):
            if b in taken or b.live or b.stream is None or self._blocks.get(b.addr) is not b:
                continue
            lo, size = b.addr, b.size
            for nb, step in ((b.prev, "prev"), (b.next, "next")):
                while nb is not None and nb not in taken and _absorbs(b, nb):
                    size += nb.size
                    lo = min(lo, nb.addr)
                    taken.add(nb)
                    nb = getattr(nb, step)
            taken.add(b)
            runs.append((lo, size))
        return runs, taken

    def _settled_runs(self) -> list[tuple[int, int]]:
        """``(addr, size)`` of every free block as :meth:`_settle` would leave them."""
        runs, taken = self._merged_dirty()
        return runs + [(b.addr, b.size) for b in self._blocks.values()
                       if not b.live and b not in taken]

    def _coalesce(self, b: _Block) -> _Block:
        """Merge ``b`` (free, not indexed) with the free neighbours it may absorb: a block freed
        on stream F takes ready neighbours and those freed on F (the whole stays pending on F
        at the later position: other streams lose nothing they could prove); a ready block
        takes ready neighbours. Repeated until no neighbour qualifies: a ready neighbour taken
        may have one freed on F beyond it."""
        while True:
            for nb in (b.prev, b.next):
                if nb is not None and _absorbs(b, nb):
                    break
            else:
                return b
            self._remove_free(nb)
            lo, hi = (nb, b) if nb.addr < b.addr else (b, nb)
            pending = [x for x in (lo, hi) if x.stream is not None]
            lo.size += hi.size
            if pending:  # one stream: the later free's position and clock know more
                latest = max(pending, key=lambda x: x.pos)
                lo.stream, lo.pos, lo.clock = latest.stream, latest.pos, latest.clock
            lo.next = hi.next
            if hi.next is not None:
                hi.next.prev = lo
            del self._blocks[hi.addr]
            hi.stream = None  # a dead block
            b = lo

    # -- free -----------------------------------------------------------------------------------
    def _free(self, stream: Stream, ptr: int) -> None:
        if not stream._slow and stream.device is self.device and not self._destroyed:
            lock = self._lock
            lock.acquire()  # see _malloc
            try:
                b = self._blocks.get(ptr)
                prev, nxt = (b.prev, b.next) if b is not None else (None, None)
                if (b is not None and b.live and (prev is None or prev.live
                        or prev.stream is not stream) and (nxt is None or nxt.live
                        or nxt.stream is not stream)):
                    # fast path: no free neighbour freed on this stream. Ready neighbours are
                    # absorbed later, by _settle: the next exact-size malloc takes b as it is
                    if (prev is not None and not prev.live and prev.stream is None) or (
                            nxt is not None and not nxt.live and nxt.stream is None):
                        self._dirty.add(b)
                    del _owners[ptr]
                    b.live = False
                    b.stream = stream
                    b.pos = stream._pos
                    if instrument.listeners:  # the clock's own position (see _release_block)
                        b.clock = clock = stream._snapshot()
                        b.pos = clock[stream.id]
                    self._used -= b.size
                    self._fast_frees += 1  # free_count, see stats()
                    fl = self._pending.get(stream.id)
                    lst = fl.bins.get(b.size) if fl is not None else None
                    if lst is None:
                        self._insert_free(b)
                    else:  # the bin exists: append, as _FreeList.add would
                        lst.append(b)
                        fl.count += 1
                    return
            finally:
                lock.release()
        if stream.device is not self.device:
            raise InvalidValueError(
                f"{hex(ptr)} belongs to a pool of {self.device.name}; free it on a stream of "
                f"that device, not {stream.device.name}"
            )
        cap = stream._capture  # once: another thread may end the capture
        if cap is not None:
            return cap.add_mem_free(stream, ptr)
        if not stream.non_blocking:
            stream._implicit()  # the free is a stream operation: legacy ordering applies
        self._release_block(ptr, stream, stream._pos)

    def _free_now(self, ptr: int) -> None:
        """Free after a device synchronize (``srt.free`` on pool memory): ready at once."""
        self._release_block(ptr, None, 0)
        self._on_sync()

    def _release_block(self, ptr: int, stream: Stream | None, pos: int) -> None:
        with self._lock:
            if self._dirty:
                self._settle()
            b = self._blocks.get(ptr)
            if b is None or not b.live or _owners.get(ptr) is not self:
                raise InvalidAddressError(f"free of {hex(ptr)}: not a live allocation of {self!r}")
            del _owners[ptr]
            b.live = False
            b.stream = stream
            clock = stream._snapshot() if stream is not None and instrument.listeners else None
            # with a clock, the position is the clock's own (a later one: the free waits no less);
            # ``pos`` read apart may precede a wait the clock already merged (see Stream._snapshot)
            b.pos = pos if clock is None else clock[stream.id]
            b.clock = clock
            self._used -= b.size
            self._stats["free_count"] += 1
            self._insert_free(self._coalesce(b))
            if self._destroyed:
                self._release_granules(0)
                if self._idle():
                    self._drop_arena()

    # -- synchronize points, threshold, trim -----------------------------------------------------
    def _usable(self, ptr: int) -> int | None:
        """Bytes of the live block starting at ``ptr`` (None: not one)."""
        b = self._blocks.get(ptr)
        return b.size if b is not None and b.live else None

    def _holding(self, ptr: int) -> _Block | None:
        """The block starting at ``ptr``, or else at or below it (an interior pointer)."""
        b = self._blocks.get(ptr)
        if b is None:
            i = self._blocks.bisect_right(ptr) - 1
            b = self._blocks.peekitem(i)[1] if i >= 0 else None
        return b

    def _room(self, ptr: int) -> int | None:
        """Bytes from ``ptr`` to the end of the live block holding it (None: in no live block)."""
        with self._lock:
            b = self._holding(ptr)
            end = b.addr + b.size if b is not None and b.live else ptr
            return end - ptr if end > ptr else None

    def _on_sync(self) -> None:
        """Promote the frees a host synchronize proved, then apply the release threshold."""
        if not (self._pending or self._destroyed or self._reserved > self._opts.release_threshold):
            return  # nothing to promote or release (read without the lock: a hint)
        with self._lock:
            if self._dirty:
                self._settle()
            for sid in list(self._pending):
                fl = self._pending[sid]
                host = self._pstream[sid]._host
                for b in [b for b in fl.blocks() if b.pos <= host]:
                    fl.remove(b)
                    b.stream = None
                    self._ready.add(self._coalesce(b))
                if not fl.count:
                    del self._pending[sid], self._pstream[sid]
            if not self._pending:
                _busy.discard(self)
            keep = 0 if self._destroyed else self._opts.release_threshold
            if self._reserved > keep:
                self._release_granules(keep)

    def trim_to(self, min_bytes_to_keep: int) -> None:
        """Release entirely free, sync-proven chunks while ``reserved - chunk >= min_bytes_to_keep``."""
        keep = nonneg(min_bytes_to_keep, "min_bytes_to_keep")
        self._check_alive()
        with self._lock:
            if self._dirty:
                self._settle()
            if self._reserved > keep:
                self._release_granules(keep)
        if instrument.listeners:  # the trace's reserved counter
            instrument.notify("freed", None, self)

    def destroy(self) -> None:
        """``cudaMemPoolDestroy``: memory goes back once its last allocation is freed and proven."""
        self._check_alive()
        if self._is_default:
            raise InvalidValueError("the default memory pool of a device cannot be destroyed")
        with self._lock:
            self._destroyed = True
            self.device._forget_pool(self)
            self._settle()
            self._release_granules(0)
            if self._arena and self._idle():
                self._drop_arena()
        if instrument.listeners:
            instrument.notify("freed", None, self)

    def _reset(self) -> None:
        """Device reset: the backend frees the memory; forget every block."""
        with self._lock:
            for addr, b in self._blocks.items():
                if b.live:
                    _owners.pop(addr, None)
            if self._arena:
                self._finalizer.detach()  # the device reset released the arena
                _arenas.pop(self._arena, None)
            self._blocks.clear()
            self._mapped.clear()
            self._arena = self._top = 0
            self._dirty.clear()
            self._holes = False
            self._ready = _FreeList()
            self._pending.clear()
            self._pstream.clear()
            _busy.discard(self)
            self._reserved = self._used = 0
            self._destroyed = True
