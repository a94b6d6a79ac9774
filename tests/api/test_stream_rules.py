"""API.md §2, DESIGN §2: streams (ordering, copies, host functions, kernels, destroy, failures,
launch blocking and delay injection)."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt

from .conftest import (
    Gate,
    _sub,
    assert_not_ordered,
    assert_ordered,
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

pytestmark = [pytest.mark.api, pytest.mark.timeout(60)]


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
        "from tests.api.conftest import scale\n"
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


def test_stream_destroyed_use_raises(dev):
    s = srt.Stream(non_blocking=True)
    s.destroy()
    with pytest.raises(srt.StreamRTError):
        s.launch_host_func(lambda: None)


@pytest.mark.parametrize("call", [
    "is_capturing", "capture_info", "end_capture", "update_capture_dependencies", "query",
    "synchronize", "record", "begin_capture"])
def test_stream_destroyed_capture_queries_refuse_the_handle(dev, call):
    # cudaStreamIsCapturing and cudaStreamEndCapture of a destroyed stream: an invalid handle,
    # not "not capturing" (False, or IllegalStateError from end_capture)
    s = srt.Stream(non_blocking=True)
    s.destroy()
    args = ([],) if call == "update_capture_dependencies" else ()
    with pytest.raises(srt.InvalidHandleError, match="destroyed"):
        getattr(s, call)(*args)


def test_kernel_view_out_of_allocation_fails_launch(dev):
    s = srt.Stream()
    p = srt.malloc(16)
    s.launch(fill, p, 1 << 20, 1.0)
    if srt.sanitizer.enabled():      # a STREAMRT_SANITIZE run: the bad access is its finding
        assert "bound" in str(sync_error(s, srt.SanitizerError).kind).lower()
    else:
        sync_error(s)
    srt.free(p)
