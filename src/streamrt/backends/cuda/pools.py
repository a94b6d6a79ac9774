"""The native pools of one GPU (``cudaMemPool_t``), which ``MemPool`` runs on for cuda devices.

State and invariants:
- ``_live``: every block allocated from a pool of the device and not yet freed, whatever the
  pool; each is also in the device's ranges (kind ``"pool"``), so copies and fills may use it.
- ``_created``: the pools :meth:`CudaPools.create` made and :meth:`CudaPools.destroy` has not
  destroyed. A device reset (:meth:`CudaPools.reset`) frees the live blocks, destroys the created
  pools and trims the default one, so that nothing of the pools outlives the reset.
- Pools are the driver's handles; the frontend keeps their attributes and statistics there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import OutOfMemoryError
from ..base import NativePools
from .errors import check
from .runtime import SIZE_MAX, activate, drv, legacy_stream, rt, too_big

if TYPE_CHECKING:
    from .device import CudaDevice, Ranges
    from .queue import CudaQueue

__all__ = ["CudaPools"]

_RESERVED_CURRENT, _USED_CURRENT = 5, 7  # cudaMemPoolAttrReservedMemCurrent, UsedMemCurrent


class CudaPools(NativePools):
    """The ``cudaMemPool_t`` pools of device ``dev``; blocks are recorded in ``ranges``."""

    def __init__(self, dev: CudaDevice, ranges: Ranges) -> None:
        self._dev = dev
        self._index = dev.index
        self._ranges = ranges
        self._live: set[int] = set()
        self._created: dict[int, Any] = {}

    def default(self) -> Any:
        """The device's default pool (``cudaDeviceGetDefaultMemPool``)."""
        return check(rt.cudaDeviceGetDefaultMemPool(self._index))

    def create(self, max_size: int) -> Any:
        """A new pool of pinned device memory on this device (``cudaMemPoolCreate``)."""
        props = rt.cudaMemPoolProps()
        props.allocType = rt.cudaMemAllocationType.cudaMemAllocationTypePinned
        props.location.type = rt.cudaMemLocationType.cudaMemLocationTypeDevice
        props.location.id = self._index
        # a limit at or past the device's memory is none: 0, the driver's own maximum (a larger
        # maxSize, up to SIZE_MAX, is a value the documentation never promises to accept)
        props.maxSize = max_size if max_size < self._dev.capacity else 0
        pool = check(rt.cudaMemPoolCreate(props))
        self._created[int(pool)] = pool
        return pool

    def get(self, pool: Any, attr: int) -> int:
        """``cudaMemPoolGetAttribute`` as an int."""
        return int(check(rt.cudaMemPoolGetAttribute(pool, rt.cudaMemPoolAttr(attr))))

    def set(self, pool: Any, attr: int, value: int) -> None:
        """``cudaMemPoolSetAttribute``: flags as int, sizes as ``cuuint64_t``."""
        v: Any = int(value) if attr <= 3 else drv.cuuint64_t(min(int(value), SIZE_MAX))
        check(rt.cudaMemPoolSetAttribute(pool, rt.cudaMemPoolAttr(attr), v))

    def malloc(self, pool: Any, nbytes: int, queue: CudaQueue) -> int:  # type: ignore[override]
        """``cudaMallocFromPoolAsync`` on the queue's stream."""
        what = f"cuda:{self._index}: cudaMallocFromPoolAsync"
        too_big(nbytes, what)
        capacity = self._dev.capacity
        if nbytes > capacity:  # which error the driver gives for it is undocumented
            raise OutOfMemoryError(f"{what} of {nbytes} bytes: more than the device's {capacity} bytes")
        activate(self._index)
        try:
            ptr = int(check(rt.cudaMallocFromPoolAsync(max(nbytes, 1), pool, queue.stream)))
        except OutOfMemoryError as exc:
            free, total = self._dev.memory_info()
            raise OutOfMemoryError(
                f"{what} of {nbytes} bytes failed: the pool reserves "
                f"{self.get(pool, _RESERVED_CURRENT)} bytes ({self.get(pool, _USED_CURRENT)} in "
                f"use); {free} of {total} bytes of the device free") from exc
        self._ranges.add(ptr, nbytes, "pool")
        self._live.add(ptr)
        return ptr

    def free(self, ptr: int, queue: CudaQueue) -> None:  # type: ignore[override]
        """``cudaFreeAsync`` on the queue's stream."""
        activate(self._index)
        check(rt.cudaFreeAsync(ptr, queue.stream))
        self._forget(ptr)

    def free_now(self, ptr: int) -> None:
        """``cudaFreeAsync`` on the legacy stream, then its synchronize (``srt.free``)."""
        activate(self._index)
        legacy = legacy_stream()
        check(rt.cudaFreeAsync(ptr, legacy))
        self._forget(ptr)
        check(rt.cudaStreamSynchronize(legacy))

    def _forget(self, ptr: int) -> None:
        self._ranges.drop(ptr)
        self._live.discard(ptr)

    def trim(self, pool: Any, keep: int) -> None:
        """``cudaMemPoolTrimTo``."""
        check(rt.cudaMemPoolTrimTo(pool, min(keep, SIZE_MAX)))

    def destroy(self, pool: Any) -> None:
        """``cudaMemPoolDestroy``: CUDA releases the memory once its allocations are freed."""
        check(rt.cudaMemPoolDestroy(pool))
        self._created.pop(int(pool), None)

    def reset(self) -> None:
        """Device reset: live blocks freed, created pools destroyed, the default pool trimmed
        (the frontend synchronized the device)."""
        activate(self._index)
        legacy = legacy_stream()
        for ptr in list(self._live):
            check(rt.cudaFreeAsync(ptr, legacy))
            self._ranges.drop(ptr)
        self._live.clear()
        check(rt.cudaStreamSynchronize(legacy))
        for pool in list(self._created.values()):
            check(rt.cudaMemPoolDestroy(pool))
        self._created.clear()
        check(rt.cudaMemPoolTrimTo(self.default(), 0))
