"""CUDA's own graph allocator's attributes and trim (``cudaDeviceGetGraphMemAttribute``,
``cudaDeviceSetGraphMemAttribute``, ``cudaDeviceGraphMemTrim``). Nothing in the fake uses that
allocator (no memory nodes: ``cudaGraphAddMemAllocNode`` is not faked and a capture refuses
``cudaMallocAsync``): every device's four attributes are 0, the highs may be reset (set to 0)
and nothing else set, and a trim has nothing to free.
"""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver as drv
from cuda.bindings import runtime as rt

from . import streams
from .binding import runtime
from .state import SUCCESS, E

_MEM = rt.cudaGraphMemAttributeType


# -- CUDA's own graph allocator: unused by anything the fake runs (see the module docstring) ------
def _device_ok(device: Any) -> bool:
    return isinstance(device, int) and 0 <= device < len(streams.DEVICES)


@runtime("cudaDeviceGetGraphMemAttribute")
def cudaDeviceGetGraphMemAttribute(device: int, attr: Any) -> tuple:
    if not _device_ok(int(device)):
        return (E.cudaErrorInvalidDevice, None)
    if int(attr) not in {int(a) for a in _MEM}:
        return (E.cudaErrorInvalidValue, None)
    return (SUCCESS, drv.cuuint64_t(0))


@runtime("cudaDeviceSetGraphMemAttribute")
def cudaDeviceSetGraphMemAttribute(device: int, attr: Any, value: Any) -> tuple:
    if not _device_ok(int(device)):
        return (E.cudaErrorInvalidDevice,)
    highs = (int(_MEM.cudaGraphMemAttrUsedMemHigh), int(_MEM.cudaGraphMemAttrReservedMemHigh))
    if int(attr) not in highs or int(value) != 0:  # a high watermark may only be reset
        return (E.cudaErrorInvalidValue,)
    return (SUCCESS,)


@runtime("cudaDeviceGraphMemTrim")
def cudaDeviceGraphMemTrim(device: int) -> tuple:
    if not _device_ok(int(device)):
        return (E.cudaErrorInvalidDevice,)
    return (SUCCESS,)
