"""The cpu backend: a device with its own address space and one worker thread per stream.

- ``space``: the address space every cpu allocation lives in, and kernel views of it;
- ``queues``: the worker-thread queues (and delay injection);
- ``device``: device ``cpu:N`` (memory, pool arenas, graph memory);
- ``replay``: the graph runner, a flattened graph replayed as one stream operation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import InvalidAddressError, OutOfMemoryError
from ...validate import env_int
from ..base import Backend, MemRange
from .device import CpuDevice, physical_memory
from .queues import CpuQueue, delay_us, in_operations, set_delay_us
from .space import HOST_DEVICE, SPACE, hex_

if TYPE_CHECKING:
    import numpy as np

__all__ = ["SPACE", "CpuBackend", "CpuDevice", "CpuQueue", "delay_us", "in_operations",
           "physical_memory", "set_delay_us"]


class CpuBackend(Backend):
    """The default backend: ``STREAMRT_CPU_DEVICES`` devices (default 2)."""

    name = "cpu"

    def device_count(self) -> int:
        return env_int("STREAMRT_CPU_DEVICES", 2)

    def open_device(self, index: int) -> CpuDevice:
        return CpuDevice(index)

    def malloc_host(self, nbytes: int) -> int:
        try:
            return SPACE.allocate(HOST_DEVICE, nbytes, "host").base
        except (MemoryError, ValueError) as exc:  # numpy: "Maximum allowed dimension exceeded"
            raise OutOfMemoryError(f"pinned host memory: host refused {nbytes} bytes") from exc

    def owns_host(self, ptr: int) -> bool:
        alloc = SPACE.get(ptr)
        return alloc is not None and alloc.device == HOST_DEVICE

    def free_host(self, ptr: int) -> None:
        alloc = SPACE.get(ptr)
        if alloc is None or alloc.device != HOST_DEVICE:
            raise InvalidAddressError(f"free_host of {hex_(ptr)}: not a live pinned host allocation")
        SPACE.release(ptr)

    def host_view(self, ptr: int, nbytes: int) -> np.ndarray:
        alloc = SPACE.find(ptr)
        if alloc is None or alloc.device != HOST_DEVICE:
            raise InvalidAddressError(f"{hex_(ptr)} is not inside pinned host memory")
        return SPACE.span(ptr, nbytes)

    def range_of(self, ptr: int) -> MemRange | None:
        alloc = SPACE.find(ptr)
        return None if alloc is None else alloc.range()
