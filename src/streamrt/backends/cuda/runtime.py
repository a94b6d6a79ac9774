"""The CUDA API as the backend's modules call it: cuda-bindings' runtime and driver modules
(imported here, once), the device current on each thread, and the limits of CUDA's arguments.

State: :data:`current`, per thread, the device ``cudaSetDevice`` made current there last, so
that :func:`activate` makes the call only when the device changes (CUDA's current device is per
thread too). Every module that calls CUDA calls ``rt.X``/``drv.X`` through these two names at
call time: tests replace the functions on those modules.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ...errors import BackendUnavailableError, OutOfMemoryError

try:  # imported only when the cuda backend is asked for (backends/__init__.py)
    from cuda.bindings import driver as drv
    from cuda.bindings import runtime as rt
except ImportError as exc:  # pragma: no cover - the registry reports this as unavailable
    raise BackendUnavailableError(
        "the cuda backend needs the 'cuda-bindings' package (pip install 'streamrt[cuda]')"
    ) from exc

from .errors import check

__all__ = ["NOT_READY", "SIZE_MAX", "SUCCESS", "activate", "current", "drv", "host_ptr",
           "legacy_stream", "rt", "too_big"]

SUCCESS = rt.cudaError_t.cudaSuccess
NOT_READY = rt.cudaError_t.cudaErrorNotReady
SIZE_MAX = (1 << 64) - 1  # size_t / cuuint64_t: larger Python ints raise OverflowError
current = threading.local()  # ``device``: the CUDA device current on this thread


def activate(index: int) -> None:
    """Make device ``index`` current on the calling thread (``cudaSetDevice``, when it is not)."""
    if getattr(current, "device", None) != index:
        check(rt.cudaSetDevice(index))
        current.device = index


def legacy_stream() -> Any:
    """The legacy default stream of the current device (``cudaStreamLegacy``)."""
    return rt.cudaStream_t(rt.cudaStreamLegacy)


def too_big(nbytes: int, what: str) -> None:
    """No allocation of more than SIZE_MAX bytes can succeed: OutOfMemoryError, as on cpu."""
    if nbytes > SIZE_MAX:
        raise OutOfMemoryError(f"{what} of {nbytes} bytes: more than any device can hold")


def host_ptr(buf: Any) -> int:
    """Address of a host ``uint8`` view (the frontend validated it), or a device pointer."""
    return int(buf.ctypes.data) if isinstance(buf, np.ndarray) else int(buf)
