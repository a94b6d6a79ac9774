"""The fake CUDA runtime itself (``tests/cuda/fake``), where a wrong fake would make the cuda tests
lie: legacy-stream ordering, pageable copies, host functions calling CUDA, event timing errors,
VMM sharing, pool reuse, graph node order, graph event nodes and kernel parameter checks.

Opt-in with the fake: ``STREAMRT_CUDA_FAKE=1 python -m pytest tests/cuda/test_fake_runtime.py``.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

import numpy as np
import pytest

pytestmark = pytest.mark.cuda  # selected by ``-m cuda`` with the rest of the cuda tests

if os.environ.get("STREAMRT_CUDA_FAKE") != "1":
    pytest.skip("the fake CUDA runtime is opt-in: set STREAMRT_CUDA_FAKE=1", allow_module_level=True)

from cuda.bindings import driver as drv  # noqa: E402
from cuda.bindings import runtime as rt  # noqa: E402

from streamrt.backends.cuda.nvrtc import compile_cubin  # noqa: E402
from tests.cuda.fake import state  # noqa: E402

E = rt.cudaError_t
R = drv.CUresult
HOSTFN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_keep: list = []  # C callbacks must outlive their calls


def ok(res):
    err, *values = res if isinstance(res, tuple) else (res,)
    assert err in (E.cudaSuccess, R.CUDA_SUCCESS), err
    return values[0] if len(values) == 1 else (values or None)


def host_fn(py):
    """A ``cudaHostFn_t`` calling ``py()`` (the user data is ignored)."""
    cb = HOSTFN(lambda _data: py())
    _keep.append(cb)
    return rt.cudaHostFn_t(ctypes.cast(cb, ctypes.c_void_p).value)


class Hold:
    """A host function that blocks its stream until :meth:`open` (it calls no CUDA)."""

    def __init__(self, stream) -> None:
        self.event = threading.Event()
        ok(rt.cudaLaunchHostFunc(stream, host_fn(lambda: self.event.wait(30)), 0))

    def open(self) -> None:
        self.event.set()


@pytest.fixture
def dev0():
    ok(rt.cudaSetDevice(0))
    yield 0
    ok(rt.cudaDeviceSynchronize())


def stream(non_blocking: bool):
    return ok(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking if non_blocking else 0))


def test_the_fake_says_what_it_is(dev0):
    import streamrt as srt

    assert srt.Device("cuda:0")._impl.model == "streamrt fake GPU"
    assert ok(rt.cudaGetDeviceCount()) >= 1


def test_legacy_stream_waits_for_blocking_streams_only(dev0):
    blocking, nb = stream(False), stream(True)
    ran: list[str] = []
    hold_b, hold_nb = Hold(blocking), Hold(nb)
    ok(rt.cudaLaunchHostFunc(rt.cudaStreamLegacy, host_fn(lambda: ran.append("legacy")), 0))
    time.sleep(0.1)
    assert ran == [] and rt.cudaStreamQuery(0)[0] == E.cudaErrorNotReady  # behind the blocking one
    hold_b.open()
    ok(rt.cudaStreamSynchronize(rt.cudaStreamLegacy))  # does not wait for the non-blocking one
    assert ran == ["legacy"] and rt.cudaStreamQuery(nb)[0] == E.cudaErrorNotReady
    hold_nb.open()
    for s in (blocking, nb):
        ok(rt.cudaStreamDestroy(s))


def test_blocking_stream_waits_for_earlier_legacy_work(dev0):
    blocking, nb = stream(False), stream(True)
    ran: list[str] = []
    hold = Hold(rt.cudaStreamLegacy)
    ok(rt.cudaLaunchHostFunc(blocking, host_fn(lambda: ran.append("blocking")), 0))
    ok(rt.cudaLaunchHostFunc(nb, host_fn(lambda: ran.append("non-blocking")), 0))
    ok(rt.cudaStreamSynchronize(nb))
    time.sleep(0.1)
    assert ran == ["non-blocking"]
    hold.open()
    ok(rt.cudaStreamSynchronize(blocking))
    assert ran == ["non-blocking", "blocking"]
    for s in (blocking, nb):
        ok(rt.cudaStreamDestroy(s))


def test_pageable_copies_stage_the_source_and_wait_for_the_destination(dev0):
    s = stream(True)
    n = 4096
    d = ok(rt.cudaMalloc(n))
    pinned = ok(rt.cudaMallocHost(n))
    src = np.arange(n, dtype=np.uint8)
    hold = Hold(s)
    ok(rt.cudaMemcpyAsync(d, src.ctypes.data, n, rt.cudaMemcpyKind.cudaMemcpyDefault, s))
    src[:] = 7  # staged at the call: the copy still carries the old bytes
    ok(rt.cudaMemcpyAsync(pinned, d, n, rt.cudaMemcpyKind.cudaMemcpyDefault, s))  # async: returns
    assert rt.cudaStreamQuery(s)[0] == E.cudaErrorNotReady
    back = np.zeros(n, np.uint8)
    timer = threading.Timer(0.3, hold.open)
    timer.start()
    t0 = time.monotonic()
    ok(rt.cudaMemcpyAsync(back.ctypes.data, d, n, rt.cudaMemcpyKind.cudaMemcpyDefault, s))
    assert time.monotonic() - t0 >= 0.2  # a pageable destination: returned once copied
    assert np.array_equal(back, np.arange(n, dtype=np.uint8))
    assert np.array_equal(np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(pinned)), back)
    ok(rt.cudaStreamDestroy(s))
    ok(rt.cudaFreeHost(pinned))
    ok(rt.cudaFree(d))
    assert rt.cudaFree(d)[0] == E.cudaErrorInvalidValue  # double free
    assert rt.cudaFreeHost(pinned)[0] == E.cudaErrorInvalidValue


def test_large_pageable_copies_to_the_device_wait_for_the_stream(dev0):
    # a small one is staged whole and returns; a large one goes through the driver's staging
    # buffers and returns about when the stream reaches it (what a real driver may do)
    s = stream(True)
    n = 1 << 20
    d = ok(rt.cudaMalloc(n))
    kind = rt.cudaMemcpyKind.cudaMemcpyDefault
    small, large = np.full(1024, 3, np.uint8), np.full(n, 5, np.uint8)
    hold = Hold(s)
    ok(rt.cudaMemcpyAsync(d, small.ctypes.data, small.nbytes, kind, s))
    assert rt.cudaStreamQuery(s)[0] == E.cudaErrorNotReady  # returned with the stream held
    timer = threading.Timer(0.3, hold.open)
    timer.start()
    t0 = time.monotonic()
    ok(rt.cudaMemcpyAsync(d, large.ctypes.data, n, kind, s))
    assert time.monotonic() - t0 >= 0.2
    ok(rt.cudaStreamSynchronize(s))
    ok(rt.cudaStreamDestroy(s))
    ok(rt.cudaFree(d))


def test_copies_past_an_allocation_and_fills_of_pageable_memory_fail(dev0):
    d = ok(rt.cudaMalloc(256))
    host = np.zeros(512, np.uint8)
    kind = rt.cudaMemcpyKind.cudaMemcpyDefault
    assert rt.cudaMemcpyAsync(d, host.ctypes.data, 512, kind, 0)[0] == E.cudaErrorInvalidValue
    assert rt.cudaMemsetAsync(host.ctypes.data, 0, 512, 0)[0] == E.cudaErrorInvalidValue
    ok(rt.cudaFree(d))


def test_a_host_function_may_not_call_cuda(dev0):
    s = stream(True)
    seen: list = []
    before = len(state.refused)
    ok(rt.cudaLaunchHostFunc(s, host_fn(lambda: seen.append(rt.cudaStreamQuery(s)[0])), 0))
    ok(rt.cudaStreamSynchronize(s))
    assert seen == [E.cudaErrorNotPermitted]
    assert state.refused[before:] and state.refused[-1][0] == "cudaStreamQuery"
    ok(rt.cudaStreamDestroy(s))


def test_event_timing_and_its_errors(dev0):
    s = stream(True)
    start, end = ok(rt.cudaEventCreate()), ok(rt.cudaEventCreate())
    plain = ok(rt.cudaEventCreateWithFlags(rt.cudaEventDisableTiming))
    assert rt.cudaEventQuery(start)[0] == E.cudaSuccess  # never recorded: complete
    assert rt.cudaEventElapsedTime(start, end)[0] == E.cudaErrorInvalidResourceHandle  # unrecorded
    ok(rt.cudaEventRecord(start, s))
    hold = Hold(s)
    ok(rt.cudaEventRecord(end, s))
    ok(rt.cudaEventRecord(plain, s))
    assert rt.cudaEventElapsedTime(start, end)[0] == E.cudaErrorNotReady
    time.sleep(0.05)
    hold.open()
    ok(rt.cudaEventSynchronize(plain))
    ms = ok(rt.cudaEventElapsedTime(start, end))
    assert ms >= 40 and ok(rt.cudaEventElapsedTime(end, start)) == pytest.approx(-ms)
    assert rt.cudaEventElapsedTime(start, plain)[0] == E.cudaErrorInvalidResourceHandle
    ok(rt.cudaEventDestroy(plain))
    assert rt.cudaEventQuery(plain)[0] == E.cudaErrorInvalidResourceHandle
    ok(rt.cudaStreamDestroy(s))


def test_vmm_two_ranges_share_one_allocation(dev0):
    prop = drv.CUmemAllocationProp()
    prop.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    g = ok(drv.cuMemGetAllocationGranularity(
        prop, drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
    assert g == 2 << 20
    assert drv.cuMemCreate(g + 1, prop, 0)[0] == R.CUDA_ERROR_INVALID_VALUE
    h = ok(drv.cuMemCreate(g, prop, 0))
    a, b = ok(drv.cuMemAddressReserve(g, 0, 0, 0)), ok(drv.cuMemAddressReserve(g, 0, 0, 0))
    access = drv.CUmemAccessDesc()
    access.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    access.location.id = 0
    access.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    for p in (a, b):
        ok(drv.cuMemMap(p, g, 0, h, 0))
        ok(drv.cuMemSetAccess(p, g, [access], 1))
    ok(drv.cuMemRelease(h))  # the mappings keep the memory
    src = np.arange(1024, dtype=np.float32)
    ok(rt.cudaMemcpyAsync(int(a) + 4096, src.ctypes.data, src.nbytes,
                          rt.cudaMemcpyKind.cudaMemcpyDefault, 0))
    back = np.zeros_like(src)
    ok(rt.cudaMemcpyAsync(back.ctypes.data, int(b) + 4096, src.nbytes,
                          rt.cudaMemcpyKind.cudaMemcpyDefault, 0))
    assert np.array_equal(back, src)  # written through a, read through b
    for p in (a, b):
        ok(drv.cuMemUnmap(p, g))
        ok(drv.cuMemAddressFree(p, g))


def test_pool_reuse_follows_stream_order(dev0):
    s1, s2 = stream(True), stream(True)
    pool = ok(rt.cudaDeviceGetDefaultMemPool(0))
    p = ok(rt.cudaMallocFromPoolAsync(1024, pool, s1))
    hold = Hold(s1)
    ok(rt.cudaFreeAsync(p, s1))
    assert ok(rt.cudaMallocFromPoolAsync(1024, pool, s1)) == p  # same stream: at once
    ok(rt.cudaFreeAsync(p, s1))
    q = ok(rt.cudaMallocFromPoolAsync(1024, pool, s2))
    assert q != p  # s1's free is pending and s2 does not wait for it
    hold.open()
    ok(rt.cudaStreamSynchronize(s1))
    ok(rt.cudaFreeAsync(q, s2))
    ok(rt.cudaStreamSynchronize(s2))
    assert int(ok(rt.cudaMemPoolGetAttribute(pool, rt.cudaMemPoolAttr(7)))) == 0
    with pytest.raises(AttributeError):  # the real binding wants cuuint64_t for sizes
        rt.cudaMemPoolSetAttribute(pool, rt.cudaMemPoolAttr(4), 5)
    assert rt.cudaMemPoolSetAttribute(pool, rt.cudaMemPoolAttr(7), drv.cuuint64_t(0))[0] \
        == E.cudaErrorInvalidValue
    for s in (s1, s2):
        ok(rt.cudaStreamDestroy(s))


ADD = r"""extern "C" __global__ void fake_add(float* x, int n, float v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += v;
}"""


@pytest.fixture
def add_fn(dev0):
    cubin = compile_cubin(ADD, "fake_add", "sm_90")
    module = ok(drv.cuModuleLoadData(cubin))
    return ok(drv.cuModuleGetFunction(module, b"fake_add"))


def test_kernel_parameters_are_checked_and_copied(add_fn):
    n = 100
    x = ok(rt.cudaMalloc(4 * n))
    ok(rt.cudaMemsetAsync(x, 0, 4 * n, 0))
    args = ((x, n, 2.0), (ctypes.c_void_p, ctypes.c_int32, ctypes.c_float))
    ok(drv.cuLaunchKernel(add_fn, 1, 1, 1, 100, 1, 1, 0, drv.CUstream(0), args, 0))  # a partial warp
    with pytest.raises(state.FakeMisuse):  # a 64-bit int for a C int
        drv.cuLaunchKernel(add_fn, 1, 1, 1, 32, 1, 1, 0, drv.CUstream(0),
                           ((x, n, 1.0), (ctypes.c_void_p, ctypes.c_int64, ctypes.c_float)), 0)
    assert drv.cuLaunchKernel(add_fn, 1, 1, 1, 2048, 1, 1, 0, drv.CUstream(0), args, 0)[0] \
        == R.CUDA_ERROR_INVALID_VALUE
    back = np.zeros(n, np.float32)
    ok(rt.cudaMemcpyAsync(back.ctypes.data, x, 4 * n, rt.cudaMemcpyKind.cudaMemcpyDefault, 0))
    assert np.array_equal(back, np.full(n, 2.0, np.float32))
    ok(rt.cudaFree(x))


def test_graph_runs_unordered_nodes_last_added_first(dev0):
    g = ok(rt.cudaGraphCreate(0))
    ran: list[int] = []
    nodes = []
    for i in range(3):
        hp = rt.cudaHostNodeParams()
        hp.fn = host_fn(lambda i=i: ran.append(i))
        deps = nodes[:1] if i == 2 else []
        nodes.append(ok(rt.cudaGraphAddHostNode(g, deps, len(deps), hp)))
    exe = ok(rt.cudaGraphInstantiate(g, 0))
    ok(rt.cudaGraphDestroy(g))  # the exec keeps its own copy
    ok(rt.cudaGraphLaunch(exe, 0))
    ok(rt.cudaStreamSynchronize(0))
    assert ran == [1, 0, 2]  # 0 and 1 are independent: the later one runs first
    ok(rt.cudaGraphExecDestroy(exe))


def _host_node(g, deps, py):
    hp = rt.cudaHostNodeParams()
    hp.fn = host_fn(py)
    return ok(rt.cudaGraphAddHostNode(g, deps, len(deps), hp))


def _event_node(g, deps, event, wait: bool):
    add = drv.cuGraphAddEventWaitNode if wait else drv.cuGraphAddEventRecordNode
    return ok(add(drv.CUgraph(int(g)), [drv.CUgraphNode(int(d)) for d in deps], len(deps),
                  drv.CUevent(int(event))))


def test_graph_event_nodes_act_where_they_sit(dev0):
    # the wait node (first to be ready in the fake's order) waits for a held stream's record: the
    # nodes not after it run, the record node records its event then (the host sees it complete),
    # and the wait node's dependent runs once the held stream got there
    s, other = stream(True), stream(True)
    log: list[str] = []
    hold = Hold(other)
    waited, recorded = ok(rt.cudaEventCreate()), ok(rt.cudaEventCreate())
    ok(rt.cudaEventRecord(waited, other))
    g = ok(rt.cudaGraphCreate(0))
    a = _host_node(g, [], lambda: log.append("a"))
    _event_node(g, [a], recorded, wait=False)
    w = _event_node(g, [], waited, wait=True)
    _host_node(g, [w], lambda: log.append("after the wait"))
    exe = ok(rt.cudaGraphInstantiate(g, 0))
    ok(rt.cudaGraphLaunch(exe, s))
    ok(rt.cudaEventSynchronize(recorded))  # the launch's record: returns while the wait node waits
    assert log == ["a"]
    assert rt.cudaStreamQuery(s)[0] == E.cudaErrorNotReady
    hold.open()
    ok(rt.cudaStreamSynchronize(s))
    assert log == ["a", "after the wait"]
    ok(rt.cudaGraphExecDestroy(exe))
    ok(rt.cudaGraphDestroy(g))
    for e in (waited, recorded):
        ok(rt.cudaEventDestroy(e))
    for x in (s, other):
        ok(rt.cudaStreamDestroy(x))


def test_graph_wait_node_binds_at_launch_and_takes_a_new_event_for_later_launches(dev0):
    s, other = stream(True), stream(True)
    log: list[str] = []
    first, second = ok(rt.cudaEventCreate()), ok(rt.cudaEventCreate())
    g = ok(rt.cudaGraphCreate(0))
    w = _event_node(g, [], first, wait=True)
    _host_node(g, [w], lambda: log.append("ran"))
    exe = ok(rt.cudaGraphInstantiate(g, 0))
    ok(rt.cudaGraphLaunch(exe, s))  # first never recorded: nothing to wait for
    ok(rt.cudaStreamSynchronize(s))
    assert log == ["ran"]
    hold = Hold(other)
    ok(rt.cudaEventRecord(second, other))
    ok(drv.cuGraphExecEventWaitNodeSetEvent(drv.CUgraphExec(int(exe)), drv.CUgraphNode(int(w)),
                                            drv.CUevent(int(second))))
    ok(rt.cudaGraphLaunch(exe, s))  # waits for other's record of second
    ok(rt.cudaEventRecord(second, s))  # a later record: the launch keeps the one it took
    assert rt.cudaStreamQuery(s)[0] == E.cudaErrorNotReady
    hold.open()
    ok(rt.cudaStreamSynchronize(s))
    assert log == ["ran", "ran"]
    bad = drv.cuGraphExecEventWaitNodeSetEvent(drv.CUgraphExec(int(exe)), drv.CUgraphNode(int(w)),
                                               drv.CUevent(12345))
    assert bad[0] == R.CUDA_ERROR_INVALID_VALUE
    ok(rt.cudaGraphExecDestroy(exe))
    ok(rt.cudaGraphDestroy(g))
    for e in (first, second):
        ok(rt.cudaEventDestroy(e))
    for x in (s, other):
        ok(rt.cudaStreamDestroy(x))


def test_pool_reuse_needs_a_dependency_or_a_host_synchronize(dev0):
    s1, s2 = stream(True), stream(True)
    pool = ok(rt.cudaDeviceGetDefaultMemPool(0))
    for attr in (1, 2, 3):  # every reuse flag off
        ok(rt.cudaMemPoolSetAttribute(pool, rt.cudaMemPoolAttr(attr), 0))
    ok(rt.cudaMemPoolSetAttribute(pool, rt.cudaMemPoolAttr(4), drv.cuuint64_t(1 << 30)))
    try:
        p = ok(rt.cudaMallocFromPoolAsync(1024, pool, s1))
        ok(rt.cudaFreeAsync(p, s1))
        done = ok(rt.cudaEventCreate())
        ok(rt.cudaEventRecord(done, s1))
        while rt.cudaEventQuery(done)[0] != E.cudaSuccess:  # completed, but no host synchronize
            time.sleep(0.01)
        q = ok(rt.cudaMallocFromPoolAsync(1024, pool, s2))
        assert q != p
        ok(rt.cudaStreamSynchronize(s1))  # now the host has seen the free: any stream may reuse
        assert ok(rt.cudaMallocFromPoolAsync(1024, pool, s2)) == p
        for x in (p, q):
            ok(rt.cudaFreeAsync(x, s2))
        ok(rt.cudaStreamSynchronize(s2))
        reserved = int(ok(rt.cudaMemPoolGetAttribute(pool, rt.cudaMemPoolAttr(5))))
        assert reserved == 2 * (2 << 20)  # the threshold keeps both blocks
        ok(rt.cudaMemPoolTrimTo(pool, 3 << 20))  # at least minBytesToKeep stays reserved:
        assert int(ok(rt.cudaMemPoolGetAttribute(pool, rt.cudaMemPoolAttr(5)))) == 4 << 20  # 4 > 3 > 2
        ok(rt.cudaMemPoolTrimTo(pool, 2 << 20))
        assert int(ok(rt.cudaMemPoolGetAttribute(pool, rt.cudaMemPoolAttr(5)))) == 2 << 20
        ok(rt.cudaMemPoolTrimTo(pool, 0))
        assert int(ok(rt.cudaMemPoolGetAttribute(pool, rt.cudaMemPoolAttr(5)))) == 0
    finally:
        for attr in (1, 2, 3):
            ok(rt.cudaMemPoolSetAttribute(pool, rt.cudaMemPoolAttr(attr), 1))
        ok(rt.cudaMemPoolSetAttribute(pool, rt.cudaMemPoolAttr(4), drv.cuuint64_t(0)))
        for s in (s1, s2):
            ok(rt.cudaStreamDestroy(s))


def test_freed_memory_is_refused_and_the_legacy_stream_follows_the_current_device(dev0):
    d = ok(rt.cudaMalloc(4096))
    ok(rt.cudaFree(d))
    host = np.zeros(16, np.uint8)
    assert rt.cudaMemcpyAsync(host.ctypes.data, d, 16, rt.cudaMemcpyKind.cudaMemcpyDefault, 0)[0] \
        == E.cudaErrorInvalidValue  # never handed out again, never read as host memory
    if ok(rt.cudaGetDeviceCount()) < 2:
        return
    hold = Hold(rt.cudaStreamLegacy)  # device 0's legacy stream
    ok(rt.cudaSetDevice(1))
    try:
        assert rt.cudaStreamQuery(0)[0] == E.cudaSuccess  # device 1's: idle
    finally:
        ok(rt.cudaSetDevice(0))
        hold.open()


INNER = '''
import pytest
import streamrt as srt
from tests.conftest import backend_device, cuda_reason


@pytest.mark.cuda
def test_a_leaves_a_sticky_error():
    assert cuda_reason() is None
    srt.Device("cuda:0")
    from cuda.bindings import runtime as rt
    # as after a kernel fault: every later CUDA call returns the error
    rt.cudaMemGetInfo = lambda: (rt.cudaError_t.cudaErrorIllegalAddress, 0, 0)


@pytest.mark.cuda
def test_b_runs_later():
    backend_device("cuda")


def test_c_cpu_still_runs():
    backend_device("cpu")
'''


def test_fake_sticky_error_skips_later_cuda_tests_naming_its_test(tmp_path):
    # the conftest check that a real GPU run relies on: one poisoned context, one clear reason
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "conftest.py").write_text("from tests.conftest import _cuda_context_still_usable  # noqa\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, STREAMRT_CUDA_FAKE="1", PYTHONPATH=root)
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                        "-o", "markers=cuda", "--rootdir", str(tmp_path), str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert "2 passed, 1 skipped" in r.stdout, r.stdout + r.stderr
    assert "test_a_leaves_a_sticky_error left cudaErrorIllegalAddress" in r.stdout, r.stdout
