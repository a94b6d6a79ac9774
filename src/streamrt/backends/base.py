"""The whole contract between the frontend and a backend: queues, devices, graph runners, pools
(the graph runner's and the record mark's classes are in graphs.py, the native pools' in
native_pools.py, both imported here).

Semantics (vector clocks, legacy-stream ordering, pools, capture) live in the frontend; a
backend only provides the primitives declared here, and the frontend calls nothing else on a
backend object. A queue runs its operations in submission order and counts the ones it has
completed, so that "position p of stream S is done" is one comparison.

Backends import from the frontend only data types and helpers that import no frontend module
in turn: errors, graph node types, validation and labels.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import InvalidAddressError, NotSupportedError
from .graphs import Flat, GraphRunner, Mark, NodeOp  # the graph part of the contract
from .native_pools import NativePools  # the native pool part of the contract

if TYPE_CHECKING:
    import numpy as np

    from ..graph.node import Node



# ptr -> (shape, dtype, writable view, read-only view): the kernel views of the shape and dtype
# made last at each address (either view None until one is made). One such dict per device that
# makes views (:attr:`DeviceImpl.last_views`), read by its kernel contexts' fast path without a
# call: a view made by one device's kernel is never handed to another device's, which may have
# no peer access to that memory. Backends' addresses never collide, and a backend clears its
# dicts in place whenever memory goes away or is remapped, or a peer access is disabled. This
# one is the dict of devices whose kernels make no views (it stays empty).
LAST_VIEWS: dict[int, tuple[Any, Any, Any, Any]] = {}


class MemRange(NamedTuple):
    """A backend allocation: ``size`` bytes at ``base``; ``device`` is -1 for pinned host memory.

    ``kind`` is ``"malloc"`` (``srt.malloc``), ``"host"`` (``srt.malloc_host``), ``"arena"``
    (a range :meth:`DeviceImpl.reserve` made for a pool), ``"pool"`` (a native pool's block),
    ``"graph"`` (graph memory: ``mapped`` False while no executable graph maps it) or
    ``"external"`` (foreign memory mapped by :meth:`DeviceImpl.register`)."""

    base: int
    size: int
    device: int
    kind: str
    mapped: bool = True

    @property
    def end(self) -> int:
        """One past the last byte."""
        return self.base + self.size


class Queue(ABC):
    """An in-order work queue (one per stream): operations run in submission order.

    The frontend turns each stream operation into one ``(fn, args)`` pair with an ``op_*``
    method and hands it to :meth:`submit`, so that it can wrap the pair (sanitizer, tracer)
    without knowing the backend. On the cpu backend the pair is the work itself, run later
    by the stream's worker; on cuda it is the call that enqueues the work on the real stream.
    """

    done: int  # number of submitted operations that have completed
    name: str
    errors: list[tuple[int, BaseException, str]]  # failures: (position, exception, what)

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
    def op_wait(self, other: Queue | Mark, pos: int) -> tuple[Callable[..., Any], tuple]:
        """Waiting until ``other`` (a queue, or a graph's :class:`Mark`) has completed ``pos``."""

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

    def order_foreign(self, handle: int, pos: int) -> None:
        """Make the foreign native stream ``handle`` wait (an event wait, enqueued on it) until
        this queue has completed ``pos`` (a DLPack consumer's stream; this queue may be closed)."""
        raise NotSupportedError(f"{type(self).__name__} has no native streams")

    def op_wait_foreign(self, handle: int) -> tuple[Callable[..., Any], tuple]:
        """Waiting for the work enqueued so far on the foreign native stream ``handle`` of this
        queue's device (an event recorded on it when submitted: a CUDA Array Interface's stream)."""
        raise NotSupportedError(f"{type(self).__name__} has no native streams")

    def handle(self) -> int | None:
        """The native stream handle as an int (``cudaStream_t``; 1 for the legacy default
        stream), for the ``__cuda_stream__`` protocol; None where the backend has none."""
        return None

    @abstractmethod
    def wait_done(self, pos: int) -> None:
        """Block the calling host thread until ``done >= pos``."""

    def take_errors(self, upto: int | None = None) -> list[tuple[int, BaseException, str]]:
        """Remove and return the failures of operations at positions ``<= upto`` (all if None).

        Worker threads append to ``errors`` while host threads take from it, maybe two at once:
        the list is changed in place only (a list built anew dropped a failure appended while it
        was built), and each failure goes to the caller whose removal of it succeeds (two
        synchronizes filtering the shared list both reported it)."""
        errors = self.errors
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


class InlineQueue(Queue):
    """A queue whose operations are the work itself, run by a host thread (the cpu backend).

    :attr:`ops` (never rebound) holds two items per operation, ``fn`` then ``args`` (run as
    ``fn(*args)``), each pair added by one ``extend``. The eager launch adds the kernel's body
    bound to its context and the launch's arguments itself, and calls :meth:`wake` when
    :attr:`idle` is set, without a call into the queue: both fields are part of the contract.
    Such a queue never blocks in :meth:`submit`."""

    ops: deque[Any]  # submitted, not yet started: ``fn, args, fn, args, ...``
    idle: bool  # the worker sleeps: the next submit must call wake()

    @abstractmethod
    def wake(self) -> None:
        """Wake the idle worker."""


class DeviceImpl(ABC):
    """One device of a backend: memory, queues, kernel views, graphs and pools."""

    index: int
    capacity: int
    # ``pools``: the backend's own pools, which MemPool then runs on; None: the frontend's pools
    # over :meth:`reserve` ranges (the cpu backend)
    pools: NativePools | None = None
    # one graph runner per launching stream (True: its operations hold the stream's kernel
    # contexts) or one per device (False)
    runner_per_stream = False
    # what ``streamrt info`` names the device by: a GPU's model and architecture (None on cpu)
    model: str | None = None
    arch: str | None = None
    # the views this device's kernels made last (see LAST_VIEWS): a backend making views gives
    # each device a dict of its own
    last_views: dict[int, tuple[Any, Any, Any, Any]] = LAST_VIEWS

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

    def launch_cuda_c(self, ctx: Any, source: str, name: str, signature: str,
                      options: tuple[str, ...], args: tuple) -> None:
        """Run CUDA C ``name`` of ``source`` now over ``ctx``'s grid and block (an emulating
        backend; a GPU backend launches the CUDA C itself, never this)."""
        raise NotSupportedError(f"kernel {name!r} is only CUDA C: {type(self).__name__} can't run it")

    def register(self, buf: np.ndarray) -> int:
        """Map foreign host memory (``buf``: a ``uint8`` numpy view of it, a DLPack import) into
        the device's addresses, zero-copy; returns its pointer (MemRange kind "external"). The
        frontend keeps the memory's owner alive until :meth:`unregister`."""
        raise NotSupportedError(f"{type(self).__name__}.register")

    def unregister(self, ptr: int) -> None:
        """Forget a :meth:`register` mapping (the memory stays its owner's)."""
        raise NotSupportedError(f"{type(self).__name__}.unregister")

    def register_device(self, ptr: int, nbytes: int) -> bool:
        """Make ``nbytes`` of foreign device memory of this device at ``ptr`` (a DLPack import)
        a copy and fill endpoint (MemRange kind "external"); False when a live allocation already
        holds it (nothing to undo). The frontend keeps the memory's owner alive until
        :meth:`unregister_device`."""
        raise NotSupportedError(f"{type(self).__name__}.register_device")

    def unregister_device(self, ptr: int) -> None:
        """Forget a :meth:`register_device` range that returned True."""
        raise NotSupportedError(f"{type(self).__name__}.unregister_device")

    def wrap_queue(self, name: str, handle: int) -> tuple[Queue, bool, int]:
        """A queue over a foreign native stream of this device (``Stream.from_external``), with
        the stream's ``(non_blocking, priority)``. The queue does not own the stream: closing it
        leaves the stream alive (its owner destroys it, after the queue's work)."""
        raise NotSupportedError(f"{type(self).__name__} has no foreign streams")

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

    def range_of(self, ptr: int) -> MemRange | None:
        """The allocation of this device (or pinned host memory of its backend) holding
        ``ptr``, or None."""
        raise NotSupportedError(f"{type(self).__name__}.range_of")

    def ranges(self) -> list[MemRange]:
        """Every live allocation of this device (for an observer starting mid-program)."""
        return []

    def view(self, ptr: int, shape: Any, dtype: Any, readonly: bool) -> np.ndarray:
        """A numpy view of device memory for a kernel body, bounds-checked against its
        allocation (``ctx.array``); recorded in :attr:`last_views`. Memory of another device
        without peer access (:meth:`enable_peer_access`) is refused (InvalidAddressError)."""
        raise NotSupportedError(
            f"{type(self).__name__}: kernels see device memory only through their CUDA body")

    # -- peer access: the frontend keeps the state (which peers are enabled) and its errors ------
    def can_access_peer(self, peer: DeviceImpl) -> bool:
        """Whether access to ``peer``'s memory (another device of this backend) can be enabled
        (``cudaDeviceCanAccessPeer``)."""
        return False

    def enable_peer_access(self, peer: DeviceImpl) -> None:
        """Let this device's work touch ``peer``'s memory (``cudaDeviceEnablePeerAccess``); the
        frontend checked it is not enabled yet and :meth:`can_access_peer`."""
        raise NotSupportedError(f"{type(self).__name__}.enable_peer_access")

    def disable_peer_access(self, peer: DeviceImpl) -> None:
        """Take back :meth:`enable_peer_access` (``cudaDeviceDisablePeerAccess``; the frontend
        checked it is enabled): views of ``peer``'s memory made under it are forgotten
        (:meth:`memory_generation` moves)."""
        raise NotSupportedError(f"{type(self).__name__}.disable_peer_access")

    def device_of(self, ptr: int) -> int:
        """The index of the device of this backend whose memory holds ``ptr`` (an int): this
        one's or another's; -1 for pinned host memory or none. Asked at every copy and memset
        enqueue: cheap (the cpu backend reads it off the address)."""
        try:
            r = self.range_of(ptr)
        except NotSupportedError:
            return -1
        return -1 if r is None else r.device

    def memory_generation(self) -> int:
        """A count bumped whenever memory goes away or is remapped: views made before may be
        stale (graph runners holding views are made again)."""
        return 0

    def memory_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes of device memory."""
        return max(self.capacity - self.used(), 0), self.capacity

    # -- graphs -------------------------------------------------------------------------------
    # whether one graph may hold kernel and memory nodes of several devices of this backend
    # (CUDA host graphs may; a backend whose runner builds one graph per device may not)
    graph_spans_devices = True
    # whether the backend's graph runner builds conditional nodes of its own (reading each
    # handle's value at ``handle.ptr`` and setting its default at each launch); False: a
    # conditional node of ``flat`` is an operation like any other (``op_of`` makes it: the
    # frontend's, running the bodies' runners) and the frontend writes the defaults first
    graph_conditionals_native = False

    def graph_runner(self, flat: Flat, op_of: Callable[[int, Node], NodeOp],
                     marks: dict[int, Mark] | None = None, *,
                     use_node_priority: bool = False) -> GraphRunner:
        """Instantiate a flattened graph. ``op_of(i, node)`` is the queue operation of an
        enabled node made with the launching queue's ``op_*`` methods (a backend that replays
        operations uses it; one with graphs of its own builds them from the nodes); it is None
        for event nodes, which the backend makes itself (see :class:`GraphRunner`). ``marks``:
        the mark of each EVENT_RECORD node, by its index in ``flat`` (:meth:`graph_mark`).
        ``use_node_priority``: ``cudaGraphInstantiateFlagUseNodePriority`` (a backend without
        per-node priorities accepts it). A refusal raises ``GraphInstantiateError``."""
        raise NotSupportedError(f"{type(self).__name__}.graph_runner")

    def graph_mark(self, name: str) -> Mark:
        """A new :class:`Mark` for an EVENT_RECORD node of an executable graph on this device."""
        raise NotSupportedError(f"{type(self).__name__}.graph_mark")

    def graph_node_check(self) -> Callable[[Node], str | None] | None:
        """A function saying why a kernel node of this device cannot run in a graph here (None
        when it can), checked at instantiate; None where every kernel node can."""
        return None

    # the backend's own graph allocator (CUDA's, behind cudaGraphAddMemAllocNode), beside the
    # graph memory the frontend maps (graph_map): its bytes count in the device's attributes
    def graph_mem_native(self) -> tuple[int, int, int, int]:
        """The backend's own graph allocator's (used, used high, reserved, reserved high) bytes
        (``cudaDeviceGetGraphMemAttribute``); zeros for a backend without one."""
        return (0, 0, 0, 0)

    def graph_mem_reset_high(self) -> None:
        """Reset the backend's own graph allocator's high watermarks to its current bytes."""
        return None

    def graph_mem_trim(self) -> None:
        """Give back what the backend's own graph allocator caches unused (``cudaDeviceGraphMemTrim``)."""
        return None

    # -- pool arenas (backends whose pools are the frontend's: ``pools`` None) -------------------
    def reserve(self, nbytes: int, *, check: Callable[[int, int], None] | None = None) -> int:
        """Reserve an address range whose memory is committed piecewise; returns its base.
        ``check(ptr, nbytes)`` raises InvalidAddressError unless a copy or memset's range lies in
        one live block of the pool sub-allocating it (called when such work is enqueued)."""
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

    def range_of(self, ptr: int) -> MemRange | None:
        """The allocation of any device of this backend, or its pinned host memory, holding
        ``ptr`` (None: none)."""
        raise NotSupportedError(f"{type(self).__name__}.range_of")

    def stream_device(self, handle: int) -> int:
        """The index of the device a native stream handle belongs to (``cudaStreamGetDevice``);
        an invalid handle raises InvalidHandleError."""
        raise NotSupportedError(f"the {self.name} backend has no native stream handles")

    def host_view(self, ptr: int, nbytes: int) -> np.ndarray:
        """A zero-copy ``uint8`` view of ``nbytes`` of this backend's pinned host memory at
        ``ptr`` (``srt.host_array``); a range leaving its allocation is refused. By default the
        pointer is a real host address (as CUDA's pinned memory is)."""
        import ctypes

        import numpy as np

        r = self.range_of(ptr)
        if r is None or r.kind != "host" or ptr + nbytes > r.end:
            raise InvalidAddressError(f"{hex(ptr)}+{nbytes} is not inside pinned host memory")
        raw = (ctypes.c_uint8 * nbytes).from_address(ptr) if nbytes else bytearray()
        return np.frombuffer(raw, np.uint8)
