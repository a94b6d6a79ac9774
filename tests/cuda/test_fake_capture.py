"""The fake's stream capture and driver stream/memory/context calls (``tests/cuda/fake``), which the
raw cuda-bindings peers of ``benchmarks/gpu_*.py`` use.

Opt-in with the fake: ``STREAMRT_CUDA_FAKE=1 python -m pytest tests/cuda/test_fake_capture.py``.
"""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np
import pytest

pytestmark = pytest.mark.cuda

if os.environ.get("STREAMRT_CUDA_FAKE") != "1":
    pytest.skip("the fake CUDA runtime is opt-in: set STREAMRT_CUDA_FAKE=1", allow_module_level=True)

from cuda.bindings import driver as drv  # noqa: E402
from cuda.bindings import runtime as rt  # noqa: E402

E = rt.cudaError_t
R = drv.CUresult
MODE = rt.cudaStreamCaptureMode
HOSTFN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_keep: list = []


def ok(res):
    err, *values = res if isinstance(res, tuple) else (res,)
    assert err in (E.cudaSuccess, R.CUDA_SUCCESS), err
    return values[0] if len(values) == 1 else (values or None)


@pytest.fixture
def ctx():
    ok(drv.cuInit(0))
    dev = ok(drv.cuDeviceGet(0))
    c = ok(drv.cuDevicePrimaryCtxRetain(dev))
    ok(drv.cuCtxSetCurrent(c))
    yield c
    ok(drv.cuDevicePrimaryCtxRelease(dev))
    ok(rt.cudaDeviceSynchronize())


def test_driver_and_runtime_share_contexts_streams_and_memory(ctx):
    assert int(ok(drv.cuDevicePrimaryCtxRetain(ok(drv.cuDeviceGet(0))))) == int(ctx)
    ok(drv.cuDevicePrimaryCtxRelease(ok(drv.cuDeviceGet(0))))
    assert drv.cuCtxSetCurrent(drv.CUcontext(12345))[0] == R.CUDA_ERROR_INVALID_CONTEXT
    s = ok(drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING))
    assert isinstance(s, drv.CUstream)
    p = ok(drv.cuMemAlloc(64))
    assert isinstance(p, drv.CUdeviceptr)
    assert drv.cuMemAlloc(0)[0] == R.CUDA_ERROR_INVALID_VALUE
    ok(drv.cuMemsetD32Async(p, 7, 16, s))
    ok(rt.cudaStreamSynchronize(rt.cudaStream_t(int(s))))  # the same stream under its runtime type
    out = np.zeros(16, np.uint32)
    ok(drv.cuMemcpyDtoH(out, p, 64))
    assert (out == 7).all()
    assert drv.cuMemsetD32(int(p) + 2, 0, 1)[0] == R.CUDA_ERROR_INVALID_VALUE  # unaligned
    ok(drv.cuStreamDestroy(s))
    assert drv.cuStreamSynchronize(s)[0] == R.CUDA_ERROR_INVALID_HANDLE
    ok(drv.cuMemFree(p))
    assert drv.cuMemFree(p)[0] == R.CUDA_ERROR_INVALID_VALUE


def _record_host(log, label):
    cb = HOSTFN(lambda _d: log.append(label))
    _keep.append(cb)
    return rt.cudaHostFn_t(ctypes.cast(cb, ctypes.c_void_p).value)


def test_capture_records_a_fork_and_join_and_replays_it(ctx):
    a = ok(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking))
    b = ok(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking))
    fork, join = ok(rt.cudaEventCreate()), ok(rt.cudaEventCreate())
    x = ok(rt.cudaMalloc(64))
    log: list[str] = []
    ok(rt.cudaStreamBeginCapture(a, MODE.cudaStreamCaptureModeGlobal))
    assert ok(rt.cudaStreamIsCapturing(a)) == rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusActive
    ok(rt.cudaMemsetAsync(x, 1, 64, a))
    ok(rt.cudaEventRecord(fork, a))
    ok(rt.cudaStreamWaitEvent(b, fork, 0))  # b joins the capture
    ok(rt.cudaLaunchHostFunc(b, _record_host(log, "b"), 0))
    ok(rt.cudaEventRecord(join, b))
    ok(rt.cudaLaunchHostFunc(a, _record_host(log, "a"), 0))
    assert rt.cudaEventQuery(fork)[0] == E.cudaErrorCapturedEvent
    assert rt.cudaMalloc(16)[0] == E.cudaErrorStreamCaptureUnsupported  # unsafe in Global mode
    assert rt.cudaStreamEndCapture(a)[0] == E.cudaErrorStreamCaptureInvalidated  # ... which invalidated it
    assert ok(rt.cudaStreamIsCapturing(b)) == rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusNone

    ok(rt.cudaStreamBeginCapture(a, MODE.cudaStreamCaptureModeThreadLocal))
    ok(rt.cudaMemsetAsync(x, 1, 64, a))
    ok(rt.cudaEventRecord(fork, a))
    ok(rt.cudaStreamWaitEvent(b, fork, 0))
    ok(rt.cudaLaunchHostFunc(b, _record_host(log, "b"), 0))
    ok(rt.cudaEventRecord(join, b))
    assert rt.cudaStreamEndCapture(b)[0] == E.cudaErrorStreamCaptureUnmatched
    assert rt.cudaStreamEndCapture(a)[0] == E.cudaErrorStreamCaptureInvalidated

    ok(rt.cudaStreamBeginCapture(a, MODE.cudaStreamCaptureModeRelaxed))
    ok(rt.cudaMemsetAsync(x, 1, 64, a))
    ok(rt.cudaEventRecord(fork, a))
    ok(rt.cudaStreamWaitEvent(b, fork, 0))
    ok(rt.cudaLaunchHostFunc(b, _record_host(log, "b"), 0))
    ok(rt.cudaEventRecord(join, b))
    ok(rt.cudaLaunchHostFunc(a, _record_host(log, "a"), 0))
    ok(rt.cudaMemsetAsync(x, 2, 64, a))
    ok(rt.cudaStreamWaitEvent(a, join, 0))  # the join
    ok(rt.cudaFree(ok(rt.cudaMalloc(16))))  # Relaxed: allowed
    assert log == []  # captured, not run
    graph = ok(rt.cudaStreamEndCapture(a))
    assert isinstance(graph, rt.cudaGraph_t)
    assert rt.cudaStreamWaitEvent(b, join, 0)[0] == E.cudaErrorCapturedEvent  # its capture ended
    gexec = ok(rt.cudaGraphInstantiate(graph, 0))
    ok(rt.cudaGraphLaunch(gexec, a))
    ok(rt.cudaStreamSynchronize(a))
    assert sorted(log) == ["a", "b"]
    back = np.zeros(64, np.uint8)
    ok(rt.cudaMemcpyAsync(back.ctypes.data, x, 64, rt.cudaMemcpyKind.cudaMemcpyDefault, a))
    assert (back == 2).all()
    ok(rt.cudaGraphExecDestroy(gexec))
    ok(rt.cudaGraphDestroy(graph))
    for s in (a, b):
        ok(rt.cudaStreamDestroy(s))


def test_capture_errors(ctx):
    a = ok(rt.cudaStreamCreate())  # blocking
    b = ok(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking))
    ev = ok(rt.cudaEventCreate())
    x = ok(rt.cudaMallocHost(4))
    assert rt.cudaStreamBeginCapture(rt.cudaStreamLegacy, MODE.cudaStreamCaptureModeGlobal)[0] \
        == E.cudaErrorStreamCaptureUnsupported
    assert rt.cudaStreamEndCapture(a)[0] == E.cudaErrorIllegalState
    ok(rt.cudaEventRecord(ev, b))  # outside any capture

    ok(rt.cudaStreamBeginCapture(a, MODE.cudaStreamCaptureModeGlobal))
    assert rt.cudaStreamBeginCapture(a, MODE.cudaStreamCaptureModeGlobal)[0] == E.cudaErrorIllegalState
    assert rt.cudaStreamIsCapturing(0)[0] == E.cudaErrorStreamCaptureImplicit  # not invalidating
    res = [None]
    t = threading.Thread(target=lambda: res.__setitem__(0, rt.cudaStreamEndCapture(a)[0]))
    t.start()
    t.join()
    assert res[0] == E.cudaErrorStreamCaptureWrongThread
    ok(rt.cudaStreamEndCapture(a))  # an empty graph

    ok(rt.cudaStreamBeginCapture(a, MODE.cudaStreamCaptureModeGlobal))
    assert rt.cudaStreamWaitEvent(a, ev, 0)[0] == E.cudaErrorStreamCaptureIsolation
    assert rt.cudaStreamEndCapture(a)[0] == E.cudaErrorStreamCaptureInvalidated

    ok(rt.cudaStreamBeginCapture(a, MODE.cudaStreamCaptureModeGlobal))
    assert rt.cudaMemsetAsync(x, 0, 4, 0)[0] == E.cudaErrorStreamCaptureImplicit  # legacy stream
    assert rt.cudaStreamEndCapture(a)[0] == E.cudaErrorStreamCaptureInvalidated

    ok(rt.cudaStreamBeginCapture(a, MODE.cudaStreamCaptureModeGlobal))
    assert rt.cudaStreamSynchronize(a)[0] == E.cudaErrorStreamCaptureUnsupported
    assert rt.cudaStreamEndCapture(a)[0] == E.cudaErrorStreamCaptureInvalidated

    ok(rt.cudaStreamBeginCapture(a, MODE.cudaStreamCaptureModeGlobal))
    ok(rt.cudaEventRecord(ev, a))
    ok(rt.cudaStreamWaitEvent(b, ev, 0))
    ok(rt.cudaMemsetAsync(x, 0, 4, b))  # forked work never joined back
    assert rt.cudaStreamEndCapture(a)[0] == E.cudaErrorStreamCaptureUnjoined
    ok(rt.cudaFreeHost(x))
    for s in (a, b):
        ok(rt.cudaStreamDestroy(s))
