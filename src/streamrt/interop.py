"""Interoperability with other array libraries: DLPack export and import, ``__array__``, and
zero-copy views of pinned host memory (API.md §9.2).

The capsules themselves are numpy's (``ndarray.__dlpack__`` / ``np.from_dlpack``): host memory
crosses as a numpy array over the same bytes, so versioned capsules, read-only flags and the
producer's lifetime follow numpy's tested implementation, not code of ours.

- Export (``Tensor.__dlpack__``): a cpu tensor is host memory (kDLCPU). The Python array API's
  stream handshake: a kDLCPU consumer passes ``stream=None`` (anything else is refused) and
  reads at once on the host, so the export waits for the device's pending work first (the
  tensor's writers may be on any of its streams). A ``dl_device`` other than the tensor's own,
  or ``copy=False`` where a copy is needed, is ``BufferError``, as the standard asks.
- Import (:func:`from_dlpack`): host memory (kDLCPU, kDLCUDAHost) is mapped into the target
  device's addresses zero-copy where its backend can (``DeviceImpl.register``; the cpu
  backend's device memory is host memory), else copied unless ``copy=False``. The Tensor keeps
  the producer's array alive; the mapping goes when the Tensor is collected. Negative or
  non-element strides are copied (or refused with ``copy=False``).
"""

from __future__ import annotations

import ctypes
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from .device import Device, current_device
from .errors import InvalidAddressError, InvalidTypeError, InvalidValueError, NotSupportedError

if TYPE_CHECKING:
    from .tensor import Tensor

__all__ = ["KDL_CPU", "KDL_CUDA", "KDL_CUDA_HOST", "array_of", "dlpack_device", "export",
           "from_dlpack", "host_array"]

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST = 1, 2, 3  # DLDeviceType


def dlpack_device(t: Tensor) -> tuple[int, int]:
    """``__dlpack_device__``: (kDLCPU, 0) for a cpu tensor, (kDLCUDA, index) on cuda."""
    if t.device.backend == "cpu":
        return (KDL_CPU, 0)
    return (KDL_CUDA, t.device.index)


def _host_view(t: Tensor) -> np.ndarray:
    """A numpy view of a cpu tensor's memory (its pending work is the caller's to wait for)."""
    d = t.desc
    n = d.storage_nbytes
    if n == 0:
        return np.empty(d.shape, d.dtype)
    span = t.device._impl.endpoint(t.ptr, n)
    return np.ndarray(d.shape, d.dtype, span, d._boff, d._bstrides)


def export(t: Tensor, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
           copy: bool | None = None) -> Any:
    """``Tensor.__dlpack__``: a DLPack capsule of the tensor's memory (see the module docstring)."""
    own = dlpack_device(t)
    if own[0] != KDL_CPU:
        raise BufferError(f"{t!r}: DLPack export of {t.device.backend} device memory is not "
                          "supported yet (np.asarray(t) or t.numpy() copies it to the host)")
    if dl_device is not None and tuple(dl_device) != own:
        raise BufferError(f"{t!r} is host memory (kDLCPU); it cannot be exported to {dl_device}")
    if stream is not None:
        raise InvalidValueError(f"a kDLCPU tensor is exported with stream=None (the Python array "
                                f"API's handshake), not {stream!r}")
    if copy is not None and not isinstance(copy, bool):
        raise InvalidTypeError(f"copy must be a bool or None, not {type(copy).__name__}")
    t.device.synchronize()  # the consumer reads now, on the host: after every pending writer
    arr = _host_view(t)
    if copy:
        arr = arr.copy()
    if max_version is None:
        return arr.__dlpack__()
    return arr.__dlpack__(max_version=tuple(max_version))


def array_of(t: Tensor, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
    """``Tensor.__array__``: the data after the device's pending work; a view on cpu."""
    if t.device.backend == "cpu":
        t.device.synchronize()
        arr = _host_view(t)
        if copy:
            arr = arr.copy()
    else:
        if copy is False:
            raise InvalidValueError(f"{t!r} is device memory: a numpy array of it is a copy")
        arr = t.numpy()
    if dtype is not None:
        arr = arr.astype(dtype, copy=False)
    return arr


def from_dlpack(x: Any, *, device: Any = None, stream: Any = None,
                copy: bool | None = None) -> Tensor:
    """Import a DLPack producer (numpy, PyTorch, CuPy, JAX) as a Tensor sharing its memory."""
    from .tensor import Tensor, TensorDesc

    if copy is not None and not isinstance(copy, bool):
        raise InvalidTypeError(f"copy must be a bool or None, not {type(copy).__name__}")
    if stream is not None:
        raise InvalidValueError("from_dlpack of host memory takes stream=None (the data is "
                                "read on the host, once the producer's work is done)")
    if isinstance(x, Tensor):
        if copy:
            return Tensor.from_numpy(array_of(x), stream=None)
        return x.as_strided(x.shape, x.strides, x.offset, format=x.format)
    if not hasattr(x, "__dlpack__") or not hasattr(x, "__dlpack_device__"):
        raise InvalidTypeError(f"from_dlpack needs a DLPack producer (__dlpack__ and "
                               f"__dlpack_device__), not {type(x).__name__}")
    kind = int(x.__dlpack_device__()[0])
    if kind not in (KDL_CPU, KDL_CUDA_HOST):
        raise BufferError(f"importing DLPack device type {kind} (not host memory) is not "
                          "supported yet")
    try:
        arr = np.from_dlpack(x, copy=copy)
    except TypeError:  # a producer without the copy keyword (DLPack before 1.0)
        if copy:
            raise
        arr = np.from_dlpack(x)
    target = Device(device) if device is not None else current_device()
    item = arr.dtype.itemsize
    plain = all(s >= 0 and s % item == 0 for s in arr.strides)
    if not plain:
        if copy is False:
            raise BufferError(f"strides {arr.strides} (bytes) are not element strides >= 0: "
                              "the array cannot be shared as a Tensor")
        arr = np.ascontiguousarray(arr)
    desc = TensorDesc(arr.shape, arr.dtype, tuple(s // item for s in arr.strides))
    n = desc.storage_nbytes
    buf = _bytes_of(arr, n)
    impl = target._impl
    try:
        ptr = impl.register(buf)
    except NotSupportedError:
        if copy is False:
            raise BufferError(f"{target.name} cannot map host memory: the import would be a "
                              "copy (copy=False)") from None
        return Tensor.from_numpy(arr, stream=target.default_stream)
    t = Tensor(desc, ptr, device=target)
    t._owner = False  # the producer's memory: free() refuses, the mapping goes with the Tensor
    t._keep = arr
    weakref.finalize(t, impl.unregister, ptr)
    return t


def _bytes_of(arr: np.ndarray, n: int) -> np.ndarray:
    """A ``uint8`` view of the ``n`` bytes from ``arr``'s first element (its own view keeps
    ``arr`` alive), read-only where ``arr`` is."""
    if n == 0:
        return np.empty(0, np.uint8)
    raw = (ctypes.c_uint8 * n).from_address(arr.ctypes.data)
    buf = np.frombuffer(raw, np.uint8)
    if not arr.flags.writeable:
        buf.flags.writeable = False
    return buf


def host_array(ptr: int, shape: Any, dtype: Any) -> np.ndarray:
    """A zero-copy numpy view of ``srt.malloc_host`` memory at ``ptr``."""
    from .backends import loaded_backends
    from .tensor import TensorDesc
    from .validate import check_ptr

    p = check_ptr(ptr)
    desc = TensorDesc(shape, dtype)
    n = desc.storage_nbytes
    for b in loaded_backends():
        if b.owns_host(p) or _inside_host(b, p):
            raw = b.host_view(p, n)
            return np.ndarray(desc.shape, desc.dtype, raw, 0, desc._bstrides)
    raise InvalidAddressError(f"{hex(p)} is not pinned host memory (srt.malloc_host)")


def _inside_host(b: Any, p: int) -> bool:
    try:
        r = b.range_of(p)
    except NotSupportedError:
        return False
    return r is not None and r.kind == "host"
