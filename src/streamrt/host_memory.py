"""Memory calls the host makes synchronously (not stream-ordered), and pinned host memory:
``srt.malloc``/``free``, ``srt.malloc_host``/``free_host``, ``srt.memcpy``/``memset``,
``srt.read``/``write``."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import instrument
from .backends import get_backend, loaded_backends
from .device import Device, current_device, devices
from .errors import InvalidAddressError, InvalidTypeError, InvalidValueError, OutOfMemoryError
from .graph import memory as graph_memory
from .graph.capture import check_unsafe
from .pool import device_of, find_pool, registry
from .stream import current_stream
from .sync import synchronize_device
from .validate import check_ptr, check_size, host_array, is_int


def malloc(nbytes: int, device: Any = None) -> int:
    """Allocate device memory synchronously (``cudaMalloc`` / ``aclrtMalloc``)."""
    check_unsafe("srt.malloc")
    return device_alloc(check_size(nbytes), Device(device))


def device_alloc(n: int, device: Device) -> int:
    """``n`` bytes of ``device`` memory, known to the pools' registry and the observers (what
    ``srt.malloc`` does past its capture rule; a conditional handle's value lives in one)."""
    ptr = device._impl.malloc(n)
    registry._requested[ptr] = n  # what may be used (the backend rounds the range up)
    if instrument.listeners:
        instrument.notify("alloc", None, ptr, n)
    return ptr


def free(ptr: int) -> None:
    """Free device memory (``cudaFree``): synchronizes the device first; pool memory is allowed."""
    check_unsafe("srt.free")
    ptr = check_ptr(ptr)
    if ptr == 0:
        return  # cudaFree(NULL) is a no-op

    # whose memory it is: a pool's, a graph's (it outlives its launch until freed, cudaFree
    # included) or a device's srt.malloc; then one path: synchronize, tell, release
    pool = find_pool(ptr)
    graph_alloc = graph_memory.find(ptr) if pool is None else None
    if pool is not None:
        device, release = pool.device, pool._free_now
    elif graph_alloc is not None:
        device, release = graph_alloc.device, lambda p: graph_memory.free_outside(p, None)
    else:
        device = next((d for d in devices() if d._impl.owns(ptr)), None)
        if device is None:
            raise InvalidAddressError(
                f"free of {hex(ptr)}: not a live device allocation (double free?)")
        release = device._impl.free
    synchronize_device(device, skip_capturing=True)
    if instrument.listeners:
        instrument.notify("free", None, ptr)
    release(ptr)
    if pool is None and graph_alloc is None:
        registry._requested.pop(ptr, None)


def malloc_host(nbytes: int) -> int:
    """Allocate pinned host memory, a fully asynchronous copy endpoint (``cudaMallocHost``)."""
    check_unsafe("srt.malloc_host")
    n = check_size(nbytes)
    return get_backend(current_device().backend).malloc_host(n)


def free_host(ptr: int) -> None:
    """Free pinned host memory (``cudaFreeHost``)."""
    check_unsafe("srt.free_host")
    ptr = check_ptr(ptr)
    # any backend's: as cudaFreeHost, it need not be the current device's (another thread's)
    owner = next((b for b in loaded_backends() if b.owns_host(ptr)), None)
    (owner or get_backend(current_device().backend)).free_host(ptr)  # None: its error


def memcpy(dst: Any, src: Any, nbytes: int) -> None:
    """Synchronous copy (``cudaMemcpy``) on the current stream (or the device owning the memory)."""
    check_unsafe("srt.memcpy")
    s = _stream_for(dst, src)
    # as cudaMemcpy/cudaMemcpyPeer: serialized with the pending work of the current device and
    # of both ends' devices, not only with the device whose legacy stream runs the copy
    for dev in _devices_of(dst, src):
        if dev is not s.device and dev.backend == s.device.backend:  # no cross-backend waits
            s.wait(dev.default_stream.record())
    # as cudaMemcpyPeer, across devices with or without peer access: not s.memcpy's check
    s._target.memcpy(s, dst, src, check_size(nbytes))
    s.synchronize()


def memset(ptr: int, value: int, nbytes: int) -> None:
    """Synchronous byte fill (``cudaMemset``) on the current stream (or the owning device's)."""
    check_unsafe("srt.memset")
    s = _stream_for(ptr)
    s.memset(ptr, value, nbytes)
    s.synchronize()


def _stream_for(*ends: Any) -> Any:
    """The current stream, unless a device pointer belongs to another device: as ``cudaMemcpy``
    with unified addressing, the copy then runs on that device's default stream. A capturing
    current stream (``graph_capture`` makes its stream current) cannot run it either: as
    ``cudaMemcpy``, it runs on the legacy stream (where RELAXED mode lets it through)."""
    s = current_stream()
    if s._capture is not None:
        s = s.device.default_stream
    for end in ends:
        if is_int(end):
            dev = device_of(int(end))
            if dev is not None and dev is not s.device:
                return dev.default_stream
    return s


def _devices_of(*ends: Any) -> list[Any]:
    """The current device and the devices whose memory the device pointers among ``ends`` are."""
    out = [current_device()]
    for end in ends:
        if is_int(end):
            dev = device_of(int(end))
            if dev is not None and dev not in out:
                out.append(dev)
    return out


def read(ptr: int, shape: Any, dtype: Any) -> np.ndarray:
    """Copy device memory out into a new array (synchronous; a copy, not a view)."""
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError) as exc:
        raise InvalidTypeError(f"srt.read: {dtype!r} is not a numpy dtype") from exc
    try:
        out = np.empty(shape, dt)
    except TypeError as exc:
        raise InvalidTypeError(f"srt.read: shape must be an int or a tuple of ints, not "
                               f"{shape!r}") from exc
    except ValueError as exc:  # negative dimensions, or more elements than numpy can count
        raise InvalidValueError(f"srt.read: bad shape {shape!r} for {dt}: {exc}") from exc
    except MemoryError as exc:
        raise OutOfMemoryError(f"srt.read: no host memory for {shape!r} of {dt}") from exc
    memcpy(out, ptr, out.nbytes)
    return out


def write(ptr: int, array: Any) -> None:
    """Copy a host array into device memory (synchronous)."""
    _check_data(array)
    a = host_array(array, "srt.write")
    if a.dtype.kind == "U":  # a list of str: numpy would copy the text as UTF-32
        raise InvalidTypeError(f"srt.write: a {type(array).__name__} of text ({a.dtype}) is not "
                               "data: encode it or convert it to a numeric array")
    memcpy(ptr, a, a.nbytes)


def _check_data(obj: Any) -> None:
    """``obj`` is something ``srt.write`` copies: an array, a buffer, a (nested) sequence or an
    array producer; a str (numpy would copy its text as UTF-32) or a Python scalar is refused."""
    if isinstance(obj, str):
        raise InvalidTypeError("srt.write copies a host array or buffer, not a str: encode it "
                               "(s.encode()) or convert it to a numeric array")
    if isinstance(obj, np.ndarray | np.generic | list | tuple) or any(
            hasattr(obj, a) for a in ("__array__", "__array_interface__", "__dlpack__")):
        return
    try:
        memoryview(obj)
    except TypeError:
        raise InvalidTypeError(f"srt.write copies a host array or buffer (numpy array, bytes, "
                               f"bytearray, memoryview), not a value of type {type(obj).__name__}") from None
