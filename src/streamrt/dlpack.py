"""DLPack's C structs in ctypes (``dlpack.h`` 1.1), and the PyCapsules of them that streamrt
makes and consumes: numpy can make and read capsules of host memory only, not of GPU memory.

The structs, field by field as ``dlpack.h`` declares them: ``DLDevice {int32 device_type,
int32 device_id}``; ``DLDataType {uint8 code, uint8 bits, uint16 lanes}``; ``DLTensor {void*
data, DLDevice device, int32 ndim, DLDataType dtype, int64* shape, int64* strides (in elements;
NULL: compact row-major), uint64 byte_offset}``; ``DLManagedTensor {DLTensor dl_tensor, void*
manager_ctx, void (*deleter)(self)}``; ``DLManagedTensorVersioned {DLPackVersion {uint32 major,
uint32 minor} version, void* manager_ctx, void (*deleter)(self), uint64 flags, DLTensor
dl_tensor}``.

Capsules follow the Python array API's data interchange: named ``"dltensor"`` (or
``"dltensor_versioned"``); a consumer takes ownership by renaming it ``"used_dltensor"`` (or
``"used_dltensor_versioned"``) and calls the deleter when done with the memory; a capsule
collected unconsumed calls the deleter from its destructor. So the deleter runs exactly once.

State and invariants: :data:`_LIVE` holds every exported struct, with its shape and strides
arrays and the object whose memory it describes (``keep``: the Tensor), by the struct's address,
until its deleter runs. The capsule names and the C callbacks are never freed (their refcounts
are leaked on purpose): a capsule or a consumer's array may outlive this module at exit.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

__all__ = ["DLPACK_VERSION", "FLAG_IS_COPIED", "FLAG_READ_ONLY", "DLDataType", "DLDevice",
           "DLManagedTensor", "DLManagedTensorVersioned", "DLPackVersion", "DLTensor", "Imported",
           "consume", "dl_dtype", "live_exports", "make_capsule", "np_dtype"]

DLPACK_VERSION = (1, 1)  # the dlpack.h these structs follow (what a versioned capsule says)
FLAG_READ_ONLY = 1 << 0  # DLPACK_FLAG_BITMASK_READ_ONLY
FLAG_IS_COPIED = 1 << 1  # DLPACK_FLAG_BITMASK_IS_COPIED
# DLDataTypeCode
KDL_INT, KDL_UINT, KDL_FLOAT, KDL_BFLOAT, KDL_COMPLEX, KDL_BOOL = 0, 1, 2, 4, 5, 6
_CODES = {"i": KDL_INT, "u": KDL_UINT, "f": KDL_FLOAT, "c": KDL_COMPLEX, "b": KDL_BOOL}
_KINDS = {v: k for k, v in _CODES.items()}


class DLDevice(ctypes.Structure):
    """``DLDevice``: a DLDeviceType (an int32 enum: kDLCPU 1, kDLCUDA 2, ...) and an index."""

    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    """``DLDataType``: a DLDataTypeCode, the bits of one lane, the lanes (1 for scalars)."""

    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    """``DLTensor``: strides in elements (NULL: compact row-major), ``byte_offset`` from ``data``."""

    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    """``DLManagedTensor`` (DLPack before 1.0, capsule ``"dltensor"``); ``deleter`` a C function
    pointer ``void (*)(DLManagedTensor*)``, here as an address."""

    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class DLPackVersion(ctypes.Structure):
    """``DLPackVersion``: a major change is an ABI break."""

    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    """``DLManagedTensorVersioned`` (DLPack 1.x, capsule ``"dltensor_versioned"``)."""

    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


# -- the Python C API, through prototypes of our own (ctypes.pythonapi's shared function objects
# keep whatever argtypes another library set on them) ---------------------------------------------
def _api(name: str, restype: Any, *argtypes: Any) -> Any:
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


_incref = _api("Py_IncRef", None, ctypes.py_object)
_capsule_new = _api("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_void_p,
                    ctypes.c_void_p)
_capsule_name = _api("PyCapsule_GetName", ctypes.c_void_p, ctypes.py_object)
_capsule_pointer = _api("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_void_p)
_capsule_rename = _api("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_void_p)
# the destructor's: the capsule is being deallocated, so it is passed as an address (a py_object
# of it would take a reference to a dying object)
_raw_is_valid = _api("PyCapsule_IsValid", ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_raw_pointer = _api("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # void (*)(DLManagedTensor[Versioned]*)
_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # PyCapsule_Destructor


def _immortal(obj: Any) -> Any:
    """``obj`` with a reference nobody drops: alive until the process ends."""
    _incref(obj)
    return obj


def _name(text: bytes) -> int:
    """A capsule name's address: names must be statically allocated (never freed)."""
    return ctypes.addressof(_immortal(ctypes.create_string_buffer(text)))


_N_TENSOR, _N_USED = _name(b"dltensor"), _name(b"used_dltensor")
_N_VERSIONED, _N_USED_VERSIONED = _name(b"dltensor_versioned"), _name(b"used_dltensor_versioned")


class _Export:
    """What one exported struct needs alive: itself, its shape and strides, the memory's owner."""

    __slots__ = ("struct", "shape", "strides", "keep")

    def __init__(self, struct: Any, shape: Any, strides: Any, keep: Any) -> None:
        self.struct, self.shape, self.strides, self.keep = struct, shape, strides, keep


_LIVE: dict[int, _Export] = {}  # struct address -> its export, until the deleter runs


def _delete(addr: int) -> None:
    """The deleter of every struct exported here: drop what it kept (once; a second call is a
    no-op, as the struct is gone)."""
    try:
        _LIVE.pop(addr, None)
    except Exception:  # noqa: S110 - at interpreter exit the module may be half torn down
        pass


_deleter = _immortal(_DELETER(_delete))
_DELETER_ADDR = ctypes.cast(_deleter, ctypes.c_void_p).value


def _destructor(name: int) -> Any:
    def destroy(capsule: int) -> None:
        try:  # a consumer renamed it "used_...": the deleter is the consumer's to call
            if _raw_is_valid(capsule, name):
                _delete(_raw_pointer(capsule, name))
        except Exception:  # noqa: S110 - a destructor must not raise
            pass

    return _immortal(_DESTRUCTOR(destroy))


_destroy_tensor = _destructor(_N_TENSOR)
_destroy_versioned = _destructor(_N_VERSIONED)


def live_exports() -> int:
    """How many exported structs still wait for their deleter (for tests and leak checks)."""
    return len(_LIVE)


def dl_dtype(dtype: np.dtype) -> tuple[int, int, int]:
    """``(code, bits, lanes)`` of a numpy dtype of a Tensor (bool is kDLBool of 8 bits)."""
    code = _CODES.get(dtype.kind)
    if code is None:
        raise BufferError(f"dtype {dtype} has no DLPack type code")
    return (code, dtype.itemsize * 8, 1)


def np_dtype(code: int, bits: int, lanes: int) -> np.dtype:
    """The numpy dtype of a DLDataType; BufferError for what a Tensor cannot hold (bfloat16,
    vector lanes, opaque handles, sub-byte and fp8 types)."""
    kind = _KINDS.get(code)
    if kind is None or lanes != 1 or bits % 8 or (kind == "b" and bits != 8):
        raise BufferError(f"DLPack dtype (code {code}, {bits} bits, {lanes} lanes) is not a "
                          "bool, integer, float or complex type a Tensor holds")
    try:
        return np.dtype(f"{kind}{bits // 8}") if kind != "b" else np.dtype(np.bool_)
    except TypeError:
        raise BufferError(f"DLPack dtype (code {code}, {bits} bits) has no numpy type") from None


def make_capsule(data: int, device: tuple[int, int], shape: tuple[int, ...],
                 strides: tuple[int, ...], dtype: np.dtype, byte_offset: int, keep: Any, *,
                 versioned: bool, flags: int = 0, version: tuple[int, int] = DLPACK_VERSION) -> Any:
    """A capsule of a ``DLManagedTensorVersioned`` (``versioned``) or a ``DLManagedTensor``
    describing ``data + byte_offset`` (``data`` 0 for an empty tensor: DLPack's NULL); ``keep``
    stays alive until the deleter runs. Strides are in elements, always given."""
    ndim = len(shape)
    c_shape = (ctypes.c_int64 * max(ndim, 1))(*shape)
    c_strides = (ctypes.c_int64 * max(ndim, 1))(*strides)
    struct: Any = DLManagedTensorVersioned() if versioned else DLManagedTensor()
    t = struct.dl_tensor
    t.data = data or None
    t.device = DLDevice(*device)
    t.ndim = ndim
    t.dtype = DLDataType(*dl_dtype(dtype))
    t.shape = ctypes.cast(c_shape, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(c_strides, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = byte_offset
    struct.manager_ctx = None  # the export is found by the struct's address (see _LIVE)
    struct.deleter = _DELETER_ADDR
    if versioned:
        struct.version = DLPackVersion(*version)
        struct.flags = flags
    addr = ctypes.addressof(struct)
    _LIVE[addr] = _Export(struct, c_shape, c_strides, keep)
    try:
        if versioned:
            return _capsule_new(addr, _N_VERSIONED, ctypes.cast(_destroy_versioned, ctypes.c_void_p))
        return _capsule_new(addr, _N_TENSOR, ctypes.cast(_destroy_tensor, ctypes.c_void_p))
    except BaseException:
        _LIVE.pop(addr, None)
        raise


class Imported(NamedTuple):
    """A consumed capsule: the DLTensor's fields, the versioned struct's ``version`` and
    ``flags`` (None and 0 for a ``DLManagedTensor``), and ``release``, which calls the
    producer's deleter (once; later calls do nothing)."""

    data: int
    device: tuple[int, int]
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    dtype: tuple[int, int, int]
    byte_offset: int
    version: tuple[int, int] | None
    flags: int
    release: Callable[[], None]


def _releaser(addr: int, deleter: int | None) -> Callable[[], None]:
    done: list[bool] = []

    def release() -> None:
        if not done and deleter:
            done.append(True)
            _DELETER(deleter)(addr)

    return release


def consume(capsule: Any) -> Imported:
    """Take ownership of a DLPack capsule (renamed ``used_...``) and read its tensor. A
    versioned capsule of another major version is released and refused (BufferError)."""
    if type(capsule).__name__ != "PyCapsule":
        raise BufferError(f"__dlpack__ returned {type(capsule).__name__}, not a PyCapsule")
    at = _capsule_name(capsule)
    name = ctypes.string_at(at) if at else b""
    if name == b"dltensor_versioned":
        addr = _capsule_pointer(capsule, at)
        m: Any = DLManagedTensorVersioned.from_address(addr)
        _capsule_rename(capsule, _N_USED_VERSIONED)
        release = _releaser(addr, m.deleter)
        major, minor = int(m.version.major), int(m.version.minor)
        if major != DLPACK_VERSION[0]:  # only the deleter may be read across majors
            release()
            raise BufferError(f"DLPack {major}.{minor} capsule: its layout is not "
                              f"DLPack {DLPACK_VERSION[0]}'s")
        version: tuple[int, int] | None = (major, minor)
        flags = int(m.flags)
    elif name == b"dltensor":
        addr = _capsule_pointer(capsule, at)
        m = DLManagedTensor.from_address(addr)
        _capsule_rename(capsule, _N_USED)
        release = _releaser(addr, m.deleter)
        version, flags = None, 0
    else:
        raise BufferError(f"a capsule named {name.decode(errors='replace')!r} is not an unused "
                          "DLPack tensor (it may have been consumed already)")
    try:
        t = m.dl_tensor
        ndim = int(t.ndim)
        if ndim < 0:
            raise BufferError(f"DLTensor ndim {ndim} < 0")
        shape = tuple(int(t.shape[i]) for i in range(ndim))
        strides = tuple(int(t.strides[i]) for i in range(ndim)) if t.strides else None
        return Imported(int(t.data or 0), (int(t.device.device_type), int(t.device.device_id)),
                        shape, strides, (int(t.dtype.code), int(t.dtype.bits), int(t.dtype.lanes)),
                        int(t.byte_offset), version, flags, release)
    except BaseException:
        release()
        raise
