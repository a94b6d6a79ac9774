"""Shared state of the fake: one lock and condition, handles, result codes, the calling thread.

Every fake API function runs under ``LOCK`` only for its bookkeeping; waits use ``CHANGED``
(a condition on that lock, notified whenever any stream completes an operation), so a blocked
caller releases both the lock and the GIL.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any

from cuda.bindings import driver as drv
from cuda.bindings import runtime as rt

LOCK = threading.RLock()
CHANGED = threading.Condition(LOCK)

E = rt.cudaError_t
R = drv.CUresult
SUCCESS = E.cudaSuccess
DRV_SUCCESS = R.CUDA_SUCCESS

GiB = 1 << 30
GRANULARITY = 2 << 20  # cuMemGetAllocationGranularity, and the pools' reservation unit


def device_count() -> int:
    """``STREAMRT_CUDA_FAKE_DEVICES`` (default 2)."""
    return max(int(os.environ.get("STREAMRT_CUDA_FAKE_DEVICES", "2")), 0)


# delay injection, as the cpu backend's: each stream operation starts 0-delay_us µs late, so a
# program that is only correct by luck (a missing wait) fails reliably on the fake too
delay_us = int(os.environ.get("STREAMRT_CUDA_FAKE_DELAY_US", "0") or 0)


def set_delay_us(us: int) -> int:
    """Set the injected delay (µs); returns the previous value."""
    global delay_us
    prev, delay_us = delay_us, max(int(us), 0)
    return prev


_handles = itertools.count(0x1000)


def new_handle() -> int:
    """A fresh opaque handle (never 0, 1 or 2: those name the default streams)."""
    return next(_handles) * 16


# -- the calling thread -------------------------------------------------------------------------
_tls = threading.local()


def current_device() -> int:
    """The calling thread's current device (``cudaSetDevice``; 0 until set)."""
    return getattr(_tls, "device", 0)


def set_current_device(index: int) -> None:
    _tls.device = index


def in_host_function() -> bool:
    """True while this thread runs a host function or host node (it must not call CUDA)."""
    return getattr(_tls, "host_fn", False)


class host_function_scope:
    """Marks the calling (stream worker) thread as running a host function."""

    def __enter__(self) -> None:
        _tls.host_fn = True

    def __exit__(self, *exc: object) -> None:
        _tls.host_fn = False


# CUDA calls refused because they came from a host function: (API name, thread name)
refused: list[tuple[str, str]] = []
# failures inside the fake's own worker threads (a bug of the fake or an unsupported launch)
faults: list[str] = []


def fault(message: str) -> None:
    with LOCK:
        faults.append(message)


class FakeUnsupported(NotImplementedError):
    """A call the real driver would run but the fake cannot (e.g. a 2-D block)."""


class FakeMisuse(AssertionError):
    """A call that is undefined behaviour on a real GPU and that the fake detected (e.g. kernel
    parameters that do not match the kernel's C parameter list)."""


def as_int(x: Any) -> int:
    """A handle or pointer argument (int, cuda-bindings handle type, None) as an int."""
    return 0 if x is None else int(x)


def to_driver(err: Any) -> Any:
    """The ``CUresult`` of a runtime ``cudaError_t`` (the codes the fake uses have one number in
    both APIs: 1 invalid value, 2 out of memory, 400 invalid handle, 600 not ready, 9xx capture)."""
    return R(int(err))
