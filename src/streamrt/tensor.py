"""Device tensors: ``TensorDesc`` (``aclCreateTensor`` metadata) and ``Tensor`` (desc + pointer).

A ``TensorDesc`` is immutable: shape, dtype, strides and offset in elements, and a format. It
precomputes everything the operators need on their hot paths: byte strides, the byte offset,
the element extent a view spans, contiguity, and ``_kid``, an interned integer standing for the
whole metadata tuple, so that an executor-cache key is a tuple of small ints (never a pointer).

A ``Tensor`` pairs a desc with a device pointer on a device. Tensors made by ``empty`` and
``from_numpy`` take their memory from a pool in stream order and remember that stream: ``free``
defaults to it. ``as_strided`` views share memory and own nothing.
"""

from __future__ import annotations

import itertools
import math
import threading
from typing import Any

import numpy as np

from .device import Device
from .errors import InvalidHandleError, InvalidTypeError, InvalidValueError
from .pool.registry import placement
from .stream import Stream, current_stream
from .validate import host_array, is_int

__all__ = ["TensorDesc", "Tensor", "FORMATS"]

MAX_DIMS = 8  # as aclnn: tensors have at most 8 dimensions
_MAX_BYTES = 2**63 - 1  # numpy's and PyTorch's limit on an array's nominal bytes
# format -> required ndim (None: any); the private (non-ND-like) formats are accepted here and
# refused by the operators that cannot read them, as aclnn does
FORMATS: dict[str, int | None] = {
    "ND": None, "NCHW": 4, "NHWC": 4, "NCDHW": 5, "NDHWC": 5, "NC1HWC0": 5, "FRACTAL_NZ": None,
}
_KINDS = "biufc"

# interned metadata: equal metadata -> the same id; ids are never reused, so a stale id can
# only cause a cache miss, never a wrong hit
_ids = itertools.count(1)
_interned: dict[tuple, int] = {}
_intern_lock = threading.Lock()
_MAX_INTERNED = 1 << 16  # past it the table starts over: a service sees ever new shapes


def _intern(key: tuple) -> int:
    kid = _interned.get(key)
    if kid is None:
        with _intern_lock:
            if len(_interned) >= _MAX_INTERNED:
                # what was made before keeps its id (equal metadata then compares by key, and a
                # cache keyed by the old id misses once)
                _interned.clear()
            kid = _interned.setdefault(key, next(_ids))
    return kid


def _dims(value: Any, what: str) -> tuple[int, ...]:
    if is_int(value):
        value = (value,)
    elif isinstance(value, str | bytes | bytearray | memoryview | set | frozenset | dict):
        # iterable, but not a shape: b"\x02\x03" would be (2, 3), a set has no order
        raise InvalidTypeError(f"{what} must be a sequence of ints, not {type(value).__name__}")
    try:
        items = tuple(value)
    except TypeError:
        raise InvalidTypeError(
            f"{what} must be a sequence of ints, not {type(value).__name__}") from None
    for d in items:
        if not is_int(d):
            raise InvalidTypeError(f"{what} must contain ints, got {d!r} in {items!r}")
    return tuple(int(d) for d in items)


def _dtype(dtype: Any) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError):
        raise InvalidTypeError(f"{dtype!r} is not a numpy dtype") from None
    if dt.kind not in _KINDS or dt.fields is not None or dt.subdtype is not None:
        raise InvalidTypeError(f"tensors hold bool, integer, float or complex numbers, not {dt}")
    if not dt.isnative:
        raise InvalidValueError(f"dtype {dt.str} is not in native byte order")
    return np.dtype(dt.name)  # the canonical singleton: kernels compare dtypes with ``is``


class TensorDesc:
    """Tensor metadata (``aclCreateTensor``): shape, dtype, strides/offset in elements, format."""

    __slots__ = (
        "shape", "dtype", "strides", "offset", "format", "ndim", "numel", "itemsize",
        "is_contiguous", "_bstrides", "_boff", "_extent", "_kid", "_hash", "__weakref__",
    )

    def __init__(
        self, shape: Any, dtype: Any, strides: Any = None, offset: int = 0, format: str = "ND"
    ) -> None:
        shp = _dims(shape, "shape")
        if len(shp) > MAX_DIMS:
            raise InvalidValueError(f"tensors have at most {MAX_DIMS} dimensions, got {len(shp)}")
        if any(d < 0 for d in shp):
            raise InvalidValueError(f"negative dimension in shape {shp}")
        dt = _dtype(dtype)
        numel = math.prod(shp)  # exact: numpy's int64 product wrapped (2**32 x 2**32 gave 0)
        if numel * dt.itemsize > _MAX_BYTES:
            raise InvalidValueError(f"shape {shp} of {dt} holds {numel} elements: more bytes than "
                                    "a 64-bit index can address")
        if strides is None:
            st: list[int] = []
            acc = 1
            for d in reversed(shp):
                st.append(acc)
                acc *= max(d, 1)
            std = tuple(reversed(st))
        else:
            std = _dims(strides, "strides")
            if len(std) != len(shp):
                raise InvalidValueError(f"strides {std} do not match the {len(shp)} dims of {shp}")
            if any(s < 0 for s in std):
                raise InvalidValueError(f"negative strides are not supported, got {std}")
        if not is_int(offset):
            raise InvalidTypeError(f"offset must be an int (elements), not {type(offset).__name__}")
        if offset < 0:
            raise InvalidValueError(f"offset must be >= 0 elements, got {offset}")
        if not isinstance(format, str):
            raise InvalidTypeError(f"format must be a str, not {type(format).__name__}")
        if format not in FORMATS:
            raise InvalidValueError(f"unknown format {format!r}; known: {', '.join(FORMATS)}")
        need = FORMATS[format]
        if need is not None and len(shp) != need:
            raise InvalidValueError(
                f"format {format} needs {need} dims, shape {shp} has {len(shp)}")
        self.shape = shp
        self.dtype = dt
        self.strides = std
        self.offset = int(offset)
        self.format = format
        self.ndim = len(shp)
        self.numel = numel
        self.itemsize = dt.itemsize
        self._bstrides = tuple(s * dt.itemsize for s in std)
        self._boff = self.offset * dt.itemsize
        # elements from the first element to one past the last one reached (0 when empty)
        self._extent = 0 if self.numel == 0 else 1 + sum((d - 1) * s for d, s in zip(shp, std))
        contiguous, acc = True, 1
        for d, s in zip(reversed(shp), reversed(std)):
            if d != 1 and s != acc:
                contiguous = False
                break
            acc *= d
        self.is_contiguous = contiguous or self.numel == 0
        key = self.key
        self._kid = _intern(key)
        self._hash = hash(key)

    @property
    def key(self) -> tuple:
        """The metadata tuple (shape, dtype, strides, offset, format) that identifies this desc."""
        return (self.shape, self.dtype.str, self.strides, self.offset, self.format)

    @property
    def storage_nbytes(self) -> int:
        """Bytes from the tensor's pointer to the end of the last element it reaches."""
        return (self.offset + self._extent) * self.itemsize if self._extent else 0

    def overlaps_itself(self) -> bool:
        """True when two indices share an element (a zero or too-small stride): not writable."""
        dims = sorted((s, d) for d, s in zip(self.shape, self.strides) if d > 1)
        reach = 1
        for s, d in dims:
            if s < reach:
                return True
            reach = s * (d - 1) + reach
        return False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorDesc) and (other._kid == self._kid or other.key == self.key)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        extra = "" if self.is_contiguous and not self.offset else (
            f", strides={self.strides}, offset={self.offset}")
        fmt = "" if self.format == "ND" else f", format={self.format!r}"
        return f"TensorDesc({self.shape}, {self.dtype.name}{extra}{fmt})"


def _stream(stream: Any) -> Any:
    if stream is None:
        return current_stream()
    if not isinstance(stream, Stream):
        raise InvalidTypeError(f"stream must be a Stream or None, not {type(stream).__name__}")
    return stream


class Tensor:
    """A device tensor: a :class:`TensorDesc` and a device pointer (``aclTensor``)."""

    __slots__ = ("desc", "device", "stream", "_ptr", "_key", "_owner", "_storage", "_keep",
                 "__weakref__")

    def __init__(
        self, desc: TensorDesc, ptr: int, *, device: Any = None, stream: Any = None
    ) -> None:
        if not isinstance(desc, TensorDesc):
            raise InvalidTypeError(f"desc must be a TensorDesc, not {type(desc).__name__}")
        if not is_int(ptr):
            raise InvalidTypeError(f"ptr must be an int device pointer, not {type(ptr).__name__}")
        if ptr <= 0:
            raise InvalidValueError(f"ptr must be a device pointer (> 0), got {ptr}")
        if ptr % desc.itemsize:  # the cpu backend would not care; a GPU kernel faults on it
            raise InvalidValueError(f"ptr {hex(ptr)} is not aligned to the {desc.itemsize} bytes of "
                                    f"{desc.dtype} (cudaErrorMisalignedAddress on a GPU)")
        # the memory must hold the view: refused here, not in some later synchronize (memory
        # no allocation of streamrt's holds, pinned host memory, is not known to be short)
        found, room = placement(int(ptr))
        if room is not None and room < desc.storage_nbytes:
            raise InvalidValueError(
                f"{desc!r} needs {desc.storage_nbytes} bytes from {hex(ptr)}; the allocation "
                f"holding it has {room} bytes from there")
        # the memory's device (srt.malloc's, interior pointers too), else current
        dev = (found or Device(None)) if device is None else Device(device)
        self.desc = desc
        self.device = dev
        self.stream = None if stream is None else _stream(stream)
        self._ptr: int | None = int(ptr)
        self._key = _intern((desc._kid, dev))  # metadata + device: the executor-cache key part
        self._owner = True
        self._storage = desc.storage_nbytes  # bytes from ptr the memory holds (views inherit it)
        self._keep: Any = None  # what the memory needs alive (an imported producer's array)

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def empty(cls, shape: Any, dtype: Any, *, stream: Any = None, pool: Any = None) -> Tensor:
        """An uninitialised contiguous tensor, allocated from ``pool`` in ``stream`` order."""
        desc = TensorDesc(shape, dtype)
        s = _stream(stream)
        ptr = s.malloc(desc.storage_nbytes, pool)
        return cls(desc, ptr, device=s.device, stream=s)

    @classmethod
    def from_numpy(cls, a: Any, *, stream: Any = None, pool: Any = None) -> Tensor:
        """A contiguous device copy of ``a`` (the data is taken at call time: a pageable copy)."""
        arr = host_array(a, "Tensor.from_numpy")  # not ascontiguousarray: it turns 0-d into 1-d
        desc = TensorDesc(arr.shape, arr.dtype)
        s = _stream(stream)
        ptr = s.malloc(desc.storage_nbytes, pool)
        try:
            if arr.nbytes:
                s.memcpy(ptr, arr, arr.nbytes)
        except BaseException:
            s.free(ptr)
            raise
        return cls(desc, ptr, device=s.device, stream=s)

    def as_strided(
        self, shape: Any, strides: Any, offset: int = 0, *, format: str = "ND"
    ) -> Tensor:
        """A view of the same memory with other metadata (strides, offset in elements); no owner.
        The view must stay inside the memory of the tensor it was first taken from (as torch's
        ``as_strided`` checks against the storage)."""
        desc = TensorDesc(shape, self.desc.dtype, strides, offset, format)
        if desc.storage_nbytes > self._storage:
            raise InvalidValueError(
                f"as_strided {desc!r} reaches {desc.storage_nbytes} bytes past the pointer; the "
                f"tensor's memory holds {self._storage}")
        t = Tensor(desc, self.ptr, device=self.device, stream=self.stream)
        t._owner = False
        t._storage = self._storage
        return t

    # -- cheap reads ----------------------------------------------------------------------------
    @property
    def ptr(self) -> int:
        """The device pointer (raises once the tensor was freed)."""
        if self._ptr is None:
            raise InvalidHandleError(f"{self!r} was freed")
        return self._ptr

    shape = property(lambda self: self.desc.shape, doc="Shape (a tuple of ints).")
    dtype = property(lambda self: self.desc.dtype, doc="numpy dtype.")
    strides = property(lambda self: self.desc.strides, doc="Strides in elements.")
    offset = property(lambda self: self.desc.offset, doc="Offset of the first element (elements).")
    format = property(lambda self: self.desc.format, doc="Storage format name.")
    ndim = property(lambda self: self.desc.ndim, doc="Number of dimensions.")
    numel = property(lambda self: self.desc.numel, doc="Number of elements.")

    @property
    def nbytes(self) -> int:
        """Bytes of data: ``numel * itemsize``."""
        return self.desc.numel * self.desc.itemsize

    def __repr__(self) -> str:
        where = "freed" if self._ptr is None else hex(self._ptr)
        return f"<Tensor {self.desc!r} at {where} on {self.device.name}>"

    # -- data -----------------------------------------------------------------------------------
    def numpy(self, stream: Any = None) -> np.ndarray:
        """Copy to a new host array; synchronizes ``stream`` (None: the whole device) first."""
        ptr = self.ptr
        d = self.desc
        if stream is None:
            self.device.synchronize()
            s = self.device.default_stream  # everything is done: any stream of the device reads
        else:
            s = _stream(stream)
        nbytes = d.storage_nbytes
        if nbytes == 0:
            return np.empty(d.shape, d.dtype)
        host = np.empty(nbytes, np.uint8)
        s.memcpy(host, ptr, nbytes)
        s.synchronize()  # surfaces a failure of the work that produced the data
        return np.ndarray(d.shape, d.dtype, host, d._boff, d._bstrides).copy()

    # -- interoperability (interop.py) --------------------------------------------------------------
    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: bool | None = None) -> Any:
        """DLPack export, zero-copy (versioned capsule when ``max_version >= (1, 0)``)."""
        from . import interop

        return interop.export(self, stream=stream, max_version=max_version, dl_device=dl_device,
                              copy=copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(device type, device id)`` as DLPack names them."""
        from . import interop

        return interop.dlpack_device(self)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA Array Interface v3 of a cuda tensor (its ``stream``: see interop.py); cpu tensors
        have none (AttributeError, so ``hasattr`` is False)."""
        from . import interop

        return interop.cuda_array_interface(self)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """The data after the device's pending work (a view of a cpu tensor's memory)."""
        from . import interop

        return interop.array_of(self, dtype, copy)

    def free(self, stream: Any = None) -> None:
        """Return the memory to its pool in ``stream`` order (default: the allocating stream)."""
        ptr = self.ptr
        if not self._owner:
            raise InvalidValueError(f"{self!r} is a view: it does not own its memory")
        s = _stream(stream if stream is not None else self.stream)
        s.free(ptr)
        self._ptr = None
        self._key = -1  # never interned: a freed tensor can never hit an executor cache
