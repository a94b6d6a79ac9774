"""Stream-ordered memory pools (DESIGN.md §3): best-fit blocks, the reuse policy, threshold, trim.

State and invariants (per pool, all guarded by ``_lock``):
- Chunks are reserved from the device (``backend.malloc``): a shared 2 MiB chunk for requests
  of at most 1 MiB, else the request rounded up to a 2 MiB granule. ``reserved`` is the sum of
  chunk sizes. Each chunk is a doubly linked list of blocks that tile it exactly.
- A block is live (allocated, in ``_owners``) or free. A free block is either *pending*: freed
  on stream F at position p (``block.stream``/``block.pos``), indexed in ``_pending[F.id]``;
  or *ready*: its free was proven complete by a host synchronize (``block.stream is None``),
  indexed in ``_ready``. A synchronize promotes the pending blocks it proved.
- Free neighbours coalesce on free only when that loses no ordering knowledge: two ready
  blocks, or two blocks pending on the same stream (tagged with the later position). Just
  before growing, a run of adjacent blocks that are ready or pending on the allocating stream
  A is merged if it fits the request: A may use all of it (step 1 and 2 memory).
- Fast paths (same results, fewer steps): a malloc served by an exact-size block freed on the
  same non-blocking stream, and a free with no same-stream free neighbour.
- ``used`` is the bytes of live blocks (rounded to 512), as CUDA's USED_MEM_CURRENT ("in use by
  the application"); ``used <= reserved`` always. High watermarks only grow, and reset only to
  the current value.
- ``s.malloc(n)`` on stream A takes, in order (each counted in ``stats()``): 1. a block freed
  on A; 2. a ready block; 3. (event dependencies) a block freed on F at p with
  ``clock[A][F] >= p``; 4. (opportunistic) one whose free F has already executed
  (``done[F] >= p``); 5. a new chunk; 6. (internal dependencies) any pending block, after
  enqueueing a wait of A on F at p; 7. ``OutOfMemoryError``. Within a step, best fit wins.
  Between 4 and 5, a run of adjacent free blocks usable by A (ready, or freed on A) that fits
  is merged and used (``reuse_merged``): this avoids growing when only fragmentation prevents
  steps 1-2.
- The release threshold is applied only at synchronize points, after promoting the frees the
  synchronize proved; ``trim_to`` releases down to its argument, whatever the threshold.
"""

from __future__ import annotations

import threading
import weakref
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from . import instrument
from .device import Device
from .errors import (
    InvalidAddressError,
    InvalidHandleError,
    InvalidTypeError,
    InvalidValueError,
    OutOfMemoryError,
)
from .freelist import Block as _Block
from .freelist import FreeList as _FreeList
from .hooks import sync_listeners

if TYPE_CHECKING:

    from .stream import Stream

__all__ = ["MemPool", "MemPoolAttr", "pool_of", "find_pool"]

ALIGN = 512
SMALL_REQUEST = 1 << 20  # requests up to this share small-block chunks
SMALL_CHUNK = 2 << 20
GRANULE = 2 << 20


class MemPoolAttr(IntEnum):
    """Pool attributes, numbered as ``cudaMemPoolAttr`` / ``aclrtMemPoolAttr``."""

    REUSE_FOLLOW_EVENT_DEPENDENCIES = 1
    REUSE_ALLOW_OPPORTUNISTIC = 2
    REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3
    RELEASE_THRESHOLD = 4
    RESERVED_MEM_CURRENT = 5
    RESERVED_MEM_HIGH = 6
    USED_MEM_CURRENT = 7
    USED_MEM_HIGH = 8


_FLAGS = {
    MemPoolAttr.REUSE_FOLLOW_EVENT_DEPENDENCIES: "_follow_events",
    MemPoolAttr.REUSE_ALLOW_OPPORTUNISTIC: "_opportunistic",
    MemPoolAttr.REUSE_ALLOW_INTERNAL_DEPENDENCIES: "_internal",
}

# live pool pointer -> its pool (a pointer always returns to the pool that owns it)
_owners: dict[int, MemPool] = {}
_pools: weakref.WeakSet[MemPool] = weakref.WeakSet()


def find_pool(ptr: int) -> MemPool | None:
    """The pool owning the live allocation that starts at ``ptr``, or None."""
    return _owners.get(ptr)


def pool_of(ptr: int) -> MemPool:
    """The pool owning ``ptr``; raises :class:`InvalidAddressError` for anything else."""
    pool = _owners.get(ptr)
    if pool is None:
        raise InvalidAddressError(
            f"free of {hex(ptr)}: not a live stream-ordered allocation (double free, an interior "
            "pointer, or memory from srt.malloc, which srt.free releases)"
        )
    return pool


def _round(n: int) -> int:
    return (max(n, 1) + ALIGN - 1) // ALIGN * ALIGN


def _flag(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise InvalidValueError(f"{what} must be a bool (or 0/1), got {value!r}")


def _nonneg(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidTypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < 0:
        raise InvalidValueError(f"{what} must be >= 0, got {value}")
    return value


class MemPool:
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
        self.max_size = _nonneg(max_size, "max_size")
        self._threshold = _nonneg(release_threshold, "release_threshold")
        self._follow_events = _flag(reuse_follow_event_dependencies, "reuse_follow_event_dependencies")
        self._opportunistic = _flag(reuse_allow_opportunistic, "reuse_allow_opportunistic")
        self._internal = _flag(reuse_allow_internal_dependencies, "reuse_allow_internal_dependencies")
        self._is_default = False
        self._destroyed = False
        self._lock = threading.Lock()
        self._chunks: dict[int, int] = {}  # base -> size
        self._blocks: dict[int, _Block] = {}  # addr -> block (live and free)
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
        if cls is MemPool and Device(device)._impl.native_pools:
            from .native_pool import NativeMemPool  # the backend's own pools (cudaMemPool_t)

            return object.__new__(NativeMemPool)
        return object.__new__(cls)

    @classmethod
    def _make_default(cls, device: Device) -> MemPool:
        if device._impl.native_pools:
            from .native_pool import NativeMemPool

            return NativeMemPool._make_default(device)
        pool = cls(device)
        pool._is_default = True
        return pool

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
        attr = _attr(attr)
        if attr in _FLAGS:
            return int(getattr(self, _FLAGS[attr]))
        return {
            MemPoolAttr.RELEASE_THRESHOLD: self._threshold,
            MemPoolAttr.RESERVED_MEM_CURRENT: self._reserved,
            MemPoolAttr.RESERVED_MEM_HIGH: self._reserved_high,
            MemPoolAttr.USED_MEM_CURRENT: self._used,
            MemPoolAttr.USED_MEM_HIGH: self._used_high,
        }[attr]

    def set_attr(self, attr: MemPoolAttr | int, value: Any) -> None:
        """``cudaMemPoolSetAttribute``: the three flags, the threshold, and ``*_HIGH`` = 0 (reset)."""
        attr = _attr(attr)
        self._check_alive()
        if attr in _FLAGS:
            setattr(self, _FLAGS[attr], _flag(value, attr.name))
        elif attr is MemPoolAttr.RELEASE_THRESHOLD:
            self._threshold = _nonneg(value, "release_threshold")
        elif attr in (MemPoolAttr.RESERVED_MEM_HIGH, MemPoolAttr.USED_MEM_HIGH):
            if _nonneg(value, attr.name) != 0:
                raise InvalidValueError(f"{attr.name} can only be reset, by writing 0")
            with self._lock:
                if attr is MemPoolAttr.RESERVED_MEM_HIGH:
                    self._reserved_high = self._reserved
                else:
                    self._used_high = self._used
        else:
            raise InvalidValueError(f"{attr.name} is read-only")

    reuse_follow_event_dependencies = property(
        lambda self: self._follow_events,
        lambda self, v: self.set_attr(MemPoolAttr.REUSE_FOLLOW_EVENT_DEPENDENCIES, v),
        doc="Step 3: reuse blocks whose free is ordered before the allocation by events.",
    )
    reuse_allow_opportunistic = property(
        lambda self: self._opportunistic,
        lambda self, v: self.set_attr(MemPoolAttr.REUSE_ALLOW_OPPORTUNISTIC, v),
        doc="Step 4: reuse blocks whose free has already executed, without a dependency.",
    )
    reuse_allow_internal_dependencies = property(
        lambda self: self._internal,
        lambda self, v: self.set_attr(MemPoolAttr.REUSE_ALLOW_INTERNAL_DEPENDENCIES, v),
        doc="Step 6: reuse a pending block by making the allocating stream wait on its free.",
    )
    release_threshold = property(
        lambda self: self._threshold,
        lambda self, v: self.set_attr(MemPoolAttr.RELEASE_THRESHOLD, v),
        doc="Reserved bytes kept at a synchronize before free chunks are released.",
    )
    reserved_mem_current = property(
        lambda self: self._reserved,
        lambda self, v: self.set_attr(MemPoolAttr.RESERVED_MEM_CURRENT, v),
        doc="Bytes reserved from the device (read-only).",
    )
    reserved_mem_high = property(
        lambda self: self._reserved_high,
        lambda self, v: self.set_attr(MemPoolAttr.RESERVED_MEM_HIGH, v),
        doc="High watermark of reserved bytes; write 0 to reset it to the current value.",
    )
    used_mem_current = property(
        lambda self: self._used,
        lambda self, v: self.set_attr(MemPoolAttr.USED_MEM_CURRENT, v),
        doc="Bytes of live allocations (read-only).",
    )
    used_mem_high = property(
        lambda self: self._used_high,
        lambda self, v: self.set_attr(MemPoolAttr.USED_MEM_HIGH, v),
        doc="High watermark of used bytes; write 0 to reset it to the current value.",
    )

    def stats(self) -> dict[str, int]:
        """The eight attributes, the per-step reuse counters, and ``largest_free_block``."""
        with self._lock:
            out = {a.name.lower(): self.get_attr(a) for a in MemPoolAttr}
            out.update(self._stats)
            out["alloc_count"] += self._fast_allocs
            out["reuse_same_stream"] += self._fast_allocs
            out["free_count"] += self._fast_frees
            largest = self._ready.largest()
            for fl in self._pending.values():
                largest = max(largest, fl.largest())
            out["largest_free_block"] = largest
            out["live_allocations"] = sum(1 for b in self._blocks.values() if b.live)
            out["chunks"] = len(self._chunks)
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
                if lst:
                    b = lst.pop()
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
        if stream._capture is not None:
            return stream._capture.add_mem_alloc(stream, self, nbytes)
        size = _round(nbytes)
        if not stream.non_blocking:
            # The allocation is a stream operation, as the free is (see ``_free``): legacy
            # default-stream ordering applies before it. Without this, a block freed on the other
            # side of the implicit barrier looked unordered (clock not yet merged) and the pool
            # grew instead of reusing it by the event-dependency rule (DESIGN.md §2, §3 step 3).
            stream._implicit()
        with self._lock:
            block = self._find(stream, size, nbytes)
            if block.size - size >= ALIGN:
                self._split(block, size)
            block.live = True
            block.stream = None
            _owners[block.addr] = self
            self._used += block.size
            if self._used > self._used_high:
                self._used_high = self._used
            self._stats["alloc_count"] += 1
        return block.addr

    def _find(self, a: Stream, size: int, requested: int) -> _Block:
        st = self._stats
        own = self._pending.get(a.id)
        if own is not None:
            b = own.best(size)
            if b is not None:
                own.remove(b)
                st["reuse_same_stream"] += 1
                return b
        b = self._ready.best(size)
        if b is not None:
            self._ready.remove(b)
            st["reuse_after_sync"] += 1
            return b
        others = [(sid, fl) for sid, fl in self._pending.items() if sid != a.id and fl.count]
        if others and self._follow_events:
            clock = a._clock
            b = self._best_of(others, size, lambda sid: clock.get(sid, 0))
            if b is not None:
                st["reuse_event_dependency"] += 1
                return b
        if others and self._opportunistic:
            b = self._best_of(others, size, lambda sid: self._pstream[sid]._q.done)
            if b is not None:
                st["reuse_opportunistic"] += 1
                return b
        b = self._merge_for(a, size)
        if b is not None:
            st["reuse_merged"] += 1
            return b
        b = self._grow(size)
        if b is not None:
            st["grow_count"] += 1
            return b
        if others and self._internal:
            b = self._best_of(others, size, None)
            if b is not None:
                f = b.stream
                # a real wait: later work on A follows the free (and what the free followed)
                a._order_after(f, b.pos, b.clock or {f.id: b.pos})
                st["reuse_internal_dependency"] += 1
                return b
        st["oom_count"] += 1
        limit = f"max_size {self.max_size}" if self.max_size else "no pool limit"
        free, total = self.device.memory_info()
        raise OutOfMemoryError(
            f"{self.device.name}: stream-ordered allocation of {requested} bytes ({size} after "
            f"rounding to {ALIGN}) failed: pool reserves "
            f"{self._reserved} bytes ({self._used} used), {limit}; device has {free} of {total} "
            "bytes free"
        )

    def _merge_for(self, a: Stream, size: int) -> _Block | None:
        """Before growing: merge the smallest run of adjacent blocks, each ready or freed on
        ``a``, that fits ``size``. Both kinds are usable by ``a`` (steps 1-2), so the merged
        block is tagged as freed on ``a`` (it must not become usable by other streams)."""
        best: list[_Block] | None = None
        best_size = 0
        for base in self._chunks:
            run: list[_Block] = []
            total = 0
            b = self._blocks.get(base)
            while b is not None:
                if not b.live and (b.stream is None or b.stream is a):
                    run.append(b)
                    total += b.size
                    while total - run[0].size >= size:  # shortest run ending here
                        total -= run.pop(0).size
                    if total >= size and len(run) > 1 and (best is None or total < best_size):
                        best, best_size = list(run), total
                else:
                    run, total = [], 0
                b = b.next
        if best is None:
            return None
        pieces = [(b.addr, b.size, b.stream, b.pos) for b in best]
        for b in best:
            self._remove_free(b)
        lo = best[0]
        lo.pos = max((b.pos for b in best if b.stream is a), default=0)
        lo.stream = a
        for hi in best[1:]:
            lo.size += hi.size
            lo.next = hi.next
            if hi.next is not None:
                hi.next.prev = lo
            del self._blocks[hi.addr]
            hi.stream = None
        # give the part past the request back with its original tags (ready stays ready)
        end = lo.addr + lo.size
        lo.size = size
        parts: list[list] = []
        for addr, psize, stream, pos in pieces:
            start = max(addr, lo.addr + size)
            if start >= addr + psize:
                continue
            if parts and parts[-1][2] is stream:  # same kind next to each other: one block
                parts[-1][1] = addr + psize - parts[-1][0]
                parts[-1][3] = max(parts[-1][3], pos)
            else:
                parts.append([start, addr + psize - start, stream, pos])
        tail = lo
        created = []
        for start, psize, stream, pos in parts:
            rest = _Block(start, psize, lo.chunk)
            rest.stream, rest.pos = stream, pos
            rest.prev, rest.next = tail, tail.next
            if tail.next is not None:
                tail.next.prev = rest
            tail.next = rest
            self._blocks[start] = rest
            created.append(rest)
            tail = rest
        assert tail.addr + tail.size == end
        lo.live = True  # taken: the pieces must not coalesce back into it
        for r in created:
            self._insert_free(self._coalesce(r))
        return lo

    def _best_of(self, others: list, size: int, limit_of: Any) -> _Block | None:
        best: _Block | None = None
        for sid, fl in others:
            if limit_of is None:
                b = fl.best(size)
            else:
                lim = limit_of(sid)
                b = fl.best(size, lambda blk, lim=lim: blk.pos <= lim)
            if b is not None and (best is None or b.size < best.size):
                best = b
        if best is not None:
            self._pending[best.stream.id].remove(best)
        return best

    def _grow(self, size: int) -> _Block | None:
        chunk = SMALL_CHUNK if size <= SMALL_REQUEST else (size + GRANULE - 1) // GRANULE * GRANULE
        if self.max_size and self._reserved + chunk > self.max_size:
            chunk = size  # the granule does not fit under the limit; the request itself may
            if self._reserved + chunk > self.max_size:
                return None
        try:
            base = self.device._impl.malloc(chunk)
        except OutOfMemoryError:
            if chunk == size:
                return None
            try:
                chunk = size
                base = self.device._impl.malloc(chunk)
            except OutOfMemoryError:
                return None
        self._chunks[base] = chunk
        self._reserved += chunk
        if self._reserved > self._reserved_high:
            self._reserved_high = self._reserved
        b = _Block(base, chunk, base)
        self._blocks[base] = b
        from .backends.cpu import SPACE

        arena = SPACE.get(base)
        if arena is not None:  # cpu backend: enqueue-time copies/memsets check block bounds
            arena.sub = lambda ptr, nbytes, base=base: self._check_range(base, ptr, nbytes)
        return b

    def _check_range(self, chunk: int, ptr: int, nbytes: int) -> None:
        """The arena's ``sub`` hook: ``[ptr, ptr + nbytes)`` must lie in one live block."""
        with self._lock:
            b = self._blocks.get(ptr)
            if b is None or b.chunk != chunk:  # an interior pointer: walk the chunk's blocks
                b = self._blocks.get(chunk)
                while b is not None and b.addr + b.size <= ptr:
                    b = b.next
            if b is None or not b.live or ptr + nbytes > b.addr + b.size:
                where = (f"its block [{hex(b.addr)}, {hex(b.addr + b.size)})" if b is not None
                         and b.live else "no live stream-ordered allocation")
                raise InvalidAddressError(
                    f"range {hex(ptr)}+{nbytes} is not inside one live pool allocation: "
                    f"{hex(ptr)} is in {where}"
                )

    def _split(self, b: _Block, size: int) -> None:
        rest = _Block(b.addr + size, b.size - size, b.chunk)
        rest.stream, rest.pos, rest.clock = b.stream, b.pos, b.clock
        rest.prev, rest.next = b, b.next
        if b.next is not None:
            b.next.prev = rest
        b.next = rest
        b.size = size
        self._blocks[rest.addr] = rest
        self._insert_free(rest)

    def _insert_free(self, b: _Block) -> None:
        if b.stream is None:
            self._ready.add(b)
        else:
            sid = b.stream.id
            fl = self._pending.get(sid)
            if fl is None:
                fl = self._pending[sid] = _FreeList()
                self._pstream[sid] = b.stream
            fl.add(b)

    def _remove_free(self, b: _Block) -> None:
        if b.stream is None:
            self._ready.remove(b)
        else:
            self._pending[b.stream.id].remove(b)

    def _coalesce(self, b: _Block) -> _Block:
        """Merge ``b`` (free, not indexed) with free neighbours of the same kind."""
        for nb in (b.prev, b.next):
            if nb is None or nb.live or nb.stream is not b.stream:
                continue
            self._remove_free(nb)
            lo, hi = (nb, b) if nb.addr < b.addr else (b, nb)
            lo.size += hi.size
            if hi.pos > lo.pos:  # same stream: the later free's clock knows more
                lo.pos, lo.clock = hi.pos, hi.clock
            lo.next = hi.next
            if hi.next is not None:
                hi.next.prev = lo
            del self._blocks[hi.addr]
            hi.stream = None  # a dead block
            b = lo
        return b

    # -- free -----------------------------------------------------------------------------------
    def _free(self, stream: Stream, ptr: int) -> None:
        if not stream._slow and stream.device is self.device and not self._destroyed:
            lock = self._lock
            lock.acquire()  # see _malloc
            try:
                b = self._blocks.get(ptr)
                if (b is not None and b.live and (b.prev is None or b.prev.live
                        or b.prev.stream is not stream) and (b.next is None or b.next.live
                        or b.next.stream is not stream)):
                    # fast path: nothing to coalesce with (no free neighbour of this stream)
                    del _owners[ptr]
                    b.live = False
                    b.stream = stream
                    b.pos = stream._pos
                    if instrument.listeners:
                        b.clock = stream._snapshot()
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
        if stream._capture is not None:
            return stream._capture.add_mem_free(stream, ptr)
        if not stream.non_blocking:
            stream._implicit()  # the free is a stream operation: legacy ordering applies
        self._release_block(ptr, stream, stream._pos)

    def _free_now(self, ptr: int) -> None:
        """Free after a device synchronize (``srt.free`` on pool memory): ready at once."""
        self._release_block(ptr, None, 0)
        self._on_sync()

    def _release_block(self, ptr: int, stream: Stream | None, pos: int) -> None:
        with self._lock:
            b = self._blocks.get(ptr)
            if b is None or not b.live or _owners.get(ptr) is not self:
                raise InvalidAddressError(f"free of {hex(ptr)}: not a live allocation of {self!r}")
            del _owners[ptr]
            b.live = False
            b.stream = stream
            b.pos = pos
            b.clock = stream._snapshot() if stream is not None and instrument.listeners else None
            self._used -= b.size
            self._stats["free_count"] += 1
            self._insert_free(self._coalesce(b))
            if self._destroyed:
                self._release_chunks(0)

    # -- synchronize points, threshold, trim -----------------------------------------------------
    def _on_sync(self) -> None:
        """Promote the frees a host synchronize proved, then apply the release threshold."""
        with self._lock:
            for sid in list(self._pending):
                fl = self._pending[sid]
                host = self._pstream[sid]._host
                for b in [b for b in fl.blocks() if b.pos <= host]:
                    fl.remove(b)
                    b.stream = None
                    self._ready.add(self._coalesce(b))
                if not fl.count:
                    del self._pending[sid], self._pstream[sid]
            keep = 0 if self._destroyed else self._threshold
            if self._reserved > keep:
                self._release_chunks(keep)

    def _release_chunks(self, keep: int) -> None:
        for b in [b for b in self._ready.blocks() if b.prev is None and b.next is None]:
            if self._reserved <= keep:
                break
            if self._reserved - b.size < keep:
                continue
            self._ready.remove(b)
            del self._blocks[b.addr]
            del self._chunks[b.addr]
            self.device._impl.free(b.addr)
            self._reserved -= b.size
            self._stats["release_count"] += 1

    def trim_to(self, min_bytes_to_keep: int) -> None:
        """Release entirely free, sync-proven chunks while ``reserved - chunk >= min_bytes_to_keep``."""
        keep = _nonneg(min_bytes_to_keep, "min_bytes_to_keep")
        self._check_alive()
        with self._lock:
            if self._reserved > keep:
                self._release_chunks(keep)

    def destroy(self) -> None:
        """``cudaMemPoolDestroy``: memory goes back once its last allocation is freed and proven."""
        self._check_alive()
        if self._is_default:
            raise InvalidValueError("the default memory pool of a device cannot be destroyed")
        with self._lock:
            self._destroyed = True
            if self.device._pool is self:
                self.device._pool = None
            self._release_chunks(0)

    def _reset(self) -> None:
        """Device reset: the backend frees the memory; forget every block."""
        with self._lock:
            for addr, b in self._blocks.items():
                if b.live:
                    _owners.pop(addr, None)
            self._blocks.clear()
            self._chunks.clear()
            self._ready = _FreeList()
            self._pending.clear()
            self._pstream.clear()
            self._reserved = self._used = 0
            self._destroyed = True


def _attr(attr: Any) -> MemPoolAttr:
    try:
        return MemPoolAttr(attr)
    except ValueError:
        raise InvalidValueError(f"unknown memory pool attribute {attr!r} (1-8)") from None


def _on_any_sync(device: Device) -> None:
    # A synchronize of one device can prove frees of streams of another (events carry clocks).
    for pool in list(_pools):
        if pool._pending or pool._destroyed or pool._reserved > pool._threshold:
            pool._on_sync()


sync_listeners.append(_on_any_sync)


def usable_bytes(ptr: int) -> int | None:
    """Bytes from ``ptr`` to the end of its live allocation (a pool block starting at ``ptr``,
    or any ``srt.malloc`` allocation containing it); None when ``ptr`` is not in one."""
    pool = _owners.get(ptr)
    if pool is not None:
        b = pool._blocks.get(ptr)
        return b.size if b is not None and b.live else None
    from .backends.cpu import SPACE

    alloc = SPACE.find(ptr)
    if alloc is None or alloc.device < 0:
        return None
    for p in _pools:  # a pool chunk is not itself an allocation the user owns
        if alloc.base in p._chunks:
            return None
    return alloc.end - ptr
