"""Memory pools on a backend's own stream-ordered allocator (``cudaMemPool_t`` on cuda).

The reuse decision, threshold and trim are then the driver's (the same rules as DESIGN.md §3,
which follows CUDA); :class:`NativePool` maps the API onto the backend's
:class:`~streamrt.backends.base.NativePools` and keeps only what CUDA does not: which live
pointer belongs to which pool, and the alloc/free counters. The per-step reuse counters of
``stats()`` are None: CUDA does not expose them.

State (beside :class:`~streamrt.pool.mempool.MemPool`'s), guarded by ``_lock``: ``_handle``
(the driver's pool), ``_live`` (live pointer -> bytes asked for; each is in the registry's
``_owners`` too), ``_counts`` (alloc/free counts) and ``_final`` (the attributes when destroyed:
a destroyed pool still answers ``get_attr``, as a destroyed arena pool does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..backends.base import NativePools
from ..errors import InvalidAddressError
from .attrs import OPTIONS, MemPoolAttr
from .attrs import parse as parse_attr
from .mempool import MemPool
from .registry import _owners

if TYPE_CHECKING:
    from ..device import Device
    from ..stream import Stream

_NOT_EXPOSED = (
    "reuse_same_stream", "reuse_after_sync", "reuse_event_dependency", "reuse_opportunistic",
    "reuse_merged", "reuse_internal_dependency", "fresh_count", "grow_count", "release_count", "oom_count",
    "largest_free_block", "chunks",
)


class NativePool(MemPool):
    """A :class:`MemPool` on the backend's pool; ``stats()`` reports None for what it hides."""

    native = True

    def __init__(self, device: Any = None, *, _handle: Any = None, **options: Any) -> None:
        super().__init__(device, **options)
        self._native = self._pools_of(self.device)
        self._handle = _handle if _handle is not None else self._native.create(self.max_size)
        self._is_default = _handle is not None
        self._final: dict[MemPoolAttr, int] = {}
        self._live: dict[int, int] = {}
        self._counts = {"alloc_count": 0, "free_count": 0}
        if _handle is None:  # a wrapped default pool keeps the driver's settings
            for attr, name in OPTIONS.items():  # the three flags, then the threshold
                self._native.set(self._handle, int(attr), int(getattr(self._opts, name)))
        self.device._pools.add(self)

    @classmethod
    def _default(cls, device: Device) -> MemPool:
        return cls(device, _handle=cls._pools_of(device).default())

    @staticmethod
    def _pools_of(device: Device) -> NativePools:
        """The backend's own pools (``DeviceImpl.pools``), which this class runs on."""
        pools = device._impl.pools
        assert pools is not None, "a native pool on a backend without native pools"
        return pools

    def _describe(self) -> str:
        return "(native)"

    # -- attributes -----------------------------------------------------------------------
    def get_attr(self, attr: MemPoolAttr | int) -> int:
        """``cudaMemPoolGetAttribute``: flags as 0/1, sizes in bytes (a destroyed pool: the values
        it had when destroyed, as a destroyed arena pool keeps its own)."""
        attr = parse_attr(attr)
        if self._destroyed:  # CUDA releases a destroyed pool with its last allocation
            gone = not self._live and attr in (MemPoolAttr.RESERVED_MEM_CURRENT,
                                               MemPoolAttr.USED_MEM_CURRENT)
            return 0 if gone else self._final.get(attr, 0)
        return self._native.get(self._handle, int(attr))

    def _store_attr(self, attr: MemPoolAttr, value: int) -> None:
        """The driver applies the write (and resets a watermark written 0)."""
        self._native.set(self._handle, int(attr), value)

    def _collect_stats(self) -> dict[str, Any]:
        """``stats()``: the eight attributes and the alloc/free counts; counters CUDA hides are None."""
        out: dict[str, Any] = {a.name.lower(): self.get_attr(a) for a in MemPoolAttr}
        out.update(self._counts)
        out.update(dict.fromkeys(_NOT_EXPOSED))
        out["live_allocations"] = len(self._live)
        return out

    # -- stream-ordered allocation ----------------------------------------------------------
    def _malloc(self, stream: Stream, nbytes: int) -> int:
        self._check_alive()
        self._serves(stream)
        cap = stream._capture  # once: a capture another thread began after the fast-path test
        if cap is not None:
            return cap.malloc(stream, self, nbytes)  # type: ignore[no-any-return]
        got: list[int] = []
        # cudaMallocFromPoolAsync is work of the stream (it may make it wait for another stream's
        # free): an operation of its queue, so that a synchronize of the stream waits for it
        stream._submit(lambda: got.append(self._native.malloc(self._handle, nbytes, stream._q)),
                       (), "malloc", f"malloc {nbytes} B")
        ptr = got[0]
        with self._lock:
            self._live[ptr] = max(nbytes, 1)
            _owners[ptr] = self
            self._counts["alloc_count"] += 1
        return ptr

    def _free(self, stream: Stream, ptr: int) -> None:
        self._frees_on(stream, ptr)
        cap = stream._capture  # once: a capture another thread began after the fast-path test
        if cap is not None:
            return cap.free(stream, ptr, self)  # type: ignore[no-any-return]
        self._forget(ptr)
        # an operation of the queue (see _malloc): a synchronize of a stream that did nothing but
        # free must still be one, where the driver applies the release threshold
        stream._submit(self._native.free, (ptr, stream._q), "free", f"pool free {hex(ptr)}")

    def _free_now(self, ptr: int) -> None:
        self._forget(ptr)
        self._native.free_now(ptr)

    def _forget(self, ptr: int) -> None:
        with self._lock:
            if ptr not in self._live or _owners.get(ptr) is not self:
                raise InvalidAddressError(f"free of {hex(ptr)}: not a live allocation of {self!r}")
            del self._live[ptr], _owners[ptr]
            self._counts["free_count"] += 1

    def _usable(self, ptr: int) -> int | None:
        return self._live.get(ptr)

    def _trim(self, keep: int) -> None:
        self._native.trim(self._handle, keep)

    def _destroy(self) -> None:
        self._final = {a: self.get_attr(a) for a in MemPoolAttr}
        self._destroyed = True  # before the forget: set_mem_pool checks it under the same lock
        self.device._forget_pool(self)
        self._native.destroy(self._handle)

    def _reset(self) -> None:
        with self._lock:
            for ptr in self._live:
                _owners.pop(ptr, None)
            self._live.clear()
            self._final = {}  # its memory went with the reset
            self._destroyed = True
