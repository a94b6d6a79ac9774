"""Argument checks shared by every enqueue and allocation call: sizes, pointers, host buffers;
and the reading of ``STREAMRT_*`` environment settings."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InvalidTypeError, InvalidValueError

__all__ = ["check_bool", "check_size", "check_ptr", "check_byte", "host_view", "host_array",
           "as_path", "is_int", "is_bool", "env_int", "env_flag"]


def is_int(v: Any) -> bool:
    """An integer, Python's or numpy's; not a bool (though ``True == 1``)."""
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


def is_bool(v: Any) -> bool:
    """A bool, Python's or numpy's."""
    return isinstance(v, bool | np.bool_)


def check_bool(v: Any, what: str) -> bool:
    """Validate a flag: a bool (numpy's too); an array's truth would be ambiguous."""
    if not is_bool(v):
        raise InvalidTypeError(f"{what} must be a bool, not {type(v).__name__}")
    return bool(v)


def check_size(nbytes: Any, what: str = "nbytes") -> int:
    """Validate a byte count: a non-negative int."""
    if type(nbytes) is int and nbytes >= 0:  # the common case, cheaply
        return nbytes
    if not is_int(nbytes):
        raise InvalidTypeError(f"{what} must be an int, not {type(nbytes).__name__}")
    if nbytes < 0:
        raise InvalidValueError(f"{what} must be >= 0, got {nbytes}")
    return int(nbytes)


def check_ptr(ptr: Any, what: str = "pointer") -> int:
    """Validate a device pointer: an int."""
    if type(ptr) is int:
        return ptr
    if not is_int(ptr):
        raise InvalidTypeError(f"{what} must be an int device pointer, not {type(ptr).__name__}")
    return int(ptr)


def host_view(obj: Any, nbytes: int, *, writable: bool) -> np.ndarray:
    """A flat ``uint8`` view of a host buffer (numpy array, bytearray, memoryview, bytes, or a
    DLPack producer of host memory: a PyTorch CPU tensor, say), zero-copy."""
    cuda = False  # a kDLCUDA producer: said so if refused
    if not isinstance(obj, np.ndarray) and hasattr(obj, "__dlpack__") and \
            not type(obj).__module__.startswith("streamrt"):  # (a Tensor is device memory)
        try:
            kind = int(obj.__dlpack_device__()[0])
        except Exception:  # noqa: BLE001 - not a working producer: judged as any other object
            kind = 0
        host = kind in (1, 3)  # kDLCPU, kDLCUDAHost
        cuda = kind == 2  # kDLCUDA
        if host:
            try:
                obj = np.from_dlpack(obj)
            except (BufferError, TypeError, ValueError, RuntimeError) as exc:
                raise InvalidValueError(f"a copy endpoint of type {type(obj).__name__}: its "
                                        f"DLPack export failed: {exc}") from None
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:  # its bytes are PyObject pointers: never copied as data
            raise InvalidTypeError(f"a host buffer of dtype {obj.dtype} holds Python objects, "
                                   "not data; use a numeric dtype")
        if not obj.flags.c_contiguous:
            raise InvalidValueError("host buffer must be C-contiguous (use np.ascontiguousarray)")
        flat = obj.reshape(-1).view(np.uint8)
    else:
        try:
            mv = memoryview(obj)
        except TypeError:
            if cuda or _cuda_memory(obj):
                raise InvalidTypeError(
                    f"{type(obj).__name__} is device memory (DLPack or CUDA Array Interface): it "
                    "is an end of an eager copy on a stream of its device only (s.memcpy, "
                    "srt.memcpy); a graph or a capture takes an int pointer whose memory outlives "
                    "the graph (srt.from_dlpack(x), kept alive, and its .ptr)") from None
            raise InvalidTypeError(
                "a copy endpoint is an int device pointer or a host buffer (numpy array, "
                f"bytearray, memoryview), not {type(obj).__name__}"
            ) from None
        if not mv.c_contiguous:
            raise InvalidValueError("host buffer must be C-contiguous")
        flat = np.frombuffer(mv.cast("B"), np.uint8) if mv.nbytes else np.empty(0, np.uint8)
    if writable and not flat.flags.writeable:
        raise InvalidValueError("destination host buffer is read-only")
    if flat.size < nbytes:
        raise InvalidValueError(f"host buffer holds {flat.size} bytes, the copy needs {nbytes}")
    return flat[:nbytes]


def _cuda_memory(obj: Any) -> bool:
    """Whether ``obj`` (refused as a host buffer) is CUDA memory: a cuda Tensor, or an object
    with a ``__cuda_array_interface__`` (looked up without calling a property: it may
    synchronize)."""
    if type(obj).__module__.startswith("streamrt"):
        return getattr(getattr(obj, "device", None), "backend", None) == "cuda"
    return hasattr(type(obj), "__cuda_array_interface__") or \
        "__cuda_array_interface__" in getattr(obj, "__dict__", ())


def host_array(obj: Any, what: str) -> np.ndarray:
    """``obj`` as a C-ordered numpy array (a ragged nested list is InvalidValueError)."""
    try:
        return np.asarray(obj, order="C")
    except (ValueError, TypeError) as exc:
        raise InvalidValueError(f"{what}: {type(obj).__name__} is not array-like: {exc}") from None


def as_path(path: Any, what: str) -> Path:
    """A file path: a str or an ``os.PathLike``."""
    if not isinstance(path, str | os.PathLike):
        raise InvalidTypeError(f"{what} must be a str or os.PathLike path, not {type(path).__name__}")
    return Path(path)


def check_byte(value: Any) -> int:
    """Validate a memset value: an int byte 0-255."""
    if not is_int(value):
        raise InvalidTypeError(f"memset value must be an int, not {type(value).__name__}")
    if not 0 <= value <= 255:
        raise InvalidValueError(f"memset value must be a byte 0-255, got {value}")
    return int(value)


_WORDS = {"false": False, "off": False, "no": False, "true": True, "on": True, "yes": True}


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    """An integer setting (unset or empty: ``default``); anything else is InvalidValueError."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidValueError(f"environment variable {name}={raw!r} is not an integer") from None
    if value < minimum:
        raise InvalidValueError(f"environment variable {name}={raw!r} must be >= {minimum}")
    return value


def env_flag(name: str, words: dict[str, Any] | None = None) -> Any:
    """An on/off setting: unset, or an integer (non-zero: on, as ``CUDA_LAUNCH_BLOCKING``), or
    true/on/yes, false/off/no, or one of ``words`` (any case: its value is returned)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return False
    try:
        return int(raw) != 0
    except ValueError:
        pass
    choices = {**_WORDS, **(words or {})}
    try:
        return choices[raw.lower()]
    except KeyError:
        raise InvalidValueError(f"environment variable {name}={raw!r}: expected an integer or one "
                                f"of {', '.join(choices)} (or unset)") from None
