"""``acl.util``: host buffers addressed by int, as pyACL's ``numpy_to_ptr``, ``bytes_to_ptr``,
``ptr_to_numpy`` and ``ptr_to_bytes``.

A buffer given a pointer is registered as host memory for copies, as ``cudaHostRegister``
would: mapped into the current device's addresses zero-copy where its backend can
(``DeviceImpl.register``, as ``srt.from_dlpack`` maps host memory; the cpu backend), so copies
to and from it are stream-ordered device copies; elsewhere the pointer is the buffer's own host
address, and a copy takes the buffer itself (``s.memcpy`` of a host buffer, pageable rules).
The facade keeps each registered buffer's owner alive until ``acl.finalize()`` or the device's
reset: a pointer never outlives its memory. Bad input raises ``srt.InvalidValueError`` /
``InvalidAddressError`` (these are conversions, not runtime calls, and pyACL has no ``ret``
for them)."""

from __future__ import annotations

import bisect
import ctypes
import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..device import Device, current_device
from ..errors import (
    InvalidAddressError,
    InvalidTypeError,
    InvalidValueError,
    NotSupportedError,
    StreamRTError,
)
from ..interop import host_array

# pyACL's names; ``endpoint``, ``is_host``, ``forget_device`` and ``release_all`` are the
# facade's own (memory.py, context.py, acl.finalize), not offered to programs as pyACL's
__all__ = ["bytes_to_ptr", "numpy_to_ptr", "ptr_to_bytes", "ptr_to_numpy"]


@dataclass
class _Buffer:
    ptr: int  # the address handed out
    nbytes: int
    owner: Any  # what owns the memory (the array, the bytes): kept alive while registered
    view: np.ndarray  # uint8, the buffer's bytes
    device: Device | None  # the device it is mapped into; None: not mapped (its host address)


_lock = threading.Lock()
_starts: list[int] = []  # sorted registered pointers
_bufs: dict[int, _Buffer] = {}  # pointer -> buffer
_by_memory: dict[tuple[int, int], _Buffer] = {}  # (host address, nbytes) -> its registration


def _register(owner: Any, arr: np.ndarray) -> int:
    """Register the bytes of the contiguous ``arr`` (whose memory ``owner`` holds)."""
    n = arr.nbytes
    if n == 0:
        raise InvalidValueError("an empty buffer has no address to give")
    addr = arr.ctypes.data
    with _lock:
        known = _by_memory.get((addr, n))
        if known is not None:
            return known.ptr
        view = np.frombuffer(memoryview((ctypes.c_uint8 * n).from_address(addr)).cast("B"), np.uint8)
        if not arr.flags.writeable:
            view.flags.writeable = False
        dev: Device | None = current_device()
        try:
            ptr = dev._impl.register(view)  # type: ignore[union-attr]
        except NotSupportedError:
            ptr, dev = addr, None
        buf = _Buffer(ptr, n, owner, view, dev)
        bisect.insort(_starts, ptr)
        _bufs[ptr] = _by_memory[(addr, n)] = buf
        return ptr


def _find(ptr: int) -> tuple[_Buffer, int] | None:
    """The registered buffer holding ``ptr`` and the offset into it."""
    with _lock:
        i = bisect.bisect_right(_starts, ptr) - 1
        if i < 0:
            return None
        buf = _bufs[_starts[i]]
    off = ptr - buf.ptr
    return (buf, off) if off < buf.nbytes else None


def _drop(bufs: list[_Buffer]) -> None:
    for buf in bufs:
        with _lock:
            _starts.remove(buf.ptr)
            del _bufs[buf.ptr]
            _by_memory.pop((buf.view.ctypes.data, buf.nbytes), None)
        if buf.device is not None:
            buf.device._impl.unregister(buf.ptr)


def forget_device(dev: Device) -> None:
    """Unregister the buffers mapped into ``dev`` (its reset; its work must be done)."""
    _drop([b for b in list(_bufs.values()) if b.device is dev])


def release_all() -> None:
    """Unregister every buffer once the work of its device is done (``acl.finalize``)."""
    bufs = list(_bufs.values())
    for dev in {b.device for b in bufs if b.device is not None}:
        dev.synchronize()
    _drop(bufs)


def numpy_to_ptr(array: np.ndarray) -> int:
    """The address of a C-contiguous numpy array's data, usable as a copy endpoint."""
    if not isinstance(array, np.ndarray):
        raise InvalidTypeError(f"numpy_to_ptr needs a numpy array, not {type(array).__name__}")
    if not array.flags.c_contiguous:
        raise InvalidValueError("numpy_to_ptr needs a C-contiguous array (np.ascontiguousarray)")
    return _register(array, array)


def bytes_to_ptr(data: Any) -> int:
    """The address of a bytes-like object's data: ``bytes`` (read-only), ``bytearray``, a
    ``memoryview`` or any contiguous buffer (a ``ctypes.Structure``, as a C program's ``&s``)."""
    if isinstance(data, str):
        raise InvalidTypeError("bytes_to_ptr needs bytes or a buffer, not str (encode it first)")
    try:
        raw = memoryview(data).cast("B")
    except TypeError as exc:
        raise InvalidTypeError(f"bytes_to_ptr needs bytes or a contiguous buffer, not "
                               f"{type(data).__name__}") from exc
    return _register(data, np.frombuffer(raw, np.uint8))


def _dtype(npy_type: Any) -> np.dtype:
    """A numpy dtype from pyACL's ``npy_type`` (numpy's type number, e.g. 11 for float32) or
    from any dtype-like."""
    if isinstance(npy_type, int) and not isinstance(npy_type, bool):
        for code in np.typecodes["All"]:
            dt = np.dtype(code)
            if dt.num == npy_type and code not in "OMmV":
                return dt
        raise InvalidValueError(f"npy_type {npy_type} is not a numpy type number")
    try:
        return np.dtype(npy_type)
    except TypeError as exc:
        raise InvalidTypeError(f"{npy_type!r} is not a numpy dtype") from exc


def ptr_to_numpy(ptr: int, shape: Any, npy_type: Any) -> np.ndarray:
    """A zero-copy numpy view of host memory at ``ptr``: a registered buffer or
    ``acl.rt.malloc_host`` memory (device memory is read with ``acl.rt.memcpy``)."""
    dt = _dtype(npy_type)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    n = math.prod(shape) * dt.itemsize
    found = _find(ptr) if isinstance(ptr, int) else None
    if found is not None:
        buf, off = found
        if off + n > buf.nbytes:
            raise InvalidAddressError(f"{hex(ptr)}+{n} leaves its buffer of {buf.nbytes} bytes")
        return np.ndarray(shape, dt, buf.view[off:off + n])
    try:
        return host_array(ptr, shape, dt)
    except InvalidAddressError:
        raise InvalidAddressError(
            f"{ptr!r} is not host memory (acl.util.numpy_to_ptr, acl.rt.malloc_host): copy "
            "device memory out with acl.rt.memcpy(..., ACL_MEMCPY_DEVICE_TO_HOST)") from None


def ptr_to_bytes(ptr: int, size: int) -> bytes:
    """A copy of ``size`` bytes of host memory at ``ptr``."""
    return ptr_to_numpy(ptr, (size,), np.uint8).tobytes()


def is_host(ptr: Any) -> bool:
    """True when ``ptr`` is host memory: a registered buffer or ``malloc_host`` memory."""
    if not isinstance(ptr, int) or isinstance(ptr, bool):
        return False
    if _find(ptr) is not None:
        return True
    try:
        host_array(ptr, (0,), np.uint8)
    except StreamRTError:  # not pinned memory, or not a pointer at all
        return False
    return True


def endpoint(ptr: int, count: int) -> Any:
    """What ``s.memcpy`` takes for the ``count`` bytes at ``ptr``: the pointer, or for a buffer
    that is not mapped (its backend cannot) the buffer's bytes themselves."""
    found = _find(ptr) if isinstance(ptr, int) else None
    if found is None or found[0].device is not None:
        return ptr
    buf, off = found
    if off + count > buf.nbytes:
        raise InvalidAddressError(f"{hex(ptr)}+{count} leaves its buffer of {buf.nbytes} bytes")
    return buf.view[off:off + count]
