"""Other libraries' device memory as copy endpoints (API.md §9.2: copies accept any DLPack or
buffer-protocol object): a DLPack producer of kDLCUDA memory, or any object with a
``__cuda_array_interface__`` (CAI v3), is an end of ``s.memcpy`` / ``srt.memcpy`` on a stream of
its memory's device; eager.py resolves it to a device address with :func:`resolve`.

- A DLPack producer is imported as ``srt.from_dlpack`` imports it (interop.import_device): its
  ``__dlpack__`` gets the copying stream for the array API's handshake, so the copy runs after
  the producer's pending work. A read-only export (DLPack 1.x flag) is no destination. A kDLCPU
  producer stays a host endpoint (validate.host_view).
- A CAI object's ``data`` pointer is the end; its ``stream`` (v3; None: no synchronization, 0
  refused, as the spec says) is waited for by the copying stream: a streamrt stream through the
  clocks, a foreign one by an event recorded on it (``Queue.op_wait_foreign``). Memory streamrt
  does not know is registered as an endpoint of the stream's device while the copy needs it
  (``DeviceImpl.register_device``); a read-only array (``data[1]`` True) is no destination.
- Either must be C-contiguous, hold the copy's bytes and be memory of the copying stream's
  device (another device's: InvalidDeviceError, as no copy is made across devices here).
- What the copy reads or writes stays alive until the copy has run: :func:`resolve` returns it,
  and the eager copy releases it with a host function enqueued after the copy (a stream-ordered
  release, as an executor's); what it held then goes through ``impl.reclaim`` (finalizers).
A capture or a graph node takes int pointers and host buffers only (host_view says so).
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from . import dlpack
from .device import range_of
from .errors import InvalidDeviceError, InvalidTypeError, InvalidValueError, NotSupportedError
from .interop import KDL_CUDA, import_device
from .labels import labelled
from .validate import is_int

if TYPE_CHECKING:
    from .stream import Stream

__all__ = ["release", "resolve"]

_NOTHING = np.empty(0, np.uint8)  # the end of a copy of no bytes (an endpoint the copy skips)


def resolve(s: Stream, obj: Any, n: int, *, writable: bool) -> tuple[Any, Any]:
    """``(end, keep)``: ``obj`` and None, unless it is another library's device memory: then its
    address and what must stay alive until the copy of ``n`` bytes on ``s`` has run."""
    if isinstance(obj, np.ndarray | bytes | bytearray | memoryview):  # host buffers, cheaply
        return obj, None
    kind = _dlpack_device(obj)
    if kind is not None:
        if kind[0] == KDL_CUDA:
            return _dlpack_end(s, obj, kind[1], n, writable)
        return obj, None  # host memory (or a device type no copy takes): host_view judges it
    cai = getattr(obj, "__cuda_array_interface__", None)  # once: a property may synchronize
    if cai is not None:
        return _cai_end(s, obj, cai, n, writable)
    return obj, None


@labelled("copy endpoint release")  # the host function an eager copy enqueues after itself
def release(held: list[Any]) -> None:
    """Host function: the copy before it has run; drop what its ends needed (in place: the
    job's arguments may outlive the call)."""
    held.clear()


def _dlpack_device(obj: Any) -> tuple[int, int] | None:
    """``obj.__dlpack_device__()`` of a DLPack producer, or None (not one, or not a working one:
    judged as any other object)."""
    if not (hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__")):
        return None
    try:
        kind, index = (int(v) for v in obj.__dlpack_device__())
    except Exception:  # noqa: BLE001 - a broken producer is no producer
        return None
    return kind, index


def _what(obj: Any) -> str:
    return f"a copy endpoint of type {type(obj).__name__}"


def _same_device(s: Stream, obj: Any, index: int, protocol: str) -> None:
    dev = s.device
    if dev.backend != "cuda" or dev.index != index:
        raise InvalidDeviceError(f"{_what(obj)} is cuda:{index} memory ({protocol}); the copy runs "
                                 f"on {s!r} of {dev.name}: copy on a stream of cuda:{index} (srt.memcpy "
                                 f"copies on the current device's: with srt.Device('cuda:{index}'))")


def _dlpack_end(s: Stream, obj: Any, index: int, n: int, writable: bool) -> tuple[Any, Any]:
    """A kDLCUDA producer's address, imported with the handshake on ``s``, and its import."""
    _same_device(s, obj, index, "DLPack kDLCUDA")
    try:
        t = import_device(obj, index, None, s, None)
    except BufferError as exc:
        raise InvalidValueError(f"{_what(obj)}: its DLPack export failed: {exc}") from None
    d = t.desc
    if not d.is_contiguous:
        raise InvalidValueError(f"{_what(obj)} must be C-contiguous (strides {d.strides})")
    imported = t._keep  # the consumed capsule (None: an empty tensor, nothing shared)
    if writable and imported is not None and imported.flags & dlpack.FLAG_READ_ONLY:
        raise InvalidValueError(f"{_what(obj)}: its DLPack export is read-only: no destination")
    _check_room(obj, d.numel * d.dtype.itemsize, n)
    if n == 0:
        return _NOTHING, None  # nothing is copied (an empty producer's data may be NULL)
    return t.ptr + d._boff, t


def _check_room(obj: Any, size: int, n: int) -> None:
    if size < n:
        raise InvalidValueError(f"{_what(obj)} holds {size} bytes, the copy needs {n}")


def _cai_end(s: Stream, obj: Any, cai: Any, n: int, writable: bool) -> tuple[Any, Any]:
    """A CAI object's address (its stream waited for, unknown memory registered) and a holder
    keeping the object and the registration."""
    ptr, stream = _cai_fields(obj, cai, n, writable)
    if s.device.backend != "cuda":
        raise InvalidDeviceError(f"{_what(obj)} is CUDA memory (__cuda_array_interface__); the "
                                 f"copy runs on {s!r} of {s.device.name}")
    if n == 0:
        return _NOTHING, None  # nothing is copied (an empty array's data is NULL): no wait either
    found = range_of(ptr)
    if found is not None and found[0] is not None and found[0] is not s.device:
        _same_device(s, obj, found[0].index, "__cuda_array_interface__")
    if found is not None and found[1].kind == "external":
        found = None  # an import's range may go before this copy has run: registered again
    if stream is not None:
        _wait_stream(s, stream)
    impl = s.device._impl
    # streamrt's own memory (found) is an endpoint as it is; other memory is registered
    added = found is None and impl.register_device(ptr, n)
    holder = _Held()
    weakref.finalize(holder, impl.reclaim, _forget, impl, ptr if added else None, obj)
    return ptr, holder


class _Held:
    """What a CAI end keeps until its copy has run: its finalizer holds the object and the
    registration."""

    __slots__ = ("__weakref__",)


def _forget(impl: Any, registered: int | None, obj: Any) -> None:
    """A CAI end's copy has run: forget the range registered for it (the object goes after)."""
    if registered is not None:
        impl.unregister_device(registered)


def _cai_fields(obj: Any, cai: Any, n: int, writable: bool) -> tuple[int, Any]:
    """The checked ``(data pointer, stream)`` of ``cai``, ``obj``'s ``__cuda_array_interface__``,
    for a copy of ``n`` bytes (CAI v3: shape, typestr, data, strides in bytes or None, mask,
    stream)."""
    try:
        shape = tuple(int(v) for v in cai["shape"])
        itemsize = np.dtype(cai["typestr"]).itemsize
        ptr, readonly = cai["data"]
        strides = cai.get("strides")
        version = int(cai.get("version", 0))
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise InvalidTypeError(f"{_what(obj)}: __cuda_array_interface__ is not a CUDA Array "
                               f"Interface dict: {type(exc).__name__}: {exc}") from None
    if not is_int(ptr) or ptr < 0:
        raise InvalidTypeError(f"{_what(obj)}: __cuda_array_interface__ data pointer {ptr!r} is "
                               "not an address")
    if cai.get("mask") is not None:
        raise NotSupportedError(f"{_what(obj)}: a masked CUDA array is not a copy endpoint")
    if strides is not None and not _c_contiguous(shape, tuple(strides), itemsize):
        raise InvalidValueError(f"{_what(obj)} must be C-contiguous (strides {tuple(strides)} "
                                "bytes)")
    if writable and readonly:
        raise InvalidValueError(f"{_what(obj)} is read-only (__cuda_array_interface__ data[1]): "
                                "no destination")
    _check_room(obj, math.prod(shape) * itemsize, n)
    if n and not ptr:
        raise InvalidValueError(f"{_what(obj)}: its data pointer is NULL")
    return int(ptr), cai.get("stream") if version >= 3 else None


def _c_contiguous(shape: tuple[int, ...], strides: tuple[Any, ...], itemsize: int) -> bool:
    """Whether byte ``strides`` lay ``shape`` out compactly in row-major order (extents of 1 and
    empty arrays take any stride)."""
    if len(strides) != len(shape) or 0 in shape:
        return len(strides) == len(shape)
    want = itemsize
    for extent, stride in zip(reversed(shape), reversed(strides), strict=True):
        if extent != 1 and stride != want:
            return False
        want *= extent
    return True


def _wait_stream(s: Stream, stream: Any) -> None:
    """Order ``s`` after the work enqueued so far on the CAI ``stream`` (a cudaStream_t int)."""
    from .backends import get_backend

    if isinstance(stream, bool) or not is_int(stream):
        raise InvalidTypeError(f"__cuda_array_interface__ stream must be an int or None, not "
                               f"{type(stream).__name__}")
    h = int(stream)
    if h <= 0:
        raise InvalidValueError(f"__cuda_array_interface__ stream {h} is disallowed (CAI v3: None, "
                                "1 for the legacy default stream, or a cudaStream_t)")
    dev = s.device
    other = dev.default_stream if h == 1 else next(
        (t for t in dev.streams() if not t._destroyed and t._q.handle() == h), None)
    if other is None:  # a foreign stream: an event recorded on it, waited for
        owner = get_backend(dev.backend).stream_device(h)  # an invalid handle raises here
        if owner != dev.index:
            raise InvalidDeviceError(f"__cuda_array_interface__ stream {h:#x} belongs to "
                                     f"cuda:{owner}; the copy runs on {dev.name}")
        fn, args = s._q.op_wait_foreign(h)
        s._submit(fn, args, "wait", f"wait foreign stream {h:#x}")
        return
    if other is s or other._capture is not None:  # in order already / work of a graph
        return
    snap = other._snapshot()
    if s._clock.get(other.id, 0) < snap[other.id]:
        s._order_after(other, snap[other.id], snap)
