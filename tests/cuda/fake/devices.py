"""Devices: count, current device (per thread), properties, initialisation, synchronisation."""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver as drv
from cuda.bindings import runtime as rt

from . import memory, state, streams
from .binding import driver, runtime
from .state import DRV_SUCCESS, SUCCESS, E, R

NAME = "streamrt fake GPU"


def _valid(index: Any) -> bool:
    return isinstance(index, int) and 0 <= index < len(streams.DEVICES)


@runtime("cudaGetDeviceCount")
def cudaGetDeviceCount() -> tuple:
    n = len(streams.DEVICES)
    return (SUCCESS, n) if n else (E.cudaErrorNoDevice, 0)


@runtime("cudaSetDevice")
def cudaSetDevice(device: int) -> tuple:
    if not _valid(int(device)):
        return (E.cudaErrorInvalidDevice,)
    state.set_current_device(int(device))
    return (SUCCESS,)


@runtime("cudaGetDevice")
def cudaGetDevice() -> tuple:
    return (SUCCESS, state.current_device())


@runtime("cudaGetDeviceProperties")
def cudaGetDeviceProperties(device: int) -> tuple:
    if not _valid(int(device)):
        return (E.cudaErrorInvalidDevice, None)
    p = rt.cudaDeviceProp()
    p.name = NAME.encode().ljust(256, b"\0")
    p.totalGlobalMem = memory.capacity()
    p.major, p.minor = 9, 0  # NVRTC then targets sm_90, as on an H100/H200
    p.multiProcessorCount = 4
    p.warpSize = 32
    p.maxThreadsPerBlock = 1024
    p.maxThreadsDim = [1024, 1024, 64]
    p.maxGridSize = [2**31 - 1, 65535, 65535]
    p.sharedMemPerBlock = 48 << 10
    p.unifiedAddressing = 1
    p.memoryPoolsSupported = 1
    p.concurrentKernels = 1
    p.streamPrioritiesSupported = 1
    p.canMapHostMemory = 1
    return (SUCCESS, p)


@runtime("cudaDeviceGetStreamPriorityRange")
def cudaDeviceGetStreamPriorityRange() -> tuple:
    return (SUCCESS, 0, -5)  # (least, greatest)


@driver("cuInit")
def cuInit(flags: int) -> tuple:
    if int(flags) != 0:
        return (R.CUDA_ERROR_INVALID_VALUE,)
    return (DRV_SUCCESS,)


@driver("cuDeviceGetCount", 1)
def cuDeviceGetCount() -> tuple:
    return (DRV_SUCCESS, len(streams.DEVICES))


@driver("cuDeviceGet", 1)
def cuDeviceGet(ordinal: int) -> tuple:
    if not _valid(int(ordinal)):
        return (R.CUDA_ERROR_INVALID_DEVICE, None)
    return (DRV_SUCCESS, drv.CUdevice(int(ordinal)))


@driver("cuDeviceGetAttribute", 1)
def cuDeviceGetAttribute(attrib: Any, dev: Any) -> tuple:
    if not _valid(int(dev)):
        return (R.CUDA_ERROR_INVALID_DEVICE, None)
    a = drv.CUdevice_attribute
    known = {
        a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: 9,
        a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: 0,
        a.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: 4,
        a.CU_DEVICE_ATTRIBUTE_WARP_SIZE: 32,
        a.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: 1024,
        a.CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: 1,
        a.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: 1,
        a.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: 1,
    }
    if attrib not in known:
        raise state.FakeUnsupported(f"cuDeviceGetAttribute({attrib!r}): not modelled by the fake")
    return (DRV_SUCCESS, known[attrib])


# -- peer access: (device, peer) pairs enabled, from the device's context (cudaSetDevice) ---------
PEERS: set[tuple[int, int]] = set()


@runtime("cudaDeviceCanAccessPeer")
def cudaDeviceCanAccessPeer(device: int, peer: int) -> tuple:
    if not _valid(int(device)) or not _valid(int(peer)):
        return (E.cudaErrorInvalidDevice, 0)
    return (SUCCESS, int(int(device) != int(peer)))  # every fake GPU reaches every other


@runtime("cudaDeviceEnablePeerAccess")
def cudaDeviceEnablePeerAccess(peer: int, flags: int) -> tuple:
    """From the current device to ``peer`` (one way), as the documentation says."""
    dev, peer = state.current_device(), int(peer)
    if not _valid(peer) or peer == dev:
        return (E.cudaErrorInvalidDevice,)
    if int(flags) != 0:  # "Reserved for future use and must be set to 0"
        return (E.cudaErrorInvalidValue,)
    with state.LOCK:
        if (dev, peer) in PEERS:
            return (E.cudaErrorPeerAccessAlreadyEnabled,)
        PEERS.add((dev, peer))
    return (SUCCESS,)


@runtime("cudaDeviceDisablePeerAccess")
def cudaDeviceDisablePeerAccess(peer: int) -> tuple:
    dev, peer = state.current_device(), int(peer)
    if not _valid(peer) or peer == dev:
        return (E.cudaErrorInvalidDevice,)
    with state.LOCK:
        if (dev, peer) not in PEERS:
            return (E.cudaErrorPeerAccessNotEnabled,)
        PEERS.discard((dev, peer))
    return (SUCCESS,)
