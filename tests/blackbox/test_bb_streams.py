"""API.md §1-2, §6, DESIGN §2: devices, streams, events, kernels, sync helpers, errors."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import streamrt as srt

from .conftest import (
    Gate,
    assert_not_ordered,
    assert_ordered,
    call_with_timeout,
    download,
    fill,
    finishes_within,
    free_and_sync,
    held_fill,
    scale,
    sync,
    sync_after_race,
    sync_error,
    two_streams,
)

pytestmark = pytest.mark.timeout(60)
PY = sys.executable


def _sub(code, **env):
    e = dict(os.environ, **env)
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=e, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


# ---- devices -------------------------------------------------------------------------------

def test_device_same_spec_same_object():
    assert srt.Device("cpu:0") is srt.Device("cpu:0")
    assert srt.Device("cpu:1") is srt.Device("cpu:1")
    assert srt.Device("cpu") is srt.Device("cpu:0")
    with srt.Device("cpu:0"):
        assert srt.Device(0) is srt.Device("cpu:0")
        assert srt.Device(1) is srt.Device("cpu:1")
        assert srt.Device(None) is srt.current_device()


def test_device_attributes():
    d = srt.Device("cpu:1")
    assert d.backend == "cpu" and d.index == 1 and d.name == "cpu:1"
    assert isinstance(d.index, int)


def test_device_count_default_and_env():
    assert srt.device_count("cpu") == int(os.environ.get("STREAMRT_CPU_DEVICES", 2))
    assert srt.device_count() == srt.device_count("cpu")
    out = _sub("import streamrt as s; print(s.device_count('cpu'))", STREAMRT_CPU_DEVICES="3")
    assert out == "3"


def test_device_current_and_with():
    d0, d1 = srt.Device("cpu:0"), srt.Device("cpu:1")
    d0.set_current()
    assert srt.current_device() is d0
    with d1:
        assert srt.current_device() is d1
        assert srt.Stream().device is d1 if hasattr(srt.Stream(), "device") else True
    assert srt.current_device() is d0


def test_device_memory_info_and_env():
    free, total = srt.Device("cpu:0").memory_info()
    assert isinstance(free, int) and isinstance(total, int) and 0 <= free <= total
    out = _sub("import streamrt as s; print(s.Device('cpu:0').memory_info()[1])",
               STREAMRT_CPU_MEMORY=str(256 << 20))
    assert int(out) == 256 << 20


def test_device_memory_info_counts_allocations():
    d = srt.Device("cpu:0")
    free0, _ = d.memory_info()
    p = srt.malloc(64 << 20, device=d)
    free1, _ = d.memory_info()
    assert free1 <= free0 - (64 << 20)
    srt.free(p)


def test_device_env_cpu_memory_limits_malloc():
    out = _sub(
        "import streamrt as s\n"
        "try:\n    s.malloc(64 << 20)\n"
        "except s.OutOfMemoryError as e:\n    print('oom', isinstance(e, MemoryError))\n",
        STREAMRT_CPU_MEMORY=str(16 << 20))
    assert out == "oom True"


def test_device_pools(dev):
    assert isinstance(dev.default_mem_pool, srt.MemPool)
    assert dev.mem_pool is dev.default_mem_pool
    pool = srt.MemPool(dev)
    dev.set_mem_pool(pool)
    try:
        assert dev.mem_pool is pool
        s = srt.Stream()
        p = s.malloc(1000)
        assert pool.used_mem_current >= 1000
        s.free(p)
        sync(s)
    finally:
        dev.set_mem_pool(dev.default_mem_pool)
    assert dev.mem_pool is dev.default_mem_pool


def test_device_reset_destroys_then_usable():
    d = srt.Device("cpu:1")
    with d:
        s = srt.Stream()
        p = srt.malloc(4096)
        s.memset(p, 1, 4096)
        call_with_timeout(d.reset)
        # device still usable afterwards
        q = srt.malloc(16)
        srt.memset(q, 7, 16)
        assert (srt.read(q, (16,), np.uint8) == 7).all()
        srt.free(q)


# ---- streams -------------------------------------------------------------------------------

def test_stream_readme_producer_consumer(dev, delay):
    n = 1 << 12
    producer = srt.Stream(non_blocking=True)
    consumer = srt.Stream(non_blocking=True)
    ptr = srt.malloc(n * 4)
    producer.memcpy(ptr, np.ones(n, np.float32), n * 4)
    producer.launch(scale, ptr, n, 3.0, grid=n // 256, block=256)
    consumer.wait(producer.record())
    consumer.launch(scale, ptr, n, 2.0)
    out = np.empty(n, np.float32)
    consumer.memcpy(out, ptr, n * 4)
    sync(consumer)
    assert (out == 6.0).all()
    srt.free(ptr)


def test_stream_wait_orders_across_streams(dev):
    a, b = two_streams()
    assert_ordered(a, b, link=lambda: b.wait(a.record()))


def test_stream_non_blocking_not_ordered_with_default(dev):
    assert_not_ordered(srt.Stream(non_blocking=True), dev.default_stream)


def test_stream_blocking_waits_for_default_and_back(dev):
    s = srt.Stream()
    # blocking stream -> default stream
    assert_ordered(s, dev.default_stream,
                   pending=lambda d: not finishes_within(d.synchronize, timeout=0.3))
    # default stream -> blocking stream
    assert_ordered(dev.default_stream, s)


def test_stream_two_blocking_streams_not_ordered_with_each_other(dev):
    a, b = srt.Stream(), srt.Stream()
    assert_not_ordered(a, b)


def test_stream_current_stream(dev):
    assert srt.current_stream() is dev.default_stream
    s = srt.Stream()
    with s:
        assert srt.current_stream() is s
    assert srt.current_stream() is dev.default_stream


def test_stream_memcpy_directions(dev):
    s = srt.Stream(non_blocking=True)
    n = 64
    a = np.arange(n, dtype=np.float32)
    d1, d2 = s.malloc(n * 4), s.malloc(n * 4)
    s.memcpy(d1, a, n * 4)                       # H2D numpy
    s.memcpy(d2, d1, n * 4)                      # D2D
    out = np.zeros(n, np.float32)
    s.memcpy(out, d2, n * 4)                     # D2H
    ba = bytearray(n * 4)
    s.memcpy(ba, d2, n * 4)                      # D2H bytearray
    mv = memoryview(bytearray(a.tobytes()))
    d3 = s.malloc(n * 4)
    s.memcpy(d3, mv, n * 4)                      # H2D memoryview
    sync(s)
    assert (out == a).all()
    assert np.frombuffer(bytes(ba), np.float32).tolist() == a.tolist()
    assert (srt.read(d3, (n,), np.float32) == a).all()
    for p in (d1, d2, d3):
        s.free(p)
    sync(s)


def test_stream_memcpy_pageable_source_staged_at_call(dev):
    s = srt.Stream(non_blocking=True)
    g = Gate()
    g.hold(s)
    a = np.full(16, 5, np.float32)
    d = s.malloc(64)
    s.memcpy(d, a, 64)
    a[:] = 9          # staged at call time: later host changes are not seen
    g.open()
    assert (download(s, d, 16) == 5).all()
    free_and_sync(s, d)


def test_stream_memcpy_pointer_arithmetic(dev):
    p = srt.malloc(64)
    srt.memset(p, 0, 64)
    srt.write(p + 16, np.full(4, 3, np.uint8))
    got = srt.read(p, (64,), np.uint8)
    assert got[16:20].tolist() == [3, 3, 3, 3] and got[:16].sum() == 0 and got[20:].sum() == 0
    srt.free(p)


def test_stream_memset(dev):
    s = srt.Stream()
    p = s.malloc(100)
    s.memset(p, 0xAB, 100)
    assert (download(s, p, 100, np.uint8) == 0xAB).all()
    free_and_sync(s, p)


def test_stream_memset_bad_value(dev):
    s = srt.Stream()
    p = srt.malloc(16)
    with pytest.raises(srt.InvalidValueError):
        s.memset(p, 256, 16)
    with pytest.raises(ValueError):
        s.memset(p, -1, 16)
    srt.free(p)


def test_stream_host_func_in_order(dev, delay):
    s = srt.Stream(non_blocking=True)
    log = []
    n = 16
    p = s.malloc(n * 4)
    s.launch(fill, p, n, 1.0)
    host = np.zeros(n, np.float32)
    s.memcpy(host, p, n * 4)
    s.launch_host_func(lambda: log.append(float(host[0])))
    s.launch(fill, p, n, 2.0)
    s.launch_host_func(log.append, "x")
    sync(s)
    assert log == [1.0, "x"]
    s.free(p)
    sync(s)


def test_stream_launch_returns_immediately(dev):
    s = srt.Stream(non_blocking=True)
    g, p = held_fill(s, 7.0, grid=1, block=1)
    assert not s.query()
    assert srt.read(p, (4,), np.float32).tolist() == [0, 0, 0, 0]
    g.open()
    sync_after_race(s)      # the read above raced the held fill on purpose
    assert s.query() is True
    assert srt.read(p, (4,), np.float32).tolist() == [7, 7, 7, 7]
    srt.free(p)


def test_stream_kernel_ctx_attributes(dev):
    seen = {}

    @srt.kernel
    def k(ctx):
        seen.update(grid=ctx.grid, block=ctx.block, device=ctx.device, stream=ctx.stream)

    s = srt.Stream()
    s.launch(k, grid=4, block=32)
    sync(s)
    assert seen["device"] is dev and seen["stream"] is s
    assert seen["grid"] in (4, (4,), (4, 1, 1)) and seen["block"] in (32, (32,), (32, 1, 1))


def test_stream_readonly_view_not_writable(dev):
    @srt.kernel
    def k(ctx, p):
        v = ctx.array(p, (4,), np.float32, readonly=True)
        v[0] = 1

    s = srt.Stream()
    p = srt.malloc(16)
    s.launch(k, p)
    sync_error(s)
    srt.free(p)


def test_stream_destroy_pending_work_completes(dev):
    s = srt.Stream(non_blocking=True)
    g = Gate()
    g.hold(s)
    log = []
    s.launch_host_func(log.append, 1)
    s.destroy()
    g.open()
    sync(dev)
    assert log == [1]


def test_stream_launch_error_chained_and_usable(dev):
    class Boom(Exception):
        pass

    @srt.kernel
    def bad(ctx):
        raise Boom("x")

    s = srt.Stream()
    s.launch(bad)
    err = sync_error(s)
    assert isinstance(err.__cause__, Boom)
    assert isinstance(err, srt.StreamRTError)
    # stays usable
    p = srt.malloc(16)
    s.launch(fill, p, 4, 3.0)
    sync(s)
    assert srt.read(p, (4,), np.float32).tolist() == [3, 3, 3, 3]
    srt.free(p)


def test_stream_host_func_error_raised_at_sync(dev):
    def bad():
        raise KeyError("k")

    s = srt.Stream()
    s.launch_host_func(bad)
    assert isinstance(sync_error(s).__cause__, KeyError)
    sync(s)  # error is reported once


def test_stream_priority_accepted(dev):
    s = srt.Stream(priority=-1, non_blocking=True)
    s.launch_host_func(lambda: None)
    sync(s)


# ---- events --------------------------------------------------------------------------------

def test_event_record_returns_event_and_query(dev):
    s = srt.Stream(non_blocking=True)
    g = Gate()
    g.hold(s)
    e = s.record()
    assert isinstance(e, srt.Event)
    assert e.query() is False
    g.open()
    sync(e)
    assert e.query() is True
    e2 = srt.Event()
    assert s.record(e2) is e2


def test_event_elapsed_time(dev):
    s = srt.Stream()
    a, b = srt.Event(timing=True), srt.Event(timing=True)
    s.record(a)
    s.launch(fill, srt.malloc(4096), 1024, 1.0)
    s.record(b)
    sync(b)
    t = a.elapsed_time(b)
    assert isinstance(t, float) and t >= 0.0


def test_event_elapsed_time_needs_timing(dev):
    s = srt.Stream()
    a, b = srt.Event(), srt.Event()
    s.record(a)
    s.record(b)
    sync(s)
    with pytest.raises(srt.StreamRTError):
        a.elapsed_time(b)


def test_event_wait_on_unrecorded_event_is_noop(dev):
    s = srt.Stream(non_blocking=True)
    s.wait(srt.Event())
    s.launch_host_func(lambda: None)
    sync(s)


def test_event_cross_device(dev):
    s0 = srt.Stream(dev, non_blocking=True)
    s1 = srt.Stream(srt.Device("cpu:1"), non_blocking=True)
    assert_ordered(s0, s1, link=lambda: s1.wait(s0.record()))


# ---- sync helpers --------------------------------------------------------------------------

def test_sync_helpers_roundtrip(dev):
    p = srt.malloc(64)
    assert isinstance(p, int)
    srt.write(p, np.arange(16, dtype=np.float32))
    q = srt.malloc(64)
    srt.memcpy(q, p, 64)
    r = srt.read(q, (16,), np.float32)
    assert r.tolist() == list(range(16))
    r[0] = 99  # a copy, not a view
    assert srt.read(q, (1,), np.float32)[0] == 0
    srt.memset(q, 0, 64)
    assert srt.read(q, (16,), np.float32).sum() == 0
    host = np.zeros(16, np.float32)
    srt.memcpy(host, p, 64)
    assert host[5] == 5
    srt.free(p)
    srt.free(q)


def test_sync_memcpy_waits_for_stream_work(dev):
    # srt.memcpy is cudaMemcpy: legacy-default-stream semantics, ordered after blocking streams
    s = srt.Stream()
    g, p = held_fill(s, 4.0)
    out = np.zeros(4, np.float32)
    t = threading.Thread(target=srt.memcpy, args=(out, p, 16), daemon=True)
    t.start()
    g.open()
    t.join(20)
    assert not t.is_alive()
    assert out.tolist() == [4, 4, 4, 4]
    srt.free(p)


def test_malloc_host_as_copy_endpoint(dev):
    s = srt.Stream(non_blocking=True)
    hp = srt.malloc_host(64)
    assert isinstance(hp, int)
    d = s.malloc(64)
    d2 = s.malloc(64)
    s.memcpy(d, np.arange(16, dtype=np.float32), 64)
    s.memcpy(hp, d, 64)
    s.memcpy(d2, hp, 64)
    sync(s)
    assert srt.read(d2, (16,), np.float32).tolist() == list(range(16))
    s.free(d)
    s.free(d2)
    sync(s)
    srt.free_host(hp)


def test_free_invalid_pointer(dev):
    with pytest.raises(srt.StreamRTError):
        srt.free(0xDEAD00)
    p = srt.malloc(16)
    srt.free(p)
    with pytest.raises(srt.StreamRTError):
        srt.free(p)


def test_malloc_too_large_oom(dev):
    _, total = dev.memory_info()
    with pytest.raises(srt.OutOfMemoryError) as ei:
        srt.malloc(total * 4)
    assert isinstance(ei.value, MemoryError)


def test_launch_blocking_env():
    out = _sub(
        "import numpy as np, streamrt as srt\n"
        "log=[]\n"
        "s=srt.Stream(non_blocking=True)\n"
        "s.launch_host_func(log.append, 1)\n"
        "print(log)\n", STREAMRT_LAUNCH_BLOCKING="1")
    assert out == "[1]"


def test_delay_env_program_still_correct():
    out = _sub(
        "import numpy as np, streamrt as srt\n"
        "from tests.blackbox.conftest import scale\n"
        "a=srt.Stream(non_blocking=True); b=srt.Stream(non_blocking=True)\n"
        "p=srt.malloc(4096); a.memcpy(p, np.ones(1024,np.float32), 4096)\n"
        "a.launch(scale,p,1024,2.0); b.wait(a.record()); b.launch(scale,p,1024,5.0)\n"
        "o=np.empty(1024,np.float32); b.memcpy(o,p,4096); print(int(o.min()), int(o.max()))\n",
        STREAMRT_CPU_DELAY_US="500")
    assert out == "10 10"


def test_missing_wait_is_caught_by_delay(dev):
    # without the wait, a delayed producer makes the consumer read stale data
    from streamrt.backends import cpu

    cpu.set_delay_us(0)
    a, b = two_streams()
    g, p = held_fill(a, 1.0)
    out = np.zeros(4, np.float32)
    b.memcpy(out, p, 16)   # forgot b.wait(a.record())
    sync(b)
    g.open()
    sync_after_race(a)
    assert out.tolist() == [0, 0, 0, 0]
    srt.free(p)


# ---- errors (§6) ---------------------------------------------------------------------------

CAPTURE_CODES = {
    "CaptureUnsupportedError": (900, "cudaErrorStreamCaptureUnsupported"),
    "CaptureInvalidatedError": (901, "cudaErrorStreamCaptureInvalidated"),
    "CaptureMergeError": (902, "cudaErrorStreamCaptureMerge"),
    "CaptureUnmatchedError": (903, "cudaErrorStreamCaptureUnmatched"),
    "CaptureUnjoinedError": (904, "cudaErrorStreamCaptureUnjoined"),
    "CaptureIsolationError": (905, "cudaErrorStreamCaptureIsolation"),
    "CaptureImplicitError": (906, "cudaErrorStreamCaptureImplicit"),
    "CapturedEventError": (907, "cudaErrorCapturedEvent"),
    "CaptureWrongThreadError": (908, "cudaErrorStreamCaptureWrongThread"),
    "GraphExecUpdateError": (910, "cudaErrorGraphExecUpdateFailure"),
}


@pytest.mark.parametrize("cls", sorted(CAPTURE_CODES))
def test_errors_capture_codes_names(cls):
    c = getattr(srt, cls)
    code, name = CAPTURE_CODES[cls]
    assert issubclass(c, srt.StreamRTError)
    assert c.code == code and c.name == name
    if cls.startswith("Capture") and cls != "CaptureError" or cls == "CapturedEventError":
        assert issubclass(c, srt.CaptureError)


def test_errors_base_classes():
    assert issubclass(srt.OutOfMemoryError, MemoryError)
    assert issubclass(srt.InvalidValueError, ValueError)
    assert srt.OutOfMemoryError.code == 2 and srt.OutOfMemoryError.name == "cudaErrorMemoryAllocation"
    assert srt.InvalidValueError.code == 1 and srt.InvalidValueError.name == "cudaErrorInvalidValue"
    assert srt.NotReadyError.code == 600 and srt.NotReadyError.name == "cudaErrorNotReady"
    for n in ("OutOfMemoryError", "InvalidValueError", "InvalidAddressError", "NotReadyError",
              "CaptureError", "GraphExecUpdateError", "ExecutorError", "SanitizerError",
              "LaunchError", "BackendUnavailableError"):
        c = getattr(srt, n)
        assert issubclass(c, srt.StreamRTError), n
        assert isinstance(c.name, str) and c.name, n
        assert hasattr(c, "code"), n


def test_errors_attrs_on_instances():
    e = srt.CaptureUnsupportedError("x")
    assert e.code == 900 and e.name == "cudaErrorStreamCaptureUnsupported"
    assert srt.ExecutorError("x").code == srt.ExecutorError.code


def test_errors_backend_unavailable_says_what():
    try:
        d = srt.Device("cuda:0")
    except srt.BackendUnavailableError as e:
        assert str(e)
    else:
        assert d.backend == "cuda"


def test_all_exports():
    for n in ("Device", "current_device", "device_count", "Stream", "current_stream", "Event",
              "kernel", "malloc", "free", "malloc_host", "free_host", "memcpy", "memset", "read",
              "write", "MemPool", "MemPoolAttr", "TensorDesc", "Tensor", "CaptureMode",
              "CaptureStatus", "CaptureInfo", "Graph", "GraphExec", "NodeType",
              "GraphExecUpdateResult", "graph_capture", "sanitizer", "trace"):
        assert hasattr(srt, n), n
    assert set(srt.__all__) >= {"Device", "Stream", "MemPool", "Graph"}
