"""Device ``cpu:N``: memory in the shared address space, pool arenas, graph memory, kernel views.

State and invariants (per device):
- ``_used`` counts committed bytes (``srt.malloc`` allocations, committed pool granules, graph
  memory backings) and never exceeds ``capacity`` (``STREAMRT_CPU_MEMORY``, default: physical
  RAM); it changes under ``_lock``.
- ``_arenas`` maps a pool arena's base to its ``mmap``: addresses reserved whole with no swap
  committed, memory touched (and counted) granule by granule.
- ``_reach``: the address windows (``ptr >> 48``) its kernels may view: its own, pinned host
  memory's and those of the peers it was given access to (replaced whole, read in one load).
  Every cpu device can access every other (one host memory), once access is enabled.
"""

from __future__ import annotations

import mmap
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import InvalidAddressError, OutOfMemoryError
from ...validate import env_int
from ..base import DeviceImpl, MemRange
from . import replay
from .queues import CpuMark, CpuQueue
from .space import HOST_WINDOW, SPACE, as_ptr, hex_, round_up

if TYPE_CHECKING:
    from ...graph.node import Node
    from ..base import Flat, GraphRunner, Mark, NodeOp

# reserve addresses without committing swap (Linux's value; Python < 3.13 does not export it)
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)


def physical_memory() -> int:
    """Bytes of physical RAM on this machine."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 16 << 30


class CpuDevice(DeviceImpl):
    """Device ``cpu:N``: capacity from ``STREAMRT_CPU_MEMORY`` (default: physical RAM)."""

    runner_per_stream = True  # a replay's operations hold the launching stream's contexts

    def __init__(self, index: int) -> None:
        self.index = index
        self.capacity = env_int("STREAMRT_CPU_MEMORY", 0) or physical_memory()
        self._used = 0
        self._lock = threading.Lock()
        self._arenas: dict[int, mmap.mmap] = {}
        self._reclaim = SPACE.reclaim  # every release takes the address space's lock
        self.last_views = SPACE.last_views()
        self._reach = frozenset({index + 1, HOST_WINDOW})

    def reclaim(self, fn: Callable[..., Any], *args: Any) -> None:
        self._reclaim(fn, *args)

    # -- memory ------------------------------------------------------------------------------
    def _count(self, nbytes: int, what: str) -> None:
        with self._lock:
            if self._used + nbytes > self.capacity:
                raise OutOfMemoryError(
                    f"cpu:{self.index}: cannot {what}: {self._used} of {self.capacity} bytes in use")
            self._used += nbytes

    def _uncount(self, nbytes: int) -> None:
        with self._lock:
            self._used -= nbytes

    def malloc(self, nbytes: int) -> int:
        size = round_up(max(nbytes, 1))
        self._count(size, f"allocate {nbytes} bytes")
        try:
            return SPACE.allocate(self.index, nbytes).base
        except MemoryError as exc:
            self._uncount(size)
            raise OutOfMemoryError(f"cpu:{self.index}: host refused {nbytes} bytes") from exc

    def free(self, ptr: int) -> None:
        alloc = SPACE.get(ptr)
        if alloc is None or alloc.device != self.index or alloc.kind != "malloc":
            raise InvalidAddressError(
                f"free of {hex_(ptr)}: not the start of a live allocation on cpu:{self.index}")
        SPACE.release(ptr)
        self._uncount(alloc.size)

    def used(self) -> int:
        return self._used

    def launch_cuda_c(self, ctx: Any, source: str, name: str, signature: str,
                      options: tuple[str, ...], args: tuple) -> None:
        from .cuda_c import launch  # (g++ and the emulator only for kernels made of CUDA C)

        launch(ctx, source, name, signature, options, args)

    def register(self, buf: np.ndarray) -> int:
        return SPACE.register(self.index, buf).base

    def unregister(self, ptr: int) -> None:
        alloc = SPACE.get(ptr)
        if alloc is not None and alloc.kind == "external":
            SPACE.release(ptr)

    def owns(self, ptr: int) -> bool:
        alloc = SPACE.get(ptr)
        return alloc is not None and alloc.device == self.index and alloc.kind == "malloc"

    def free_all(self) -> None:
        for alloc in SPACE.allocations(self.index):
            if alloc.kind == "arena":
                self.unreserve(alloc.base)
            elif alloc.kind == "external":  # foreign memory (from_dlpack): unmapped, not freed;
                SPACE.release(alloc.base)  # its Tensor's later unregister finds nothing there
            else:
                self.free(alloc.base)
        with self._lock:
            self._used = 0  # committed arena memory went with its arenas

    def range_of(self, ptr: int) -> MemRange | None:
        alloc = SPACE.find(ptr)
        if alloc is None or alloc.device not in (self.index, -1):
            return None
        return alloc.range()

    def ranges(self) -> list[MemRange]:
        return [a.range() for a in SPACE.allocations(self.index)]

    def endpoint(self, ptr: int, nbytes: int) -> np.ndarray:
        return SPACE.span(ptr, nbytes)

    def view(self, ptr: int, shape: Any, dtype: Any, readonly: bool) -> np.ndarray:
        if type(ptr) is not int:
            ptr = as_ptr(ptr)
        w = ptr >> 48
        if w not in self._reach and 0 < w < HOST_WINDOW:  # another device's window
            raise InvalidAddressError(
                f"a kernel on cpu:{self.index} viewed {hex_(ptr)}, memory of cpu:{w - 1}, without "
                f"peer access (Device('cpu:{self.index}').enable_peer_access('cpu:{w - 1}'); a "
                "GPU faults here)")
        return SPACE.array(ptr, shape, dtype, readonly, self.last_views)

    def device_of(self, ptr: int) -> int:
        w = ptr >> 48  # the window says the device (allocations never leave theirs)
        return w - 1 if 0 < w < HOST_WINDOW else -1

    # -- peer access: every cpu device may reach every other's memory (one host memory) ---------
    def can_access_peer(self, peer: Any) -> bool:
        return isinstance(peer, CpuDevice) and peer is not self

    def enable_peer_access(self, peer: Any) -> None:
        self._reach = self._reach | {peer.index + 1}

    def disable_peer_access(self, peer: Any) -> None:
        self._reach = self._reach - {peer.index + 1}
        SPACE.forget_views()  # views made under the access (cached, bound by graph execs) go

    def memory_generation(self) -> int:
        return SPACE.generation

    def create_queue(self, name: str, *, priority: int = 0, non_blocking: bool = False,
                     legacy: bool = False) -> CpuQueue:
        return CpuQueue(name)

    def graph_runner(self, flat: Flat, op_of: Callable[[int, Node], NodeOp],
                     marks: dict[int, Mark] | None = None, *,
                     use_node_priority: bool = False) -> GraphRunner:
        # use_node_priority is accepted: the cpu backend has no priorities (stream priorities
        # order nothing here either), so the replay's order among ready nodes stays as it is
        return replay.build(flat, op_of, marks or {})

    def graph_mark(self, name: str) -> CpuMark:
        return CpuMark(name)

    # -- pool arenas: addresses reserved whole, physical memory committed by granule ----------
    def reserve(self, nbytes: int, *, check: Callable[[int, int], None] | None = None) -> int:
        """Reserve ``nbytes`` of addresses backed by lazily committed memory (a pool arena)."""
        size = round_up(max(nbytes, 1), mmap.PAGESIZE)
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE
        try:
            mm = mmap.mmap(-1, size, flags=flags)
        except (OSError, OverflowError) as exc:
            raise OutOfMemoryError(f"cpu:{self.index}: cannot reserve {size} bytes of addresses") from exc
        alloc = SPACE.allocate(self.index, size, "arena", buf=np.frombuffer(mm, np.uint8))
        alloc.check = check
        self._arenas[alloc.base] = mm
        return alloc.base

    def commit(self, nbytes: int) -> None:
        """Count ``nbytes`` of a reserved range as in use (``OutOfMemoryError`` past capacity)."""
        self._count(nbytes, f"map {nbytes} more bytes")

    def decommit(self, base: int, offset: int, nbytes: int) -> None:
        """Give ``nbytes`` at ``base + offset`` back to the host (their contents are lost)."""
        mm = self._arenas[base]
        if hasattr(mm, "madvise"):
            mm.madvise(mmap.MADV_DONTNEED, offset, nbytes)
        self._uncount(nbytes)

    def unreserve(self, base: int) -> None:
        """Drop a reserved range (everything in it was decommitted)."""
        SPACE.release(base)
        self._arenas.pop(base, None)  # the mapping goes once no view of it is left

    # -- graph memory: ranges of the address space, backed by an allocation per exec ----------
    def graph_reserve(self, nbytes: int) -> int:
        return SPACE.allocate(self.index, nbytes, "graph").base

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
