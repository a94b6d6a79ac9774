"""The small Backend interface: raw device memory, in-order queues, and a kernel context.

Semantics (vector clocks, legacy-stream ordering, pools, capture) live in the frontend; a
backend only provides these primitives. A queue runs its operations in submission order and
counts the ones it has completed, so that "position p of stream S is done" is one comparison.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from ..errors import NotSupportedError


class Queue(ABC):
    """An in-order work queue (one per stream): operations run in submission order.

    The frontend turns each stream operation into one ``(fn, args)`` pair with an ``op_*``
    method and hands it to :meth:`submit`, so that it can wrap the pair (sanitizer, tracer)
    without knowing the backend. On the cpu backend the pair is the work itself, run later
    by the stream's worker; on cuda it is the call that enqueues the work on the real stream.
    """

    done: int  # number of submitted operations that have completed
    name: str
    _errors: list[tuple[int, BaseException, str]]  # failures: (position, exception, what)
    inline: bool = False  # True when launches may bypass ``op_launch`` (the cpu fast path)

    @abstractmethod
    def submit(self, fn: Callable[..., Any], args: tuple) -> None:
        """Enqueue ``fn(*args)``; returns at once."""

    @abstractmethod
    def op_launch(self, kernel: Any, ctx: Any, args: tuple) -> tuple[Callable[..., Any], tuple]:
        """The operation running ``kernel`` with its context and arguments."""

    @abstractmethod
    def op_copy(self, dst: Any, src: Any, nbytes: int) -> tuple[Callable[..., Any], tuple]:
        """A copy between endpoints made by :meth:`DeviceImpl.endpoint` or host ``uint8`` views."""

    @abstractmethod
    def op_fill(self, dst: Any, value: int, nbytes: int) -> tuple[Callable[..., Any], tuple]:
        """A byte fill of an endpoint made by :meth:`DeviceImpl.endpoint`."""

    @abstractmethod
    def op_host(self, fn: Callable[..., Any], args: tuple) -> tuple[Callable[..., Any], tuple]:
        """Running ``fn(*args)`` on a host thread in stream order."""

    @abstractmethod
    def op_wait(self, other: Queue, pos: int) -> tuple[Callable[..., Any], tuple]:
        """Waiting until ``other`` has completed ``pos`` operations."""

    @abstractmethod
    def op_stamp(self) -> tuple[Callable[..., Any], tuple, Any]:
        """A timing mark: the operation and the stamp :meth:`elapsed_ms` reads."""

    @abstractmethod
    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two completed stamps; :class:`NotReadyError` if one is pending."""

    @abstractmethod
    def drain(self) -> None:
        """Block until a closed queue has completed everything submitted to it."""

    def mark(self) -> None:
        """The tail may be waited for later (an event was recorded there): cuda records one."""
        return None  # the cpu queue counts completions exactly: nothing to mark

    @abstractmethod
    def wait_done(self, pos: int) -> None:
        """Block the calling host thread until ``done >= pos``."""

    def take_errors(self, upto: int | None = None) -> list[tuple[int, BaseException, str]]:
        """Remove and return the failures of operations at positions ``<= upto`` (all if None).

        Worker threads append to ``_errors`` while host threads take from it, maybe two at once:
        the list is changed in place only (a list built anew dropped a failure appended while it
        was built), and each failure goes to the caller whose removal of it succeeds (two
        synchronizes filtering the shared list both reported it)."""
        errors = self._errors
        if not errors:
            return []
        taken = []
        for e in list(errors):  # one C call: a copy no other thread changes halfway
            if upto is None or e[0] <= upto:
                try:
                    errors.remove(e)
                except ValueError:  # another synchronize took it
                    continue
                taken.append(e)
        return taken

    @abstractmethod
    def close(self) -> None:
        """Stop accepting work; operations already submitted still run."""

    def finished(self) -> bool:
        """True once a closed queue has run everything (then no failure can be added)."""
        return False  # unknown without asking the device: kept until a device synchronize


class DeviceImpl(ABC):
    """One device of a backend: memory and queues."""

    index: int
    capacity: int

    @abstractmethod
    def malloc(self, nbytes: int) -> int:
        """Allocate device memory synchronously; returns a pointer."""

    @abstractmethod
    def free(self, ptr: int) -> None:
        """Release an allocation made by :meth:`malloc` (caller has synchronized)."""

    @abstractmethod
    def used(self) -> int:
        """Bytes currently allocated on the device."""

    @abstractmethod
    def owns(self, ptr: int) -> bool:
        """True when ``ptr`` is the start of a live :meth:`malloc` allocation of this device."""

    @abstractmethod
    def free_all(self) -> None:
        """Release every allocation of the device (device reset)."""

    @abstractmethod
    def create_queue(self, name: str, *, priority: int = 0, non_blocking: bool = False,
                     legacy: bool = False) -> Queue:
        """Create an in-order queue for a new stream."""

    @abstractmethod
    def endpoint(self, ptr: int, nbytes: int) -> Any:
        """Resolve ``nbytes`` of device memory at ``ptr`` for a copy or fill (raises if invalid)."""

    def contains(self, ptr: int, nbytes: int) -> bool:
        """True when ``[ptr, ptr + nbytes)`` lies inside one live allocation of this device."""
        return False  # cpu memory is found through its address space instead

    def usable(self, ptr: int) -> int | None:
        """Bytes from ``ptr`` to the end of the live allocation holding it (None: not one)."""
        return None  # cpu memory is found through its address space instead

    def memory_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes of device memory."""
        return max(self.capacity - self.used(), 0), self.capacity

    native_pools = False  # True: MemPool runs on the backend's own pools (cudaMemPool)

    # -- pool arenas (backends whose pools are the frontend's, i.e. ``native_pools`` False) ------
    def reserve(self, nbytes: int) -> int:
        """Reserve an address range whose memory is committed piecewise; returns its base."""
        raise NotSupportedError(f"{type(self).__name__} has no pool arenas")

    def commit(self, nbytes: int) -> None:
        """Count ``nbytes`` of a reserved range as device memory in use."""
        raise NotSupportedError(f"{type(self).__name__} has no pool arenas")

    def decommit(self, base: int, offset: int, nbytes: int) -> None:
        """Give back ``nbytes`` at ``base + offset`` of a reserved range."""
        raise NotSupportedError(f"{type(self).__name__} has no pool arenas")

    def unreserve(self, base: int) -> None:
        """Drop a reserved range."""
        raise NotSupportedError(f"{type(self).__name__} has no pool arenas")


    def reclaim(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)``, a finalizer's release of this device's memory (a backend whose
        releases take a lock defers them while it is held: :class:`streamrt.reclaim.Reclaim`)."""
        fn(*args)

    # -- graph memory: addresses fixed when a MEM_ALLOC node is made, memory mapped per exec -----
    graph_granule = 512  # graph memory is reserved and mapped in multiples of this

    @abstractmethod
    def graph_reserve(self, nbytes: int) -> int:
        """Reserve ``nbytes`` of addresses with no memory behind them; returns the base."""

    @abstractmethod
    def graph_release(self, ptr: int, nbytes: int) -> None:
        """Drop a reservation of :meth:`graph_reserve` (nothing is mapped in it any more)."""

    @abstractmethod
    def graph_map(self, ranges: list[tuple[int, int, int]], nbytes: int) -> Any:
        """Back reserved ``(ptr, offset, size)`` ranges with one new allocation of ``nbytes`` at
        those offsets (ranges may share bytes); returns its handle for :meth:`graph_unmap`."""

    @abstractmethod
    def graph_unmap(self, ranges: list[tuple[int, int, int]], handle: Any) -> None:
        """Unmap the ranges of :meth:`graph_map` and release its allocation."""


class Backend(ABC):
    """A family of devices (``cpu``, ``cuda``)."""

    name: str

    @abstractmethod
    def device_count(self) -> int:
        """Number of devices this backend offers here."""

    @abstractmethod
    def open_device(self, index: int) -> DeviceImpl:
        """Create the implementation object of device ``index``."""

    @abstractmethod
    def malloc_host(self, nbytes: int) -> int:
        """Allocate pinned host memory usable as a copy endpoint; returns a pointer."""

    @abstractmethod
    def free_host(self, ptr: int) -> None:
        """Release pinned host memory."""

    @abstractmethod
    def owns_host(self, ptr: int) -> bool:
        """True when ``ptr`` is the start of live pinned memory of this backend."""
