"""``srt.MemPool``: the one small interface every kind of stream-ordered pool implements.

Two siblings implement it: :class:`~streamrt.pool.arena_pool.ArenaPool`, the frontend's own
pool (DESIGN.md §3 over an arena the backend reserves: a backend whose ``DeviceImpl.pools`` is
None, as the cpu backend), and :class:`~streamrt.pool.native.NativePool`, a pool of the
backend's own allocator (``cudaMemPool_t``). ``srt.MemPool(device, ...)`` makes the one the
device calls for, so a program never names either; both are ``MemPool`` instances.

State common to both, set by ``MemPool.__init__``: ``device``; ``_opts``, the validated
:class:`PoolOptions` (an arena pool's are its current options, replaced whole by ``set_attr``;
a native pool's driver holds the current ones, ``_opts`` keeps what it was made with);
``_is_default`` (a device's default pool, which cannot be destroyed); ``_destroyed`` (set once,
never cleared: by ``destroy`` or a device reset); ``_lock``, the pool's lock. Each kind adds a
pool to ``device._pools`` once it is complete (a device reset reaches it there).

What the rest of the runtime calls on a pool, beside the public methods: ``_malloc(stream, n)``
and ``_free(stream, ptr)`` (``s.malloc``/``s.free``, called directly on their fast path),
``_free_now(ptr)`` (``srt.free`` of pool memory, after a device synchronize), ``_usable(ptr)``
(bytes of the live allocation starting at ``ptr``) and ``_reset()`` (device reset).
"""

from __future__ import annotations

import inspect
import threading
from typing import TYPE_CHECKING, Any, ClassVar

from ..device import Device
from ..errors import InvalidHandleError, InvalidValueError
from .attrs import MemPoolAttr, PoolOptions, nonneg, with_attr_properties
from .attrs import parse as parse_attr
from .attrs import value as attr_value

if TYPE_CHECKING:
    from ..stream import Stream

__all__ = ["MemPool"]


@with_attr_properties
class MemPool:
    """A stream-ordered memory pool (``cudaMemPool_t`` / ``aclrtMemPool``)."""

    native: ClassVar[bool]  # a sibling: True for pools of the backend's own allocator
    _kinds: ClassVar[dict[bool, type[MemPool]]] = {}  # native -> the sibling

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        MemPool._kinds[cls.native] = cls

    def __new__(cls, device: Any = None, **options: Any) -> MemPool:
        if cls is MemPool:  # the factory: the kind of pool the device's backend calls for
            cls = MemPool._kinds[Device(device)._impl.pools is not None]
        return super().__new__(cls)

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

    @classmethod
    def _make_default(cls, device: Device) -> MemPool:
        """A device's default pool (``cudaDeviceGetDefaultMemPool``), of the kind it calls for."""
        return MemPool._kinds[device._impl.pools is not None]._default(device)

    @property
    def max_size(self) -> int:
        """The most bytes the pool may reserve (0: no limit beyond the device)."""
        return self._opts.max_size

    def __repr__(self) -> str:
        kind = "default " if self._is_default else ""
        return (f"<MemPool {kind}{self.device.name} {self._describe()}"
                f"{' destroyed' if self._destroyed else ''}>")

    def _check_alive(self) -> None:
        if self._destroyed:
            raise InvalidHandleError(f"{self!r} was destroyed")

    def _serves(self, stream: Stream) -> None:
        """Refuse a stream of another device (pools are per device)."""
        if stream.device is not self.device:
            raise InvalidValueError(
                f"{self!r} cannot serve a stream of {stream.device.name}: pools are per device")

    def _frees_on(self, stream: Stream, ptr: int) -> None:
        """Refuse a free of this pool's ``ptr`` on a stream of another device."""
        if stream.device is not self.device:
            raise InvalidValueError(
                f"{hex(ptr)} belongs to a pool of {self.device.name}; free it on a stream of "
                f"that device, not {stream.device.name}")

    # -- public methods ---------------------------------------------------------------------
    def get_attr(self, attr: MemPoolAttr | int) -> int:
        """``cudaMemPoolGetAttribute``: flags as 0/1, sizes in bytes."""
        raise NotImplementedError  # each kind of pool implements it

    def set_attr(self, attr: MemPoolAttr | int, value: Any) -> None:
        """``cudaMemPoolSetAttribute``: the three flags, the threshold, and ``*_HIGH`` = 0 (reset)."""
        attr = parse_attr(attr)
        self._check_alive()
        self._store_attr(attr, attr_value(attr, value))

    def stats(self) -> dict[str, Any]:
        """The pool's attributes and counters, as a dict of ints (a native pool: None for what
        its backend hides).

        - the eight attributes (:class:`MemPoolAttr`), by lower-case name:
          ``reuse_follow_event_dependencies`` ... ``used_mem_high``;
        - ``alloc_count``, ``free_count``: stream-ordered allocations and frees made;
          ``live_allocations``: allocations not freed yet;
        - the kind of memory each allocation got, one counter per allocation (their sum is
          ``alloc_count``), in the order the pool tries them (DESIGN.md §3):
          ``reuse_same_stream``: a block freed on the allocating stream;
          ``reuse_after_sync``: a block whose free a host synchronize proved complete;
          ``fresh_count``: reserved memory no allocation has used yet (the rest of a chunk an
          earlier growth mapped; a block that holds any freed memory counts as reuse);
          ``reuse_event_dependency``: a block freed on a stream the allocating one already
          follows through events; ``reuse_opportunistic``: a block whose free had already run;
          ``reuse_merged``: adjacent free blocks of the first two kinds, merged to fit;
          ``grow_count``: the pool grew (mapped more of its range);
          ``reuse_internal_dependency``: a block still pending on another stream, the
          allocating stream made to wait for its free;
        - ``oom_count``: allocations refused with ``OutOfMemoryError``;
        - ``release_count``: granules given back to the device (release threshold, ``trim_to``);
        - ``largest_free_block``: bytes of the largest free block with memory behind it;
        - ``chunks``: the granules mapped now.
        """
        return self._collect_stats()

    def _collect_stats(self) -> dict[str, Any]:
        raise NotImplementedError  # each kind of pool implements it

    def trim_to(self, min_bytes_to_keep: int) -> None:
        """Release entirely free, sync-proven chunks while ``reserved - chunk >= min_bytes_to_keep``."""
        keep = nonneg(min_bytes_to_keep, "min_bytes_to_keep")
        self._check_alive()
        self._trim(keep)

    def destroy(self) -> None:
        """``cudaMemPoolDestroy``: memory goes back once its last allocation is freed and proven."""
        self._check_alive()
        if self._is_default:
            raise InvalidValueError("the default memory pool of a device cannot be destroyed")
        self._destroy()

    # -- what each kind implements -------------------------------------------------------------
    @classmethod
    def _default(cls, device: Device) -> MemPool:
        """The device's default pool of this kind."""
        raise NotImplementedError  # each kind of pool implements it

    def _describe(self) -> str:
        """What ``repr`` says of the pool's state."""
        raise NotImplementedError  # each kind of pool implements it

    def _store_attr(self, attr: MemPoolAttr, value: int) -> None:
        """Apply a validated attribute write (a ``*_HIGH`` write resets the watermark)."""
        raise NotImplementedError  # each kind of pool implements it

    def _malloc(self, stream: Stream, nbytes: int) -> int:
        """``s.malloc(nbytes)`` from this pool (or its MEM_ALLOC node while ``stream`` captures)."""
        raise NotImplementedError  # each kind of pool implements it

    def _free(self, stream: Stream, ptr: int) -> None:
        """``s.free(ptr)`` of this pool's allocation (or its MEM_FREE node while capturing)."""
        raise NotImplementedError  # each kind of pool implements it

    def _free_now(self, ptr: int) -> None:
        """``srt.free`` of this pool's allocation: the device is synchronized; freed on return."""
        raise NotImplementedError  # each kind of pool implements it

    def _usable(self, ptr: int) -> int | None:
        """Bytes of the live allocation starting at ``ptr`` (None: not one of this pool)."""
        raise NotImplementedError  # each kind of pool implements it

    def _trim(self, keep: int) -> None:
        """``trim_to`` of a live pool, ``keep`` validated."""
        raise NotImplementedError  # each kind of pool implements it

    def _destroy(self) -> None:
        """``destroy`` of a live pool that is not a default one."""
        raise NotImplementedError  # each kind of pool implements it

    def _reset(self) -> None:
        """Device reset: the backend frees the memory; forget every allocation."""
        raise NotImplementedError  # each kind of pool implements it


# what help() and inspect show for srt.MemPool(...): the keywords of __init__, not the factory's
_init = inspect.signature(MemPool.__init__)
MemPool.__signature__ = _init.replace(parameters=list(_init.parameters.values())[1:])  # type: ignore[attr-defined]
