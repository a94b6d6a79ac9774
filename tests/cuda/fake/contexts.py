"""Driver contexts: each device's primary context, the one the runtime uses too.

A device has exactly one context here, its primary context (``cuDevicePrimaryCtxRetain`` gives the
same ``CUcontext`` every time and counts retains). Making it current (``cuCtxSetCurrent``) makes
its device the calling thread's current device, shared with ``cudaSetDevice`` as in CUDA, where
the runtime's current device is the device of the current (primary) context. Not modelled:
``cuCtxCreate`` contexts, a thread with no current context (``cuCtxSetCurrent(NULL)`` changes
nothing here), and a primary context released to zero retains (it stays usable).
"""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver as drv

from . import state, streams
from .binding import driver
from .state import DRV_SUCCESS, LOCK, R

PRIMARY: dict[int, int] = {}  # device -> the handle of its primary context
RETAINS: dict[int, int] = {}  # device -> retain count


def primary(device: int) -> int:
    """The handle of ``device``'s primary context (made on first use)."""
    with LOCK:
        if device not in PRIMARY:
            PRIMARY[device] = state.new_handle()
        return PRIMARY[device]


def _device_of(ctx: int) -> int | None:
    for d, h in PRIMARY.items():
        if h == ctx:
            return d
    return None


def _valid(dev: Any) -> bool:
    return 0 <= int(dev) < len(streams.DEVICES)


@driver("cuDevicePrimaryCtxRetain", 1)
def cuDevicePrimaryCtxRetain(dev: Any) -> tuple:
    if not _valid(dev):
        return (R.CUDA_ERROR_INVALID_DEVICE, None)
    h = primary(int(dev))
    with LOCK:
        RETAINS[int(dev)] = RETAINS.get(int(dev), 0) + 1
    return (DRV_SUCCESS, drv.CUcontext(h))


@driver("cuDevicePrimaryCtxRelease")
def cuDevicePrimaryCtxRelease(dev: Any) -> tuple:
    if not _valid(dev):
        return (R.CUDA_ERROR_INVALID_DEVICE,)
    with LOCK:
        if RETAINS.get(int(dev), 0) <= 0:
            return (R.CUDA_ERROR_INVALID_CONTEXT,)
        RETAINS[int(dev)] -= 1
    return (DRV_SUCCESS,)


@driver("cuCtxSetCurrent")
def cuCtxSetCurrent(ctx: Any) -> tuple:
    h = state.as_int(ctx)
    if h == 0:
        return (DRV_SUCCESS,)
    with LOCK:
        d = _device_of(h)
    if d is None:
        return (R.CUDA_ERROR_INVALID_CONTEXT,)
    state.set_current_device(d)
    return (DRV_SUCCESS,)


@driver("cuCtxGetCurrent", 1)
def cuCtxGetCurrent() -> tuple:
    return (DRV_SUCCESS, drv.CUcontext(primary(state.current_device())))


@driver("cuCtxGetDevice", 1)
def cuCtxGetDevice() -> tuple:
    return (DRV_SUCCESS, drv.CUdevice(state.current_device()))


@driver("cuCtxSynchronize")
def cuCtxSynchronize() -> tuple:
    from .capture import device_busy

    d = state.current_device()
    with LOCK:
        busy = device_busy(d)
    if busy is not None:
        return (state.to_driver(busy),)
    streams.synchronize_device(d)
    return (DRV_SUCCESS,)
