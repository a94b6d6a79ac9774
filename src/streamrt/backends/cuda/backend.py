"""The cuda backend: every GPU the CUDA runtime sees, and pinned host memory.

State: ``_host``, the live ``cudaMallocHost`` allocations (copy endpoints of every device);
the devices opened are in :data:`.device.opened`. Making the backend checks that a GPU is
usable (``cudaGetDeviceCount``) and says why not in words (:func:`why_unusable`).
"""

from __future__ import annotations

from typing import Any

from ...errors import BackendUnavailableError, InvalidAddressError, OutOfMemoryError
from ..base import Backend, MemRange
from .device import CudaDevice, Ranges, opened
from .errors import check
from .runtime import SUCCESS, drv, rt, too_big

__all__ = ["CudaBackend", "why_unusable"]

_OLD_DRIVER = rt.cudaError_t.cudaErrorInsufficientDriver


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def why_unusable(err: Any, driver: int, runtime: int) -> str:
    """What is missing, in words, when ``cudaGetDeviceCount`` finds no usable GPU (``driver``:
    the CUDA version the driver supports, 0 when there is none; ``runtime``: cuda-bindings')."""
    if err == SUCCESS:
        return "the NVIDIA driver found no GPU"
    name = rt.cudaGetErrorName(err)[1].decode()
    if err == _OLD_DRIVER and driver:
        return (f"{name}: the NVIDIA driver supports CUDA {_cuda_version(driver)}, older than the "
                f"CUDA {_cuda_version(runtime)} of the installed cuda-bindings; update the driver "
                "or install the bindings for it (pip install 'streamrt[cuda12]' for CUDA 12)")
    return f"{name} (cuda-bindings is installed; an NVIDIA driver and a GPU are also needed)"


class CudaBackend(Backend):
    """Every GPU the CUDA runtime sees."""

    name = "cuda"

    def __init__(self) -> None:
        err, count = rt.cudaGetDeviceCount()
        if err != SUCCESS or count == 0:
            driver = rt.cudaDriverGetVersion()[1] if err == _OLD_DRIVER else 0
            exc = BackendUnavailableError(
                "the cuda backend cannot be used here: "
                + why_unusable(err, driver, rt.cudaRuntimeGetVersion()[1]))
            if err != SUCCESS:  # the CUDA error itself, not the class's cudaErrorNoDevice
                exc.code, exc.name = int(err), rt.cudaGetErrorName(err)[1].decode()
            raise exc
        try:
            check(drv.cuInit(0))
        except Exception as exc:  # the driver library itself may be missing
            raise BackendUnavailableError(f"the CUDA driver could not be loaded: {exc}") from exc
        self._count = int(count)
        self._host = Ranges(-1)  # pinned host allocations

    def device_count(self) -> int:
        return self._count

    def open_device(self, index: int) -> CudaDevice:
        return CudaDevice(index, self._host)

    def malloc_host(self, nbytes: int) -> int:
        too_big(nbytes, "cudaMallocHost")
        try:
            ptr = int(check(rt.cudaMallocHost(max(nbytes, 1))))
        except OutOfMemoryError as exc:
            raise OutOfMemoryError(f"cudaMallocHost of {nbytes} bytes failed") from exc
        self._host.add(ptr, nbytes, "host")
        return ptr

    def range_of(self, ptr: int) -> MemRange | None:
        for dev in opened.values():
            found = dev.range_of(ptr)
            if found is not None:
                return found
        return self._host.find(ptr)

    def stream_device(self, handle: int) -> int:
        """``cudaStreamGetDevice`` (the legacy handles 0 and 1: the thread's current device)."""
        return int(check(rt.cudaStreamGetDevice(rt.cudaStream_t(handle))))

    def owns_host(self, ptr: int) -> bool:
        return ptr in self._host

    def free_host(self, ptr: int) -> None:
        if ptr not in self._host:
            raise InvalidAddressError(f"free_host of {hex(ptr)}: not a live pinned host allocation")
        check(rt.cudaFreeHost(ptr))
        self._host.drop(ptr)
