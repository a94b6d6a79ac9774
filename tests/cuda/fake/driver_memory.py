"""Driver memory calls (``cuMemAlloc``, ``cuMemFree``, ``cuMemsetD32[Async]``, ``cuMemcpyDtoH/HtoD``).

Allocation and free are the runtime fakes' (``cudaMalloc``/``cudaFree``: one table of device
memory, ``cuMemFree`` synchronizing as ``cudaFree`` does), except that ``cuMemAlloc(0)`` is
CUDA_ERROR_INVALID_VALUE as documented. The synchronous forms run on the current device's legacy
stream, so they follow its implicit ordering with blocking streams (and not with non-blocking
ones): ``cuMemsetD32`` is asynchronous to the host for device memory, ``cuMemcpyDtoH`` and
``cuMemcpyHtoD`` return once the copy is done. ``cuMemsetD32Async`` runs in stream order on its
stream (captured as a memset node). A fill needs a 4-byte aligned device pointer.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
from cuda.bindings import driver as drv

from . import capture, memory, state, streams
from .binding import driver
from .state import DRV_SUCCESS, LOCK, R, to_driver


@driver("cuMemAlloc", 1)
def cuMemAlloc(size: int) -> tuple:
    if int(size) == 0:
        return (R.CUDA_ERROR_INVALID_VALUE, None)
    err, p = memory.cudaMalloc(int(size))
    return (to_driver(err), None if p is None else drv.CUdeviceptr(p))


@driver("cuMemFree")
def cuMemFree(ptr: Any) -> tuple:
    return (to_driver(memory.cudaFree(int(ptr))[0]),)


def _fill32(p: int, value: int, n: int) -> None:
    np.frombuffer((ctypes.c_uint32 * n).from_address(p), np.uint32)[:] = value


def _memset32(ptr: Any, value: int, count: int, stream: Any) -> tuple:
    p, v, n = state.as_int(ptr), int(value) & 0xFFFFFFFF, int(count)
    with LOCK:
        s = streams.resolve(stream)
        if s is None:
            return (R.CUDA_ERROR_INVALID_HANDLE,)
        if p % 4:
            return (R.CUDA_ERROR_INVALID_VALUE,)
        if n == 0:
            return (DRV_SUCCESS,)
        try:
            kind, _ = memory.classify(p, 4 * n)
        except memory.BadRange:
            return (R.CUDA_ERROR_INVALID_VALUE,)
        if kind == "pageable":
            return (R.CUDA_ERROR_INVALID_VALUE,)
        res = capture.intercept(s, "memset", lambda: _fill32(p, v, n))
        if res is not None:
            return (to_driver(res),)
        s.enqueue(lambda: _fill32(p, v, n), "cuMemsetD32")
    return (DRV_SUCCESS,)


@driver("cuMemsetD32")
def cuMemsetD32(dst: Any, ui: int, n: int) -> tuple:
    return _memset32(dst, ui, n, 0)


@driver("cuMemsetD32Async")
def cuMemsetD32Async(dst: Any, ui: int, n: int, stream: Any) -> tuple:
    return _memset32(dst, ui, n, stream)


def _copy_sync(dst: int, src: int, n: int, device_end: int) -> tuple:
    """A synchronous copy on the legacy stream; ``device_end`` (dst or src) must be device memory."""
    with LOCK:
        s = streams.resolve(0)
        if n == 0:
            return (DRV_SUCCESS,)
        try:
            kinds = memory.classify(dst, n)[0], memory.classify(src, n)[0]
        except memory.BadRange:
            return (R.CUDA_ERROR_INVALID_VALUE,)
        if kinds[0 if device_end == dst else 1] != "device":
            return (R.CUDA_ERROR_INVALID_VALUE,)
        res = capture.intercept(s, "memcpy", None)  # the legacy stream never captures
        if res is not None:
            return (to_driver(res),)
        staged = ctypes.create_string_buffer(ctypes.string_at(src, n), n) \
            if kinds[1] == "pageable" else None  # taken now: the caller may reuse it on return
        from_ = src if staged is None else ctypes.addressof(staged)
        seq = s.enqueue(lambda: ctypes.memmove(dst, from_, n), "synchronous memcpy")
    streams.wait_done(s, seq)
    return (DRV_SUCCESS,)


@driver("cuMemcpyDtoH")
def cuMemcpyDtoH(dst_host: Any, src_device: Any, count: int) -> tuple:
    src = state.as_int(src_device)
    return _copy_sync(memory.address(dst_host), src, int(count), src)


@driver("cuMemcpyHtoD")
def cuMemcpyHtoD(dst_device: Any, src_host: Any, count: int) -> tuple:
    dst = state.as_int(dst_device)
    return _copy_sync(dst, memory.address(src_host), int(count), dst)
