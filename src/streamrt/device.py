"""Devices: the registry (same spec, same object), the current device per thread, and the state
every device keeps (declared in :class:`Device`, changed only through its methods)."""

from __future__ import annotations

import os
import threading
import weakref
from typing import TYPE_CHECKING, Any

from .backends import BACKENDS, get_backend, loaded_backends
from .backends import device_count as _backend_device_count
from .errors import (
    InvalidAddressError,
    InvalidDeviceError,
    InvalidTypeError,
    InvalidValueError,
    NotSupportedError,
    PeerAccessAlreadyEnabledError,
    PeerAccessNotEnabledError,
)
from .sync import synchronize_device
from .validate import is_int
from .weak import members

if TYPE_CHECKING:
    from .backends.base import DeviceImpl, MemRange
    from .pool import MemPool
    from .stream import Stream

_registry: dict[tuple[str, int], Device] = {}
_registry_lock = threading.RLock()
_tls = threading.local()


def _default_backend() -> str:
    name = os.environ.get("STREAMRT_DEVICE", "cpu") or "cpu"
    name = name.split(":", 1)[0]
    if name not in BACKENDS:
        raise InvalidDeviceError(f"STREAMRT_DEVICE={name!r}: known backends are {BACKENDS}")
    return name


def _parse(spec: Any) -> tuple[str, int]:
    if is_int(spec):
        return current_device().backend, int(spec)
    if not isinstance(spec, str):
        raise InvalidTypeError(
            f"a device spec is a str like 'cpu:0', an int or a Device, not {type(spec).__name__}"
        )
    backend, _, idx = spec.strip().partition(":")
    if backend not in BACKENDS:
        raise InvalidDeviceError(f"unknown device {spec!r}: backends are {', '.join(BACKENDS)}")
    if idx == "":
        cur = getattr(_tls, "device", None)
        return backend, cur.index if cur is not None and cur.backend == backend else 0
    try:
        return backend, int(idx)
    except ValueError:
        raise InvalidDeviceError(f"bad device index in {spec!r}") from None


class Device:
    """A device (``cpu:N`` or ``cuda:N``); the same spec always gives the same object.

    State (the runtime's modules change it only through the methods below):
    - ``_impl``: the backend's device object (the contract of ``backends/base.py``);
    - ``_streams``, ``_blocking``: live streams, and those of them ordered with the legacy
      stream; ``_dead``: destroyed streams whose pool frees a synchronize must still prove;
      ``_retired``: the queues of destroyed streams, kept until drained and reported;
    - ``_legacy``: the legacy default stream, made on first use; ``_events``: live events;
    - ``_default_pool``, ``_pool`` (None: the default is current), ``_pools`` (every live
      pool), ``_pool_lock`` (a current pool's check and change are one step under it);
    - ``_execs``: graph execs made or run here (a reset destroys them);
    - ``_graph_used``, ``_graph_reserved``: bytes of live graph allocations, and of memory
      backing execs' graph allocations (``graph_mem_info``); ``_graph_used_high``,
      ``_graph_reserved_high``: their high watermarks since the last ``reset_graph_mem_high``
      (never below the current values).
    - ``_peers``: the indices of the devices of its backend whose memory its kernels, copies
      and memsets may touch (``enable_peer_access``); replaced whole under ``_pool_lock``, read
      without it (one load).
    Sets of objects are weak: a device keeps nothing alive.
    """

    __slots__ = (
        "backend", "index", "name", "_impl", "_streams", "_blocking", "_dead", "_retired",
        "_events", "_legacy", "_default_pool", "_pool", "_pool_lock", "_pools", "_execs",
        "_graph_used", "_graph_reserved", "_graph_used_high", "_graph_reserved_high",
        "_peers", "__weakref__",
    )
    backend: str
    index: int
    name: str
    _impl: DeviceImpl

    def __new__(cls, spec: Any = None) -> Device:
        if isinstance(spec, Device):
            return spec
        if spec is None:
            return current_device()
        key = _parse(spec)
        dev = _registry.get(key)
        if dev is not None:
            return dev
        with _registry_lock:
            dev = _registry.get(key)
            if dev is None:
                dev = cls._open(*key)
                _registry[key] = dev
        return dev

    @classmethod
    def _open(cls, backend_name: str, index: int) -> Device:
        backend = get_backend(backend_name)
        count = backend.device_count()
        if not 0 <= index < count:
            raise InvalidDeviceError(
                f"no device {backend_name}:{index}: this machine has {count} {backend_name} "
                "device(s)" + (" (set STREAMRT_CPU_DEVICES for more)" if backend_name == "cpu" else "")
            )
        dev = object.__new__(cls)
        dev.backend = backend_name
        dev.index = index
        dev.name = f"{backend_name}:{index}"
        dev._impl = backend.open_device(index)
        dev._streams = weakref.WeakSet()
        dev._blocking = weakref.WeakSet()
        dev._dead = weakref.WeakSet()
        dev._retired = []
        dev._events = weakref.WeakSet()
        dev._legacy = None
        dev._default_pool = None
        dev._pool = None
        dev._pool_lock = threading.Lock()
        dev._pools = weakref.WeakSet()
        dev._execs = weakref.WeakSet()
        dev._graph_used = 0
        dev._graph_reserved = 0
        dev._graph_used_high = 0
        dev._graph_reserved_high = 0
        dev._peers = frozenset()
        return dev

    # -- the runtime's bookkeeping ---------------------------------------------------------
    def _add_stream(self, stream: Stream, *, blocking: bool) -> None:
        """A stream of this device was made (``blocking``: ordered with the legacy stream)."""
        self._streams.add(stream)
        if blocking:
            self._blocking.add(stream)

    def _drop_stream(self, stream: Stream) -> None:
        """A stream was destroyed: no longer live, but findable until its frees are proved."""
        self._dead.add(stream)
        self._streams.discard(stream)
        self._blocking.discard(stream)

    def _add_exec(self, ge: Any) -> None:
        """A graph exec was made or launched here: a reset destroys it."""
        self._execs.add(ge)

    def _count_graph_memory(self, *, used: int = 0, reserved: int = 0) -> None:
        """Graph memory of this device grew (or shrank) by these bytes."""
        with self._pool_lock:
            self._graph_used += used
            self._graph_reserved += reserved
            self._graph_used_high = max(self._graph_used_high, self._graph_used)
            self._graph_reserved_high = max(self._graph_reserved_high, self._graph_reserved)

    def streams(self) -> list[Stream]:
        """The live streams of this device (the legacy one too once made)."""
        return members(self._streams)

    def __repr__(self) -> str:
        return f"Device({self.name!r})"

    def __reduce__(self) -> tuple:
        return (Device, (self.name,))

    # -- current device ---------------------------------------------------------------
    def set_current(self) -> None:
        """Make this the calling thread's current device (``cudaSetDevice``)."""
        if not isinstance(self, Device):  # Device.set_current("cpu:0"): the current is untouched
            raise InvalidTypeError(
                f"Device.set_current is called on a Device, not a {type(self).__name__}: use "
                f"srt.Device({self!r}).set_current()"
            )
        _tls.device = self

    def __enter__(self) -> Device:
        stack = _tls.__dict__.setdefault("stack", [])
        stack.append(getattr(_tls, "device", None))
        _tls.device = self
        return self

    def __exit__(self, *exc: object) -> None:
        _tls.device = _tls.stack.pop()

    # -- streams and memory -------------------------------------------------------------
    @property
    def default_stream(self) -> Stream:
        """The legacy default stream: implicitly ordered with every blocking stream."""
        legacy = self._legacy
        if legacy is None:
            from .stream import Stream

            with _registry_lock:
                if self._legacy is None:
                    self._legacy = Stream._make_legacy(self)
                legacy = self._legacy
        return legacy

    def synchronize(self) -> None:
        """Wait for all work on every stream of this device (``cudaDeviceSynchronize``)."""
        synchronize_device(self)

    def memory_info(self) -> tuple[int, int]:
        """``(free_bytes, total_bytes)`` of device memory (``cudaMemGetInfo``)."""
        impl = self._impl
        return max(impl.capacity - impl.used(), 0), impl.capacity

    def graph_mem_info(self) -> dict[str, int]:
        """Graph memory: ``reserved`` (backing live execs) and ``used`` (live allocations)
        (``cudaDeviceGetGraphMemAttribute``)."""
        return {"reserved": self._graph_reserved, "used": self._graph_used}

    def graph_mem_attrs(self) -> dict[str, int]:
        """Graph memory in bytes (``cudaDeviceGetGraphMemAttribute``): ``used_mem_current`` (live
        graph allocations), ``reserved_mem_current`` (memory backing execs' allocations) and
        their ``*_high`` watermarks; on cuda, CUDA's own graph allocator's bytes are added."""
        native = self._impl.graph_mem_native()
        with self._pool_lock:
            own = (self._graph_used, self._graph_used_high, self._graph_reserved,
                   self._graph_reserved_high)
        # the backend's own allocator holds other memory than the frontend maps: the sums are
        # exact for the currents, and for the highs exact where only one of them held memory
        return dict(zip(GRAPH_MEM_ATTRS, (a + b for a, b in zip(own, native))))

    def reset_graph_mem_high(self) -> None:
        """Reset the ``*_high`` graph memory watermarks to the current values
        (``cudaDeviceSetGraphMemAttribute`` of the highs)."""
        self._impl.graph_mem_reset_high()
        with self._pool_lock:
            self._graph_used_high = self._graph_used
            self._graph_reserved_high = self._graph_reserved

    def graph_mem_trim(self) -> None:
        """Release graph memory no exec needs any more (``cudaDeviceGraphMemTrim``): that of
        destroyed execs whose work has run and whose allocations were freed, without waiting
        for the next synchronize to do it."""
        from .graph.memory import trim  # graph memory builds on devices

        trim(self)
        self._impl.graph_mem_trim()

    @property
    def default_mem_pool(self) -> MemPool:
        """The device's default memory pool (``cudaDeviceGetDefaultMemPool``)."""
        pool = self._default_pool
        if pool is None:
            with _registry_lock:
                if self._default_pool is None:
                    self._default_pool = _mem_pool_class()._make_default(self)
                pool = self._default_pool
        return pool

    @property
    def mem_pool(self) -> MemPool:
        """The device's current pool, used by ``s.malloc`` without ``pool=``."""
        pool = self._pool  # once: another thread's destroy of it may reset it to None
        return pool if pool is not None else self.default_mem_pool

    def set_mem_pool(self, pool: MemPool) -> None:
        """Make ``pool`` the device's current pool (``cudaDeviceSetMemPool``)."""
        if not isinstance(pool, _mem_pool_class()):
            raise InvalidTypeError(f"set_mem_pool needs a MemPool, not {type(pool).__name__}")
        if pool.device is not self:
            raise InvalidValueError(f"{pool!r} belongs to {pool.device.name}, not {self.name}")
        with self._pool_lock:  # a destroy of the pool meanwhile must not leave it current
            pool._check_alive()
            self._pool = pool

    def _forget_pool(self, pool: MemPool) -> None:
        """A pool is being destroyed: the default pool is current again if it was (under the
        lock ``set_mem_pool`` takes, so another thread's choice meanwhile stays)."""
        with self._pool_lock:
            if self._pool is pool:
                self._pool = None

    # -- peer access ----------------------------------------------------------------------
    def _peer(self, peer: Any, what: str) -> Device:
        """``peer`` as another device of this backend (InvalidDeviceError: itself, another
        backend's, or none)."""
        if peer is None or not isinstance(peer, Device | str) and not is_int(peer):
            raise InvalidTypeError(f"{what} needs a Device (or a spec such as 'cpu:1'), not "
                                   f"{type(peer).__name__}")
        other = Device(f"{self.backend}:{int(peer)}" if is_int(peer) else peer)
        if other is self:
            raise InvalidDeviceError(f"{what}({other.name}) on {self.name}: a device's own memory "
                                     "needs no peer access (cudaErrorInvalidDevice)")
        if other.backend != self.backend:
            raise InvalidDeviceError(f"{what}({other.name}) on {self.name}: peers are devices of "
                                     f"the same backend")
        return other

    def can_access_peer(self, peer: Any) -> bool:
        """Whether this device can be given access to ``peer``'s memory (``cudaDeviceCanAccessPeer``)."""
        if peer is None or not isinstance(peer, Device | str) and not is_int(peer):
            self._peer(peer, "can_access_peer")  # its InvalidTypeError
        other = Device(f"{self.backend}:{int(peer)}" if is_int(peer) else peer)
        if other is self or other.backend != self.backend:
            return False  # as CUDA answers 0 for a device and itself
        return self._impl.can_access_peer(other._impl)

    def enable_peer_access(self, peer: Any) -> None:
        """Let this device's kernels, copies and memsets touch ``peer``'s memory
        (``cudaDeviceEnablePeerAccess``; one way: ``peer`` gets no access to this device's)."""
        other = self._peer(peer, "enable_peer_access")
        with self._pool_lock:  # one enable or disable of this device at a time
            if other.index in self._peers:
                raise PeerAccessAlreadyEnabledError(
                    f"{self.name} already has peer access to {other.name}")
            if not self._impl.can_access_peer(other._impl):
                raise NotSupportedError(f"{self.name} cannot access {other.name}'s memory "
                                        "(cudaErrorPeerAccessUnsupported)")
            self._impl.enable_peer_access(other._impl)
            self._peers = self._peers | {other.index}

    def disable_peer_access(self, peer: Any) -> None:
        """Take back :meth:`enable_peer_access` (``cudaDeviceDisablePeerAccess``): later work of
        this device touching ``peer``'s memory is refused again."""
        other = self._peer(peer, "disable_peer_access")
        with self._pool_lock:
            if other.index not in self._peers:
                raise PeerAccessNotEnabledError(
                    f"{self.name} has no peer access to {other.name} to disable")
            self._peers = self._peers - {other.index}  # first: no check passes meanwhile
            self._impl.disable_peer_access(other._impl)
        for ge in members(self._execs):  # a launch record skips the checks: take the general path
            ge._rec = None

    def _check_copy(self, dst: Any, src: Any, nbytes: int) -> None:
        """:meth:`_check_reach` of a copy's device pointers (host buffers pass)."""
        for end in (dst, src):
            if type(end) is int or is_int(end):
                self._check_reach(int(end), nbytes, "memcpy")

    def _check_reach(self, ptr: int, nbytes: int, what: str) -> None:
        """Refuse ``what`` (work of this device) touching ``nbytes`` at ``ptr`` when that is
        another device's memory and this device has no peer access to it (a GPU faults)."""
        d = self._impl.device_of(ptr)
        if d >= 0 and d != self.index and d not in self._peers:
            raise InvalidAddressError(no_peer_access(self, d, ptr, nbytes, what))

    def reset(self) -> None:
        """Synchronize, then destroy every stream, event, pool and allocation (``aclrtResetDevice``)."""
        from .reset import reset_device  # it destroys everything above this module

        reset_device(self)


def no_peer_access(dev: Device, index: int, ptr: int, nbytes: int, what: str) -> str:
    """The message of work of ``dev`` refused for touching device ``index``'s memory."""
    peer = f"{dev.backend}:{index}"
    return (f"{what} on {dev.name} touches {hex(ptr)}+{nbytes}, memory of {peer}, without peer "
            f"access (Device({dev.name!r}).enable_peer_access({peer!r}); a GPU faults here)")


GRAPH_MEM_ATTRS = ("used_mem_current", "used_mem_high", "reserved_mem_current",
                   "reserved_mem_high")  # cudaGraphMemAttributeType's order


def _mem_pool_class() -> type[MemPool]:
    """``MemPool``: pools are made of devices, so the pool package imports this module."""
    from .pool import MemPool

    return MemPool


def current_device() -> Device:
    """The calling thread's current device (default: ``STREAMRT_DEVICE`` index 0)."""
    dev = getattr(_tls, "device", None)
    if dev is None:
        dev = Device(f"{_default_backend()}:0")
        _tls.device = dev
    return dev


def device_count(backend: str = "cpu") -> int:
    """Number of devices of ``backend`` usable here (0 for an unavailable backend)."""
    if not isinstance(backend, str):
        raise InvalidTypeError(f"a backend is named by a str such as 'cuda', not {type(backend).__name__}")
    if backend not in BACKENDS:
        raise InvalidDeviceError(f"unknown backend {backend!r}: known are {', '.join(BACKENDS)}")
    return _backend_device_count(backend)


def range_of(ptr: int) -> tuple[Device | None, MemRange] | None:
    """The allocation of any backend in use holding ``ptr`` and its device (None for pinned
    host memory), or None."""
    for backend in loaded_backends():
        r = backend.range_of(ptr)
        if r is not None:
            if r.device < 0:
                return None, r
            # an allocation's device is open: found without parsing a spec
            return _registry.get((backend.name, r.device)) or Device(f"{backend.name}:{r.device}"), r
    return None


def push_stream(stream: Stream) -> None:
    """``with stream:`` entered on this thread: it is its device's current stream."""
    _tls.__dict__.setdefault("streams", []).append(stream)


def pop_stream() -> None:
    """The innermost ``with stream:`` of this thread left."""
    _tls.streams.pop()


def current_stream() -> Stream:
    """The stream ``srt.*`` helpers use: the current device's, i.e. the innermost ``with stream:``
    of that device, else its default stream (current streams are per device, as in PyTorch)."""
    dev = current_device()
    stack = getattr(_tls, "streams", None)
    if stack:
        for s in reversed(stack):
            if s.device is dev:
                return s
    return dev.default_stream


def devices() -> list[Device]:
    """Every device already opened."""
    return list(_registry.values())
