"""The cpu backend: a device with its own address space, one worker thread per stream.

State and invariants:
- Address space: every allocation (device memory of any cpu device, pinned host memory) is a
  numpy ``uint8`` arena at an integer base address, 512-byte aligned, never 0, in a range per
  device (``(index + 1) << 48``; pinned host memory at ``0x7F << 48``, above any real
  address, so cpu pointers never collide with another backend's). Allocations never
  overlap and are separated by a guard gap, so running off the end of one never lands in the
  next. ``_allocs`` maps base -> allocation in a sorted dict: lookups are O(log n).
- Views: ``array()`` caches numpy views by ``(ptr, shape, dtype, readonly)``; the cache is
  dropped whenever an arena is released, so a cached view never outlives its allocation.
- Queues: a worker thread pops ``(fn, args)`` pairs from a deque and runs them in order;
  ``done`` counts completed operations. The worker sleeps only when the deque is empty, and a
  host thread wakes it only when it is asleep (the common enqueue is a deque append).
- Delay injection: ``STREAMRT_CPU_DELAY_US=N`` (or :func:`set_delay_us`) makes each worker
  sleep a random 0..N microseconds before each operation, so that a missing ``wait`` in a
  program turns into a wrong result instead of passing by luck.
"""

from __future__ import annotations

import mmap
import os
import queue
import random
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
from sortedcontainers import SortedDict

from .. import instrument
from ..errors import (
    InvalidAddressError,
    InvalidTypeError,
    InvalidValueError,
    NotPermittedError,
    NotReadyError,
    OutOfMemoryError,
)
from ..reclaim import Reclaim
from ..validate import env_int, is_int
from .base import Backend, DeviceImpl, MemRange, Queue

ALIGN = 512
_GUARD = ALIGN  # gap between consecutive allocations
_WINDOW = 1 << 48  # addresses of one device (and of pinned host memory)
HOST_DEVICE = -1  # device index of pinned host memory
_NEVER = float("inf")
# reserve addresses without committing swap (Linux's value; Python < 3.13 does not export it)
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)


def _round_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


_delay_us = env_int("STREAMRT_CPU_DELAY_US", 0)


def set_delay_us(us: int) -> int:
    """Set the worker delay injection (0 = off); returns the previous value."""
    global _delay_us
    if not is_int(us):
        raise InvalidTypeError(f"the delay must be an int of microseconds, not {us!r}")
    if us < 0:
        raise InvalidValueError(f"the delay must be >= 0 microseconds, got {us}")
    prev, _delay_us = _delay_us, int(us)
    return prev


def delay_us() -> int:
    """Current worker delay injection in microseconds (0 = off)."""
    return _delay_us


def physical_memory() -> int:
    """Bytes of physical RAM on this machine."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 16 << 30


class Allocation:
    """One arena: ``size`` usable bytes at ``base`` on ``device`` (-1 = pinned host).

    ``sub`` is set when a pool sub-allocates the arena: ``sub(ptr, nbytes)`` raises
    :class:`InvalidAddressError` unless the range lies in one live block.
    """

    __slots__ = ("base", "size", "buf", "device", "sub", "virtual")

    def __init__(self, base: int, size: int, device: int, *, virtual: bool = False,
                 buf: np.ndarray | None = None) -> None:
        self.base = base
        self.size = size
        self.device = device
        # a virtual range (graph memory) has no backing until an executable graph maps it
        self.virtual = virtual
        self.buf: np.ndarray | None = None if virtual else (
            buf if buf is not None else np.zeros(size, np.uint8))
        self.sub: Callable[[int, int], None] | None = None

    @property
    def end(self) -> int:
        return self.base + self.size


class AddressSpace:
    """All cpu-backend allocations, by base address."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reclaim = Reclaim(self._lock)  # finalizers' releases (see Reclaim)
        self._allocs: SortedDict = SortedDict()
        self._next: dict[int, int] = {}
        self._views: dict[tuple, np.ndarray] = {}
        self._last: dict[int, tuple] = {}  # ptr -> (shape, dtype, readonly, view) last made
        # bumped whenever memory goes away or is remapped: views made before may be stale
        self.generation = 0

    def allocate(self, device: int, nbytes: int, *, virtual: bool = False,
                 buf: np.ndarray | None = None) -> Allocation:
        size = _round_up(max(nbytes, 1))
        with self._lock:
            # 256 TiB of addresses per device: pool arenas reserve whole device capacities
            start = (0x7F << 48) if device == HOST_DEVICE else (device + 1) << 48
            base = self._next.get(device, start)
            if base + size + _GUARD <= start + _WINDOW:
                self._next[device] = base + size + _GUARD
            else:  # a long-running process used the window up: reuse addresses freed since
                base = self._gap(start, size + _GUARD)
            alloc = Allocation(base, size, device, virtual=virtual, buf=buf)
            self._allocs[base] = alloc
        self.reclaim.drain()
        return alloc

    def _gap(self, start: int, need: int) -> int:
        """The lowest free ``need`` bytes (a guard included) of the window at ``start``: never
        an address of the next device's window, where ``device_of`` would find the wrong one."""
        at = start
        for base in self._allocs.irange(start, start + _WINDOW, inclusive=(True, False)):
            if base - at >= need:
                return at
            at = self._allocs[base].end + _GUARD
        if start + _WINDOW - at >= need:
            return at
        raise OutOfMemoryError(f"no {need} bytes of addresses left in the window at {_hex(start)}")

    def reserve(self, device: int, nbytes: int) -> Allocation:
        """Reserve a virtual range with no backing (graph memory)."""
        return self.allocate(device, nbytes, virtual=True)

    def unreserve(self, ptr: int) -> None:
        """Drop a virtual range (its graph allocation is gone)."""
        with self._lock:
            alloc = self._allocs.get(ptr)
            if alloc is not None and alloc.virtual:
                del self._allocs[ptr]
                self._views.clear()
                self._last.clear()
                self.generation += 1
        self.reclaim.drain()

    def map_reserved(self, ptr: int, buf: np.ndarray | None) -> None:
        """Back a virtual range with ``buf`` (or unmap it with None)."""
        with self._lock:
            alloc = self._allocs[ptr]
            assert alloc.virtual and (buf is None or buf.size == alloc.size)
            alloc.buf = buf
            self._views.clear()
            self._last.clear()
            self.generation += 1
        self.reclaim.drain()

    def release(self, ptr: int) -> Allocation:
        with self._lock:
            alloc = self._allocs.pop(ptr, None)
            if alloc is None:
                raise InvalidAddressError(f"free of {_hex(ptr)}: not the start of a live allocation")
            # clear in place: kernel contexts hold the bound ``get`` of these dicts
            self._views.clear()
            self._last.clear()
            self.generation += 1
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
        live pool block when the arena is a pool chunk. Kernel views are checked at run time,
        when the host may already have freed the block in stream order, so they are checked
        against the arena only; the sanitizer checks them against stream-ordered lifetimes.
        """
        if type(ptr) is not int:
            ptr = _as_ptr(ptr)
        alloc = self.find(ptr)
        if alloc is None:
            raise InvalidAddressError(f"{_hex(ptr)} is not inside any live allocation")
        off = ptr - alloc.base
        if alloc.buf is None:
            raise InvalidAddressError(
                f"{_hex(ptr)} is graph memory that no live executable graph maps (instantiate "
                "the graph, or keep its exec alive)"
            )
        if nbytes < 0 or off + nbytes > alloc.size:
            raise InvalidAddressError(
                f"range {_hex(ptr)}+{nbytes} leaves its allocation "
                f"[{_hex(alloc.base)}, {_hex(alloc.end)}) by {off + nbytes - alloc.size} bytes"
            )
        if strict and alloc.sub is not None:
            alloc.sub(ptr, nbytes)
        return alloc.buf[off : off + nbytes]

    def array(self, ptr: int, shape: Any, dtype: Any, readonly: bool) -> np.ndarray:
        """A numpy view of device memory (cached); bounds-checked against its allocation."""
        try:
            key = (ptr, shape, dtype, readonly)
            view = self._views.get(key)
        except TypeError:  # unhashable shape (a list): normalise, no caching
            key, view = None, None
        if view is not None:
            self._last[ptr] = (shape, dtype, readonly, view)
            return view
        dt = np.dtype(dtype)
        shp = (shape,) if isinstance(shape, int | np.integer) else tuple(int(d) for d in shape)
        count = 1
        for d in shp:
            if d < 0:
                raise InvalidValueError(f"negative dimension in shape {shp}")
            count *= d
        raw = self.span(ptr, count * dt.itemsize, strict=False)
        view = raw.view(dt).reshape(shp)
        if readonly:
            view.flags.writeable = False
        if key is not None:
            if len(self._views) > 8192:
                self._views.clear()
                self._last.clear()
            self._views[key] = view
            self._last[ptr] = (shape, dtype, readonly, view)
        return view

    def allocations(self, device: int | None = None) -> list[Allocation]:
        """Backed allocations (not virtual ranges), of one device or all."""
        with self._lock:
            return [a for a in self._allocs.values()
                    if not a.virtual and (device is None or a.device == device)]


def _hex(ptr: Any) -> str:
    return hex(ptr) if isinstance(ptr, int) else repr(ptr)


def _as_ptr(ptr: Any) -> int:
    from ..errors import InvalidTypeError

    if is_int(ptr):
        return int(ptr)
    raise InvalidTypeError(f"a device pointer must be an int, not {type(ptr).__name__}")


SPACE = AddressSpace()
# ``on`` in threads that run stream operations (queue workers, graph replay workers): a wait for
# stream work from there is a kernel or host function synchronizing, which CUDA forbids
in_operations = threading.local()


class CpuQueue(Queue):
    """A worker thread running ``(fn, args)`` operations in order."""

    inline = True

    def __init__(self, name: str) -> None:
        self.done = 0
        self.name = name
        self._ops: deque = deque()
        # rings the idle worker awake; a lock-free put: the stream's finalizer closes the queue
        # on whatever thread the collector runs, maybe one inside ``_progress`` of this very queue
        self._bell: queue.SimpleQueue = queue.SimpleQueue()
        self._progress = threading.Condition(threading.Lock())
        self._idle = False
        # host threads blocked in wait_done: their target positions, and the smallest of them
        self._targets: list[int] = []
        self._wake_at: float = _NEVER
        self._closed = False
        self.errors: list[tuple[int, BaseException, str]] = []
        self._thread = threading.Thread(target=self._run, name=f"streamrt-{name}", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], args: tuple) -> None:
        self._ops.append((fn, args))
        if self._idle:
            self.wake()

    def drain(self) -> None:
        assert self._closed, "only a retired (closed) queue is drained"
        # the worker exits once closed and empty, so nothing is left running or queued then;
        # (done + queued would miss an op the worker has popped and is running)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    # -- operations: the work itself, run later by the worker ------------------------------
    def op_launch(self, kernel: Any, ctx: Any, args: tuple) -> tuple[Callable[..., Any], tuple]:
        return kernel.fn, (ctx,) + args

    def op_copy(self, dst: Any, src: Any, nbytes: int) -> tuple[Callable[..., Any], tuple]:
        return copy_op, (dst, src)

    def op_fill(self, dst: Any, value: int, nbytes: int) -> tuple[Callable[..., Any], tuple]:
        return fill_op, (dst, value)

    def op_host(self, fn: Callable[..., Any], args: tuple) -> tuple[Callable[..., Any], tuple]:
        return host_call, (fn, args)

    def op_wait(self, other: Queue, pos: int) -> tuple[Callable[..., Any], tuple]:
        return other._wait, (pos,)  # the queue's own wait: not a call from a kernel

    def op_stamp(self) -> tuple[Callable[..., Any], tuple, Any]:
        slot: list = [None]
        return _stamp, (slot,), slot

    def elapsed_ms(self, start: Any, end: Any) -> float:
        if start[0] is None or end[0] is None:
            raise NotReadyError("the event has not completed yet")
        return (end[0] - start[0]) * 1000.0

    def wake(self) -> None:
        """Wake the idle worker (once: it may take a while to get the GIL)."""
        self._idle = False
        self._bell.put(None)

    def _run(self) -> None:
        in_operations.on = True  # this thread runs nothing but operations (see wait_done)
        ops = self._ops
        pop = ops.popleft
        done = self.done  # only this thread writes ``done``; keep it in a local too
        while True:
            try:
                fn, args = pop()
            except IndexError:
                fn = args = None  # the last operation's arguments may be all that keeps its stream
                # idle first, then look again: a submit either lands before the look or sees
                # ``_idle`` and rings (a ring left over only makes one more empty pass)
                self._idle = True
                if not ops:
                    if self._closed:
                        return
                    self._bell.get()
                self._idle = False
                continue
            if _delay_us:
                time.sleep(random.random() * _delay_us * 1e-6)
            try:
                fn(*args)
            except BaseException as exc:  # reported at the next synchronize, never lost
                self.errors.append((done + 1, exc, describe(fn, args, exc)))
            done += 1
            self.done = done
            if done >= self._wake_at:
                with self._progress:
                    self._wake_at = min((t for t in self._targets if t > done), default=_NEVER)
                    self._progress.notify_all()

    def wait_done(self, pos: int) -> None:
        if self.done >= pos:
            return
        if getattr(in_operations, "on", False):  # a kernel or host function waiting
            raise NotPermittedError(
                f"{self.name}: a kernel or host function waited for stream work (position {pos}, "
                f"done {self.done}); the work may be queued behind it, and it would wait forever. "
                "Kernels and host functions must not synchronize (srt.malloc, srt.free, "
                "srt.memcpy and the other synchronous helpers do): CUDA forbids API calls in them")
        self._wait(pos)

    def _wait(self, pos: int) -> None:
        """Block until ``pos`` operations have completed (a wait operation runs this)."""
        if self.done >= pos:
            return
        with self._progress:
            self._targets.append(pos)
            if pos < self._wake_at:
                self._wake_at = pos
            try:
                while self.done < pos:
                    self._progress.wait()
            finally:
                self._targets.remove(pos)

    def finished(self) -> bool:
        return self._closed and not self._thread.is_alive()

    def close(self) -> None:
        self._closed = True  # before the ring: the worker looks at it once the queue is empty
        self._bell.put(None)


def describe(fn: Callable[..., Any], args: tuple, exc: BaseException | None = None) -> str:
    """A human label for a queued operation (used only when it failed, raising ``exc``); never
    raises: the worker makes it, and an error escaping there would stop the stream for good."""
    try:
        return _describe(fn, args, exc)
    except BaseException:  # a user object's repr or notes failed: the label is only cosmetic
        return getattr(fn, "__name__", "operation")


def _describe(fn: Callable[..., Any], args: tuple, exc: BaseException | None) -> str:
    if fn is instrument.run and len(args) == 3:  # wrapped by the sanitizer or tracer: the op inside
        return describe(args[1], args[2], exc)
    node = [n for n in getattr(exc, "__notes__", ())
            if isinstance(n, str) and n.startswith("in graph node: ")]
    if node:  # a graph launch (see graph.plan): the node that failed
        return f"graph launch ({node[-1][3:]})"
    label = getattr(fn, "__self__", None)
    if label is not None and hasattr(label, "name"):  # a bound Kernel method
        return f"kernel {label.name!r}"
    if fn is host_call and args:
        return f"host function {instrument.fn_label(args[0])!r}"
    return getattr(fn, "__name__", repr(fn))


def host_call(fn: Callable[..., Any], args: tuple) -> None:
    """Queue op: run a host function."""
    fn(*args)


def copy_op(dst: np.ndarray, src: Any) -> None:
    """Queue op: copy bytes between two resolved ``uint8`` views."""
    dst[:] = src


def fill_op(dst: np.ndarray, value: int) -> None:
    """Queue op: memset."""
    dst.fill(value)


def _stamp(slot: list) -> None:
    slot[0] = time.perf_counter()


class CpuDevice(DeviceImpl):
    """Device ``cpu:N``: capacity from ``STREAMRT_CPU_MEMORY`` (default: physical RAM)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.capacity = env_int("STREAMRT_CPU_MEMORY", 0) or physical_memory()
        self._used = 0
        self._lock = threading.Lock()
        self._arenas: dict[int, mmap.mmap] = {}
        self.reclaim = SPACE.reclaim  # every release takes the address space's lock

    def malloc(self, nbytes: int) -> int:
        size = _round_up(max(nbytes, 1))
        with self._lock:
            if self._used + size > self.capacity:
                raise OutOfMemoryError(
                    f"cpu:{self.index}: cannot allocate {nbytes} bytes: {self._used} of "
                    f"{self.capacity} bytes in use"
                )
            self._used += size
        try:
            return SPACE.allocate(self.index, nbytes).base
        except MemoryError as exc:
            with self._lock:
                self._used -= size
            raise OutOfMemoryError(f"cpu:{self.index}: host refused {nbytes} bytes") from exc

    # -- pool arenas: address space reserved whole, physical memory committed by granule --------
    def reserve(self, nbytes: int, *, check: Callable[[int, int], None] | None = None) -> int:
        """Reserve ``nbytes`` of addresses backed by lazily committed memory (a pool arena)."""
        size = _round_up(max(nbytes, 1), mmap.PAGESIZE)
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE
        try:
            mm = mmap.mmap(-1, size, flags=flags)
        except (OSError, OverflowError) as exc:
            raise OutOfMemoryError(f"cpu:{self.index}: cannot reserve {size} bytes of addresses") from exc
        alloc = SPACE.allocate(self.index, size, buf=np.frombuffer(mm, np.uint8))
        alloc.sub = check
        self._arenas[alloc.base] = mm
        return alloc.base

    def commit(self, nbytes: int) -> None:
        """Count ``nbytes`` of a reserved range as in use (``OutOfMemoryError`` past capacity)."""
        with self._lock:
            if self._used + nbytes > self.capacity:
                raise OutOfMemoryError(
                    f"cpu:{self.index}: cannot map {nbytes} more bytes: {self._used} of "
                    f"{self.capacity} bytes in use")
            self._used += nbytes

    def decommit(self, base: int, offset: int, nbytes: int) -> None:
        """Give ``nbytes`` at ``base + offset`` back to the host (their contents are lost)."""
        mm = self._arenas[base]
        if hasattr(mm, "madvise"):
            mm.madvise(mmap.MADV_DONTNEED, offset, nbytes)
        with self._lock:
            self._used -= nbytes

    def unreserve(self, base: int) -> None:
        """Drop a reserved range (everything in it was decommitted)."""
        SPACE.release(base)
        self._arenas.pop(base, None)  # the mapping goes once no view of it is left

    # -- graph memory: virtual ranges of the address space, backed by an arena per exec --------
    def graph_reserve(self, nbytes: int) -> int:
        return SPACE.reserve(self.index, nbytes).base

    def graph_release(self, ptr: int, nbytes: int) -> None:
        SPACE.unreserve(ptr)

    def graph_map(self, ranges: list[tuple[int, int, int]], nbytes: int) -> int:
        base = self.malloc(nbytes)
        buf = SPACE.get(base).buf  # type: ignore[union-attr]
        for ptr, off, size in ranges:
            SPACE.map_reserved(ptr, buf[off : off + size])
        return base

    def graph_unmap(self, ranges: list[tuple[int, int, int]], handle: int) -> None:
        for ptr, _off, _size in ranges:
            SPACE.map_reserved(ptr, None)
        self.free(handle)

    def free(self, ptr: int) -> None:
        alloc = SPACE.get(ptr)
        if alloc is None or alloc.device != self.index or alloc.virtual or ptr in self._arenas:
            raise InvalidAddressError(
                f"free of {_hex(ptr)}: not the start of a live allocation on cpu:{self.index}"
            )
        SPACE.release(ptr)
        with self._lock:
            self._used -= alloc.size

    def used(self) -> int:
        return self._used

    def owns(self, ptr: int) -> bool:
        alloc = SPACE.get(ptr)
        return (alloc is not None and alloc.device == self.index and not alloc.virtual
                and ptr not in self._arenas)

    def free_all(self) -> None:
        for alloc in SPACE.allocations(self.index):
            if alloc.base in self._arenas:
                self.unreserve(alloc.base)
            else:
                self.free(alloc.base)
        with self._lock:
            self._used = 0  # committed arena memory went with its arenas

    def create_queue(self, name: str, *, priority: int = 0, non_blocking: bool = False,
                     legacy: bool = False) -> CpuQueue:
        return CpuQueue(name)

    def endpoint(self, ptr: int, nbytes: int) -> np.ndarray:
        return SPACE.span(ptr, nbytes)

    def range_of(self, ptr: int) -> MemRange | None:  # minimal (pool branch): the lead's replaces it
        r = _range_of(ptr)
        return r if r is not None and r.device in (self.index, HOST_DEVICE) else None



class CpuBackend(Backend):
    """The default backend: ``STREAMRT_CPU_DEVICES`` devices (default 2)."""

    name = "cpu"

    def device_count(self) -> int:
        return env_int("STREAMRT_CPU_DEVICES", 2)

    def open_device(self, index: int) -> CpuDevice:
        return CpuDevice(index)

    def malloc_host(self, nbytes: int) -> int:
        try:
            return SPACE.allocate(HOST_DEVICE, nbytes).base
        except (MemoryError, ValueError) as exc:  # numpy: "Maximum allowed dimension exceeded"
            raise OutOfMemoryError(f"pinned host memory: host refused {nbytes} bytes") from exc

    def owns_host(self, ptr: int) -> bool:
        alloc = SPACE.get(ptr)
        return alloc is not None and alloc.device == HOST_DEVICE

    def free_host(self, ptr: int) -> None:
        alloc = SPACE.get(ptr)
        if alloc is None or alloc.device != HOST_DEVICE:
            raise InvalidAddressError(f"free_host of {_hex(ptr)}: not a live pinned host allocation")
        SPACE.release(ptr)

    def range_of(self, ptr: int) -> MemRange | None:  # minimal (pool branch): the lead's replaces it
        return _range_of(ptr)


def _range_of(ptr: int) -> MemRange | None:
    a = SPACE.find(ptr)
    if a is None:
        return None
    kind = ("host" if a.device == HOST_DEVICE else "graph" if a.virtual
            else "arena" if a.sub is not None else "malloc")
    return MemRange(a.base, a.size, a.device, kind, a.buf is not None)
