"""Driver streams (``cuStream*``): the very streams of the runtime fakes.

A ``CUstream`` and a ``cudaStream_t`` with one handle are one fake stream (as in CUDA, where the
two types name the same object), so these calls run the runtime fakes and answer the driver's
``CUresult`` of the same number. ``CU_STREAM_NON_BLOCKING`` is ``cudaStreamNonBlocking`` (1);
handle 0 and ``CU_STREAM_LEGACY`` are the current device's legacy stream.
"""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver as drv

from . import streams
from .binding import driver
from .state import R, to_driver


@driver("cuStreamCreate", 1)
def cuStreamCreate(flags: int) -> tuple:
    if int(flags) & ~1:
        return (R.CUDA_ERROR_INVALID_VALUE, None)
    err, s = streams.cudaStreamCreateWithFlags(int(flags))
    return (to_driver(err), None if s is None else drv.CUstream(int(s)))


@driver("cuStreamCreateWithPriority", 1)
def cuStreamCreateWithPriority(flags: int, priority: int) -> tuple:
    if int(flags) & ~1:
        return (R.CUDA_ERROR_INVALID_VALUE, None)
    err, s = streams.cudaStreamCreateWithPriority(int(flags), int(priority))
    return (to_driver(err), None if s is None else drv.CUstream(int(s)))


@driver("cuStreamDestroy")
def cuStreamDestroy(stream: Any) -> tuple:
    return (to_driver(streams.cudaStreamDestroy(stream)[0]),)


@driver("cuStreamSynchronize")
def cuStreamSynchronize(stream: Any) -> tuple:
    return (to_driver(streams.cudaStreamSynchronize(stream)[0]),)


@driver("cuStreamQuery")
def cuStreamQuery(stream: Any) -> tuple:
    return (to_driver(streams.cudaStreamQuery(stream)[0]),)
