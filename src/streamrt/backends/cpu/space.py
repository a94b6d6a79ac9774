"""The cpu backend's address space: every cpu allocation, by base address.

State and invariants:
- Every allocation (device memory of any cpu device, pool arenas, graph-memory ranges, pinned
  host memory) is a numpy ``uint8`` buffer at an integer base address, 512-byte aligned, never
  0, in a window per device (``(index + 1) << 48``; pinned host memory at ``0x7F << 48``,
  above any real address, so cpu pointers never collide with another backend's). Allocations
  never overlap and are separated by a guard gap, so running off the end of one never lands in
  the next. ``_allocs`` maps base -> allocation in a sorted dict: lookups are O(log n), under
  ``_lock`` (finalizers' releases wait in ``reclaim`` while it is held).
- Views: :meth:`AddressSpace.array` caches numpy views by ``(ptr, shape, dtype, readonly)``
  and keeps the last one made at each address in the asking device's ``last`` dict (its
  kernel contexts' fast path; one per device, ``_lasts``: a view checked for one device's
  reach is never handed to another's); all are cleared in place whenever memory goes away or
  is remapped (or a peer access is taken back), and ``generation`` is bumped before and
  after, so a cached view never outlives its memory and holders of older views know to remake
  them. A view maker (no lock: each step is one dict operation) reads ``generation``
  before looking and takes its entry out again if it moved: a view made while another thread
  frees is cleared (added before the bump) or taken out (added after it), never left cached.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from sortedcontainers import SortedDict

from ...errors import InvalidAddressError, InvalidTypeError, InvalidValueError, OutOfMemoryError
from ...reclaim import Reclaim
from ...validate import is_int
from ..base import MemRange

ALIGN = 512
_GUARD = ALIGN  # gap between consecutive allocations
_WINDOW = 1 << 48  # addresses of one device (and of pinned host memory)
HOST_DEVICE = -1  # device index of pinned host memory
HOST_WINDOW = 0x7F  # ``ptr >> 48`` of pinned host memory; device N's is N + 1


def round_up(n: int, a: int = ALIGN) -> int:
    """``n`` rounded up to a multiple of ``a``."""
    return (n + a - 1) // a * a


class Allocation:
    """One buffer: ``size`` usable bytes at ``base`` on ``device`` (-1 = pinned host).

    ``kind`` is a :class:`~streamrt.backends.base.MemRange` kind; ``check`` is set for a pool
    arena: ``check(ptr, nbytes)`` raises :class:`InvalidAddressError` unless the range lies in
    one live block of the pool.
    """

    __slots__ = ("base", "size", "buf", "device", "check", "kind")

    def __init__(self, base: int, size: int, device: int, kind: str,
                 buf: np.ndarray | None = None) -> None:
        self.base = base
        self.size = size
        self.device = device
        self.kind = kind
        # graph memory has no backing until an executable graph maps it
        self.buf: np.ndarray | None = None if kind == "graph" else (
            buf if buf is not None else np.zeros(size, np.uint8))
        self.check: Callable[[int, int], None] | None = None

    @property
    def end(self) -> int:
        """One past the last byte."""
        return self.base + self.size

    def range(self) -> MemRange:
        """This allocation as the backend contract describes one."""
        return MemRange(self.base, self.size, self.device, self.kind, self.buf is not None)


class AddressSpace:
    """All cpu-backend allocations, by base address."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reclaim = Reclaim(self._lock)  # finalizers' releases (see Reclaim)
        self._allocs: SortedDict = SortedDict()
        self._next: dict[int, int] = {}
        self._views: dict[tuple, np.ndarray] = {}
        # per device: ptr -> (shape, dtype, writable, read-only) made last (see base.LAST_VIEWS)
        self._lasts: list[dict[int, tuple[Any, Any, Any, Any]]] = []
        self.generation = 0  # bumped whenever memory goes away or is remapped

    def allocate(self, device: int, nbytes: int, kind: str = "malloc", *,
                 buf: np.ndarray | None = None) -> Allocation:
        """A new allocation of at least ``nbytes`` in ``device``'s window."""
        size = round_up(max(nbytes, 1))
        with self._lock:
            # 256 TiB of addresses per device: pool arenas reserve whole device capacities
            start = (HOST_WINDOW << 48) if device == HOST_DEVICE else (device + 1) << 48
            base = self._next.get(device, start)
            if base + size + _GUARD <= start + _WINDOW:
                self._next[device] = base + size + _GUARD
            else:  # a long-running process used the window up: reuse addresses freed since
                base = self._gap(start, size + _GUARD)
            alloc = Allocation(base, size, device, kind, buf=buf)
            self._allocs[base] = alloc
        self.reclaim.drain()
        return alloc

    def register(self, device: int, buf: np.ndarray) -> Allocation:
        """Map foreign host memory (``buf``, a ``uint8`` view of it) at a new address of
        ``device``'s window, zero-copy: kind "external", exactly ``buf.size`` bytes."""
        alloc = self.allocate(device, buf.size, "external", buf=buf)
        alloc.size = buf.size  # (addresses are reserved rounded up; the bounds are the buffer's)
        return alloc

    def _gap(self, start: int, need: int) -> int:
        """The lowest free ``need`` bytes (a guard included) of the window at ``start``: never
        an address of the next device's window, where a lookup would find the wrong device."""
        at = start
        for base in self._allocs.irange(start, start + _WINDOW, inclusive=(True, False)):
            if base - at >= need:
                return at
            at = self._allocs[base].end + _GUARD
        if start + _WINDOW - at >= need:
            return at
        raise OutOfMemoryError(f"no {need} bytes of addresses left in the window at {hex_(start)}")

    def last_views(self) -> dict[int, tuple[Any, Any, Any, Any]]:
        """A new device's dict of the views made last (cleared with every other)."""
        last: dict[int, tuple[Any, Any, Any, Any]] = {}
        with self._lock:
            self._lasts.append(last)
        return last

    def _changed(self) -> None:
        """Memory went away or was remapped (caller holds the lock): drop every cached view, in
        place (the kernel contexts' fast path holds its device's ``last`` itself)."""
        # bumped before (a view maker adding an entry after it takes it out again) and after
        # (whoever reads the final count, as a graph exec remaking its views, finds them gone)
        self.generation += 1
        self._views.clear()
        for last in self._lasts:
            last.clear()
        self.generation += 1

    def forget_views(self) -> None:
        """Drop every cached view (a peer access was taken back: views made under it go)."""
        with self._lock:
            self._changed()
        self.reclaim.drain()

    def unreserve(self, ptr: int) -> None:
        """Drop a graph-memory range (its graph allocation is gone)."""
        with self._lock:
            alloc = self._allocs.get(ptr)
            if alloc is not None and alloc.kind == "graph":
                del self._allocs[ptr]
                self._changed()
        self.reclaim.drain()

    def map_reserved(self, ptr: int, buf: np.ndarray | None) -> None:
        """Back a graph-memory range with ``buf`` (or unmap it with None)."""
        with self._lock:
            alloc = self._allocs[ptr]
            assert alloc.kind == "graph" and (buf is None or buf.size == alloc.size)
            alloc.buf = buf
            self._changed()
        self.reclaim.drain()

    def release(self, ptr: int) -> Allocation:
        """Forget the allocation starting at ``ptr``."""
        with self._lock:
            alloc = self._allocs.pop(ptr, None)
            if alloc is None:
                raise InvalidAddressError(f"free of {hex_(ptr)}: not the start of a live allocation")
            self._changed()
        self.reclaim.drain()
        return alloc

    def get(self, ptr: int) -> Allocation | None:
        """The allocation starting exactly at ``ptr``, or None."""
        return self._allocs.get(ptr)

    def find(self, ptr: int) -> Allocation | None:
        """The allocation containing ``ptr``, or None (O(log n))."""
        allocs = self._allocs
        with self._lock:
            i = allocs.bisect_right(ptr)
            if i == 0:
                return None
            alloc = allocs.peekitem(i - 1)[1]
        return alloc if ptr < alloc.end else None

    def span(self, ptr: int, nbytes: int, *, strict: bool = True) -> np.ndarray:
        """A writable ``uint8`` view of ``[ptr, ptr + nbytes)``; the range must lie in one allocation.

        ``strict`` (enqueue-time checks: copies, memsets) also requires the range to lie in one
        live pool block when the allocation is a pool arena. Kernel views are checked at run
        time, when the host may already have freed the block in stream order, so they are
        checked against the arena only; the sanitizer checks them against stream-ordered
        lifetimes.
        """
        if type(ptr) is not int:
            ptr = as_ptr(ptr)
        alloc = self.find(ptr)
        if alloc is None:
            raise InvalidAddressError(f"{hex_(ptr)} is not inside any live allocation")
        off = ptr - alloc.base
        if alloc.buf is None:
            raise InvalidAddressError(
                f"{hex_(ptr)} is graph memory that no live executable graph maps (instantiate "
                "the graph, or keep its exec alive)"
            )
        if nbytes < 0 or off + nbytes > alloc.size:
            raise InvalidAddressError(
                f"range {hex_(ptr)}+{nbytes} leaves its allocation "
                f"[{hex_(alloc.base)}, {hex_(alloc.end)}) by {off + nbytes - alloc.size} bytes"
            )
        if strict and alloc.check is not None:
            alloc.check(ptr, nbytes)
        return alloc.buf[off : off + nbytes]

    def array(self, ptr: int, shape: Any, dtype: Any, readonly: bool,
              last_views: dict[int, tuple[Any, Any, Any, Any]] | None = None) -> np.ndarray:
        """A numpy view of device memory (cached, and kept in ``last_views``, the asking
        device's, if given); bounds-checked against its allocation."""
        gen = self.generation  # before looking: a change after it takes out what is added below
        try:
            key = (ptr, shape, dtype, readonly)
            view = self._views.get(key)
        except TypeError:  # unhashable shape (a list): normalise, no caching
            key, view = None, None
        if view is None:
            dt = np.dtype(dtype)
            shp = (shape,) if isinstance(shape, int | np.integer) else tuple(int(d) for d in shape)
            if any(d < 0 for d in shp):
                raise InvalidValueError(f"negative dimension in shape {shp}")
            raw = self.span(ptr, math.prod(shp) * dt.itemsize, strict=False)
            view = raw.view(dt).reshape(shp)
            if readonly:
                view.flags.writeable = False
            if key is None:
                return view
            if len(self._views) > 8192:
                self._views.clear()
                if last_views is not None:
                    last_views.clear()
            self._views[key] = view
        if last_views is not None:  # kept beside it: the other kind of the same shape and dtype
            last = last_views.get(ptr)
            if last is None or last[1] is not dtype or last[0] != shape:
                last = (shape, dtype, None, None)
            last_views[ptr] = ((shape, dtype, last[2], view) if readonly
                               else (shape, dtype, view, last[3]))
        if self.generation != gen:  # memory went away meanwhile: this view may be of it
            assert key is not None  # (an uncached view returned above)
            self._views.pop(key, None)
            if last_views is not None:
                last_views.pop(ptr, None)
        return view

    def allocations(self, device: int | None = None) -> list[Allocation]:
        """Backed allocations (not graph-memory ranges), of one device or all."""
        with self._lock:
            return [a for a in self._allocs.values()
                    if a.kind != "graph" and (device is None or a.device == device)]


def hex_(ptr: Any) -> str:
    """A pointer for a message (whatever it is)."""
    return hex(ptr) if isinstance(ptr, int) else repr(ptr)


def as_ptr(ptr: Any) -> int:
    """``ptr`` as an int pointer, or InvalidTypeError."""
    if is_int(ptr):
        return int(ptr)
    raise InvalidTypeError(f"a device pointer must be an int, not {type(ptr).__name__}")


SPACE = AddressSpace()
