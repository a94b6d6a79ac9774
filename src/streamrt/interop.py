"""Interoperability with other array libraries: DLPack export and import, ``__array__``, the
CUDA Array Interface, and zero-copy views of pinned host memory (API.md §9.2).

Host memory crosses as numpy's capsules (``ndarray.__dlpack__`` / ``np.from_dlpack``); GPU
memory as capsules of streamrt's own structs (dlpack.py), which numpy cannot make or read.

- Export (``Tensor.__dlpack__``). The Python array API's stream handshake:
  - a cpu tensor is host memory (kDLCPU): the consumer passes ``stream=None`` (anything else is
    refused) and reads at once on the host, so the export waits for the device's pending work
    first (the tensor's writers may be on any of its streams);
  - a cuda tensor is kDLCUDA memory: ``stream`` is the consumer's ``cudaStream_t`` as an int
    (None: the legacy default stream, 1; 2: the per-thread default stream), and the export
    makes that stream wait, with event waits, for the work pending on every stream of the
    tensor's device, so nothing the consumer enqueues there runs before the tensor's writers;
    ``stream=-1`` asks for no synchronization, and 0 is refused (InvalidValueError), as the
    standard disallows it. The capsule holds a ``DLManagedTensorVersioned`` when
    ``max_version >= (1, 0)`` (flags 0: writable, not a copy), else a ``DLManagedTensor``;
    ``data`` is the tensor's pointer and ``byte_offset`` its offset, and its deleter keeps the
    Tensor alive until it runs. ``dl_device=(kDLCPU, 0)`` exports a host copy (flag IS_COPIED).
  - A ``dl_device`` the producer cannot reach, ``copy=False`` where a copy is needed, or
    ``copy=True`` of GPU memory (no device copy is made here) is ``BufferError``.
- Import (:func:`from_dlpack`): host memory (kDLCPU, kDLCUDAHost) is mapped into the target
  device's addresses zero-copy where its backend can (``DeviceImpl.register``; the cpu
  backend's device memory is host memory), else copied unless ``copy=False``. kDLCUDA memory
  becomes a Tensor of that GPU over the same bytes: the producer's ``__dlpack__`` gets the
  consumer's stream (``stream``, default the device's current stream) for its handshake, its
  capsule is consumed, foreign memory is registered as a copy endpoint
  (``DeviceImpl.register_device``), and the producer's deleter runs when the Tensor is
  collected. The Tensor keeps what the memory needs alive. Negative or non-element strides
  are copied on the host path (or refused with ``copy=False``), refused on the GPU path.
- Copies (copy_ends.py): ``s.memcpy`` / ``srt.memcpy`` take a kDLCUDA producer as an end,
  imported as above with the copying stream for the handshake, and any CAI v3 object.
- ``Tensor.__cuda_array_interface__`` (cuda tensors): version 3, field by field as its spec.
  Its ``stream`` is the tensor's device's current stream (the innermost ``with stream:`` of it,
  else its default stream, 1), first ordered after the work pending on the device's other
  streams, so that a consumer that synchronizes on it, as CAI v3 asks, sees every pending
  writer (the tensor's last writer is not tracked). cpu tensors have no such attribute.
"""

from __future__ import annotations

import ctypes
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from . import dlpack
from .device import Device, current_device
from .errors import InvalidAddressError, InvalidTypeError, InvalidValueError, NotSupportedError
from .validate import is_int

if TYPE_CHECKING:
    from .tensor import Tensor

__all__ = ["KDL_CPU", "KDL_CUDA", "KDL_CUDA_HOST", "array_of", "cuda_array_interface",
           "dlpack_device", "export", "from_dlpack", "host_array", "import_device"]

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
        return _export_device(t, stream, max_version, dl_device, copy)
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


def _versioned(max_version: Any) -> tuple[int, int] | None:
    """The version of the capsule to make for a consumer's ``max_version`` (None: the
    unversioned ``DLManagedTensor``): ours while the major versions match, as the standard
    recommends."""
    if max_version is None:
        return None
    if not isinstance(max_version, tuple | list) or len(max_version) != 2 or \
            not all(is_int(v) for v in max_version):
        raise InvalidTypeError(f"max_version must be a (major, minor) tuple of ints, not "
                               f"{max_version!r}")
    return dlpack.DLPACK_VERSION if int(max_version[0]) >= 1 else None


def _export_device(t: Tensor, stream: Any, max_version: Any, dl_device: Any,
                   copy: bool | None) -> Any:
    """``__dlpack__`` of GPU memory (see the module docstring)."""
    if copy is not None and not isinstance(copy, bool):
        raise InvalidTypeError(f"copy must be a bool or None, not {type(copy).__name__}")
    own = dlpack_device(t)
    version = _versioned(max_version)
    target = own if dl_device is None else _device_pair(dl_device)
    if target == (KDL_CPU, 0):  # the standard's one mandated cross-device export: a host copy
        if copy is False:
            raise BufferError(f"{t!r} is device memory: exporting it to kDLCPU is a copy "
                              "(copy=False)")
        if stream is not None:
            raise InvalidValueError(f"a kDLCPU export takes stream=None, not {stream!r}")
        arr = t.numpy()  # after the device's pending work
        return dlpack.make_capsule(arr.ctypes.data if arr.size else 0, (KDL_CPU, 0), arr.shape,
                                   tuple(s // arr.itemsize for s in arr.strides), arr.dtype, 0,
                                   arr, versioned=version is not None,
                                   flags=dlpack.FLAG_IS_COPIED)
    if target != own:
        raise BufferError(f"{t!r} is on {t.device.name} (DLPack device {own}); it cannot be "
                          f"exported to {target}")
    if copy:
        raise BufferError(f"{t!r}: copy=True asks for a device copy, which streamrt's export "
                          "does not make (copy it first: s.memcpy or an operator)")
    _handshake(t, stream)
    d = t.desc
    empty = d.numel == 0  # DLPack: an empty tensor's data is NULL
    return dlpack.make_capsule(0 if empty else t.ptr, own, d.shape, d.strides, d.dtype,
                               0 if empty else d._boff, t, versioned=version is not None)


def _device_pair(dl_device: Any) -> tuple[int, int]:
    """A ``dl_device`` argument: ``(device type, device id)``, two ints."""
    if not isinstance(dl_device, tuple | list) or len(dl_device) != 2 or \
            not all(is_int(v) for v in dl_device):
        raise InvalidTypeError(f"dl_device must be a (device type, device id) pair of ints, not "
                               f"{dl_device!r}")
    return (int(dl_device[0]), int(dl_device[1]))


def _handshake(t: Tensor, stream: Any) -> None:
    """The array API's CUDA stream handshake: the consumer's stream waits for the producer's
    pending work (None: the legacy default stream; -1: no synchronization; 0: refused)."""
    from .foreign import order_after_pending

    if stream is None:
        stream = 1  # "the producer must assume the legacy default stream"
    elif isinstance(stream, bool) or not is_int(stream):
        raise InvalidTypeError(f"stream must be a cudaStream_t int or None, not "
                               f"{type(stream).__name__}")
    stream = int(stream)
    if stream == -1:
        return
    if stream == 0:
        raise InvalidValueError("stream=0 is disallowed for CUDA by the array API standard (it "
                                "could mean None, 1 or 2); pass 1 for the legacy default stream")
    if stream < -1:
        raise InvalidValueError(f"stream must be -1, None or a cudaStream_t >= 1, not {stream}")
    order_after_pending(t.device, stream)


def _current_stream_of(dev: Device) -> Any:
    """``dev``'s current stream: its innermost ``with stream:`` on this thread, else its default."""
    from .device import current_stream

    with dev:
        return current_stream()


def cuda_array_interface(t: Tensor) -> dict[str, Any]:
    """``Tensor.__cuda_array_interface__``: CUDA Array Interface version 3 (module docstring)."""
    from .foreign import order_after_pending

    if t.device.backend != "cuda":
        raise AttributeError(f"{t!r} is not CUDA memory: no __cuda_array_interface__")
    d = t.desc
    s = _current_stream_of(t.device)
    order_after_pending(t.device, s)
    return {
        "shape": d.shape,
        "typestr": d.dtype.str,
        "data": (0 if d.numel == 0 else t.ptr + d._boff, False),  # 0 for an empty array
        "version": 3,
        "strides": None if d.is_contiguous else d._bstrides,  # bytes; None: C-contiguous
        "descr": [("", d.dtype.str)],
        "mask": None,
        "stream": s.__cuda_stream__()[1],  # never 0: the legacy default stream is 1
    }


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
    if isinstance(x, Tensor) and stream is None:
        if copy:
            return Tensor.from_numpy(array_of(x), stream=None)
        return x.as_strided(x.shape, x.strides, x.offset, format=x.format)
    if not hasattr(x, "__dlpack__") or not hasattr(x, "__dlpack_device__"):
        raise InvalidTypeError(f"from_dlpack needs a DLPack producer (__dlpack__ and "
                               f"__dlpack_device__), not {type(x).__name__}")
    kind, index = (int(v) for v in x.__dlpack_device__())
    if kind == KDL_CUDA:
        return import_device(x, index, device, stream, copy)
    if kind not in (KDL_CPU, KDL_CUDA_HOST):
        raise BufferError(f"importing DLPack device type {kind} (not host or CUDA memory) is "
                          "not supported")
    if stream is not None:
        raise InvalidValueError("from_dlpack of host memory takes stream=None (the data is "
                                "read on the host, once the producer's work is done)")
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


def import_device(x: Any, index: int, device: Any, stream: Any, copy: bool | None) -> Tensor:
    """``from_dlpack`` of kDLCUDA memory (see the module docstring); also a copy endpoint's
    import (copy_ends.py)."""
    from .stream import Stream
    from .tensor import Tensor, TensorDesc

    src = Device(f"cuda:{index}")
    if device is not None and Device(device) is not src:
        raise BufferError(f"the producer's memory is on {src.name}: from_dlpack does not copy it "
                          f"to {Device(device).name}")
    if stream is None:
        consumer = _current_stream_of(src)
    elif isinstance(stream, Stream):
        consumer = stream
    else:
        raise InvalidTypeError(f"stream must be a Stream or None, not {type(stream).__name__}")
    if not hasattr(consumer, "__cuda_stream__"):
        raise InvalidValueError(f"{consumer!r} is not a CUDA stream: it cannot consume "
                                f"{src.name} memory")
    handle = consumer.__cuda_stream__()[1]
    try:
        kw: dict[str, Any] = {"max_version": dlpack.DLPACK_VERSION}
        if copy is not None:
            kw["copy"] = copy
        cap = x.__dlpack__(stream=handle, **kw)
    except TypeError:  # a producer before DLPack 1.0: no max_version or copy keywords
        if copy:
            raise BufferError(f"{type(x).__name__}.__dlpack__ cannot make a copy (copy=True)") \
                from None
        cap = x.__dlpack__(stream=handle)
    m = dlpack.consume(cap)
    try:
        if m.device != (KDL_CUDA, index):
            raise BufferError(f"the capsule's device {m.device} is not the producer's "
                              f"__dlpack_device__ {(KDL_CUDA, index)}")
        dt = dlpack.np_dtype(*m.dtype)
        if m.strides is not None and any(st < 0 for st in m.strides):
            raise BufferError(f"strides {m.strides} (elements) are negative: the GPU memory "
                              "cannot be shared as a Tensor")
        ptr, offset = m.data, 0
        if m.byte_offset % dt.itemsize or not ptr:
            ptr += m.byte_offset
        else:
            offset = m.byte_offset // dt.itemsize
        desc = TensorDesc(m.shape, dt, m.strides, offset)
        if desc.numel == 0:  # no memory to share (its data may be NULL)
            m.release()
            return Tensor.empty(desc.shape, dt, stream=consumer)
        impl = src._impl
        added = impl.register_device(ptr, desc.storage_nbytes)
        try:
            t = Tensor(desc, ptr, device=src)
        except BaseException:
            if added:
                impl.unregister_device(ptr)
            raise
    except BaseException:
        m.release()
        raise
    t._owner = False  # the producer's memory: free() refuses; its deleter runs with the Tensor
    t._keep = m
    weakref.finalize(t, impl.reclaim, _release_device, impl, ptr if added else None, m.release)
    return t


def _release_device(impl: Any, registered: int | None, release: Any) -> None:
    """A GPU import's Tensor was collected: forget the range it registered, then let the
    producer's deleter free what it kept."""
    if registered is not None:
        impl.unregister_device(registered)
    release()


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
