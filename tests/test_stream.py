"""Streams: enqueue calls, ordering, host synchronization, destroy, current stream, failures."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt
from streamrt.stream import set_launch_blocking

from .conftest import BAD_ACCESS, PY_KERNELS, add_one_kernel, copy_kernel, cpu_only, fill_kernel, no_sanitizer


@pytest.fixture
def dev(any_dev):
    """Each backend's device 0: streams are a contract of every backend."""
    return any_dev


@pytest.fixture
def s(dev):
    st = srt.Stream(dev, non_blocking=True)
    yield st
    if not st._destroyed:
        st.synchronize()


def test_stream_launch_returns_before_work_runs(s, gate):
    p = s.malloc(64)
    g = gate(s)
    s.launch(fill_kernel, p, 16, 3.0)
    assert not s.query()  # the gate holds the stream: launch returned at once
    g.open()
    s.synchronize()
    assert s.query()
    assert srt.read(p, (16,), np.float32).tolist() == [3.0] * 16
    s.free(p)


def test_stream_runs_in_order(s, delay):
    n = 64
    p = s.malloc(n * 4)
    s.launch(fill_kernel, p, n, 0.0)
    for _ in range(20):
        s.launch(add_one_kernel, p, n)
    out = np.empty(n, np.float32)
    s.memcpy(out, p, n * 4)
    assert out.tolist() == [20.0] * n
    s.free(p)


def test_stream_kernel_context(s):
    cpu_only(s.device, PY_KERNELS)
    seen = {}

    @srt.kernel
    def probe(ctx, tag):
        seen[tag] = (ctx.grid, ctx.block, ctx.device, ctx.stream)

    s.launch(probe, "a", grid=(4, 2), block=128)
    s.launch(probe, "b")
    s.synchronize()
    assert seen["a"] == ((4, 2, 1), (128, 1, 1), s.device, s)
    assert seen["a"][0].x == 4 and seen["a"][1].y == 1
    assert seen["b"][:2] == ((1, 1, 1), (1, 1, 1))


@pytest.mark.parametrize(("grid", "err"), [
    (0, srt.InvalidValueError), (-1, srt.InvalidValueError), ((1, 2, 3, 4), srt.InvalidTypeError),
    (1.5, srt.InvalidTypeError), ((2, "x"), srt.InvalidTypeError),
])
def test_stream_launch_bad_dims(s, grid, err):
    with pytest.raises(err):
        s.launch(fill_kernel, 0, 0, 0.0, grid=grid)
    with pytest.raises(err):
        s.launch(fill_kernel, 0, 0, 0.0, block=grid)
    assert s._pos == 0  # nothing enqueued


@pytest.mark.parametrize(("grid", "block"), [
    (2**31, 1), ((1, 65536), 1), ((1, 1, 65536), 1), (1, 1025), (1, (1, 1025)), (1, (1, 1, 65)),
    (1, (32, 32, 2)), (1, (16, 16, 8)),
])
def test_stream_launch_past_cuda_limits_is_refused_on_every_backend(s, grid, block):
    # a launch the cpu backend ran would fail on a GPU (cudaErrorInvalidConfiguration)
    with pytest.raises(srt.InvalidValueError, match="CUDA's limits"):
        s.launch(fill_kernel, 0, 0, 0.0, grid=grid, block=block)
    g = srt.Graph()
    with pytest.raises(srt.InvalidValueError, match="CUDA's limits"):
        g.add_kernel_node(fill_kernel, 0, 0, 0.0, grid=grid, block=block)
    assert s._pos == 0 and g.nodes() == []
    g.add_kernel_node(fill_kernel, 0, 0, 0.0, grid=(2**31 - 1, 65535, 65535), block=(8, 8, 16))
    p = s.malloc(4)
    s.launch(fill_kernel, p, 1, 2.0, block=(8, 8, 16))  # the limits themselves are launches
    s.synchronize()
    assert srt.read(p, (1,), np.float32)[0] == 2.0
    s.free(p)


def test_stream_launch_grid_accepted_before_is_still_checked_as_a_block(s):
    # the normalised-dims cache was shared by grids and blocks: a grid of 2048 cached first let
    # a block of 2048 through (2048 threads: cudaErrorInvalidConfiguration on a GPU)
    p = s.malloc(4)
    s.launch(fill_kernel, p, 1, 1.0, grid=2048)
    s.launch(fill_kernel, p, 1, 1.0, grid=(4096, 2))
    with pytest.raises(srt.InvalidValueError, match="CUDA's limits"):
        s.launch(fill_kernel, p, 1, 1.0, block=2048)
    with pytest.raises(srt.InvalidValueError, match="CUDA's limits"):
        srt.Graph().add_kernel_node(fill_kernel, p, 1, 1.0, block=(4096, 2))
    s.synchronize()
    s.free(p)


def test_stream_launch_needs_a_kernel(s):
    with pytest.raises(srt.InvalidTypeError):
        s.launch(lambda ctx: None)
    with pytest.raises(srt.InvalidTypeError):
        srt.kernel(42)


def test_stream_kernel_array_is_bounds_checked(s):
    cpu_only(s.device, PY_KERNELS)
    no_sanitizer(BAD_ACCESS)
    # a kernel view is checked against its allocation when the kernel runs (pool blocks are
    # checked by the sanitizer, which knows their stream-ordered lifetimes)
    p = srt.malloc(100)  # rounded to 512 bytes

    @srt.kernel
    def overrun(ctx, ptr):
        ctx.array(ptr, (1000,), np.float32)[:] = 1.0

    s.launch(overrun, p)
    with pytest.raises(srt.LaunchError) as info:
        s.synchronize()
    assert isinstance(info.value.__cause__, srt.InvalidAddressError)
    assert "overrun" in str(info.value) and s.name in str(info.value)
    assert srt.read(p, (128,), np.float32).tolist() == [0.0] * 128  # nothing written
    srt.free(p)


def test_stream_kernel_array_readonly_and_interior_pointer(s):
    cpu_only(s.device, PY_KERNELS)
    p = s.malloc(64)
    s.synchronize()  # srt.write copies on the legacy stream: after the stream-ordered malloc
    srt.write(p, np.arange(16, dtype=np.float32))

    @srt.kernel
    def k(ctx, ptr, out):
        view = ctx.array(ptr + 8, (2,), np.float32, readonly=True)  # pointer arithmetic
        out.append(view.copy())
        view[0] = 5.0  # read-only: raises

    got = []
    s.launch(k, p, got)
    with pytest.raises(srt.LaunchError) as info:
        s.synchronize()
    assert isinstance(info.value.__cause__, ValueError)
    assert got[0].tolist() == [2.0, 3.0]
    assert srt.read(p, (16,), np.float32)[2] == 2.0
    s.free(p)


def test_stream_kernel_array_bad_pointer_types(s):
    cpu_only(s.device, PY_KERNELS)
    no_sanitizer(BAD_ACCESS)
    errors = []

    @srt.kernel
    def k(ctx, ptr):
        try:
            ctx.array(ptr, (1,), np.float32)
        except srt.StreamRTError as e:
            errors.append(type(e))

    for bad in (1.5, None, "0x10", 12345):
        s.launch(k, bad)
    s.synchronize()
    assert errors == [srt.InvalidTypeError] * 3 + [srt.InvalidAddressError]


def test_stream_failures_are_reported_once_and_runtime_stays_usable(s):
    cpu_only(s.device, PY_KERNELS)
    @srt.kernel
    def boom(ctx):
        raise RuntimeError("kaboom")

    ran = []
    s.launch(boom)
    s.launch_host_func(ran.append, 1)  # later work still runs
    with pytest.raises(srt.LaunchError, match="kaboom") as info:
        s.synchronize()
    assert isinstance(info.value.__cause__, RuntimeError)
    assert "boom" in str(info.value)
    assert ran == [1]
    s.synchronize()  # reported once
    s.launch_host_func(ran.append, 2)
    s.synchronize()
    assert ran == [1, 2]


def test_stream_host_func_failure_reported_by_event_and_device(dev):
    s = srt.Stream(dev, non_blocking=True)

    def bad():
        raise KeyError("host")

    s.launch_host_func(bad)
    e = s.record()
    with pytest.raises(srt.LaunchError, match="bad"):
        e.synchronize()
    s.launch_host_func(bad)
    with pytest.raises(srt.LaunchError):
        dev.synchronize()


@pytest.mark.parametrize("wait", ["its stream", "its device", "an event behind it",
                                  "a stream waiting behind it", "the legacy stream"])
def test_stream_host_func_waiting_behind_itself_is_refused(dev, wait):
    # a host function synchronizing its own stream waited for itself: the process hung for good
    s = srt.Stream(dev, non_blocking=wait != "the legacy stream")  # blocking: legacy-ordered
    later = srt.Event(dev)
    other = srt.Stream(dev, non_blocking=True)
    ran: list[int] = []
    call = {"its stream": s.synchronize, "its device": dev.synchronize,
            "an event behind it": later.synchronize, "a stream waiting behind it":
            other.synchronize, "the legacy stream": dev.default_stream.synchronize}[wait]
    go = threading.Event()
    s.launch_host_func(go.wait, 30)  # the waiting host function runs once all is enqueued
    s.launch_host_func(lambda: (s.record(later), call()) if wait == "an event behind it"
                       else call())
    if wait == "a stream waiting behind it":
        other.wait(s.record())  # other waits for the host function
    elif wait == "the legacy stream":
        dev.default_stream.launch_host_func(ran.append, 0)  # behind blocking s: legacy order
    s.launch_host_func(ran.append, 1)
    go.set()
    with pytest.raises(srt.LaunchError) as info:
        s.synchronize()
    assert isinstance(info.value.__cause__, srt.NotPermittedError)
    assert info.value.__cause__.code == 800 and 1 in ran
    s.launch_host_func(ran.append, 2)  # the stream goes on
    s.synchronize()
    dev.synchronize()
    assert sorted(ran) == ([0, 1, 2] if wait == "the legacy stream" else [1, 2])


def test_stream_graph_host_node_waiting_is_refused(dev):
    # a graph's host node synchronizing (on cpu it may run on a replay worker thread) hung too
    s = srt.Stream(dev, non_blocking=True)
    g = srt.Graph()
    a = g.add_empty_node()
    g.add_host_node(s.synchronize, deps=[a])
    g.add_host_node(lambda: None, deps=[a])  # a second branch: a parallel replay on cpu
    ge = g.instantiate()
    ge.launch(s)
    with pytest.raises(srt.LaunchError) as info:
        s.synchronize()
    assert isinstance(info.value.__cause__, srt.NotPermittedError)
    ge.destroy()


def test_stream_host_func_waiting_for_finished_work_is_allowed(dev):
    # on cuda, a host function synchronizing an event whose work had finished raised
    # NotPermittedError when no one had queried its stream since (a stale completion count)
    a, b = srt.Stream(dev, non_blocking=True), srt.Stream(dev, non_blocking=True)
    p = b.malloc(16)
    b.memset(p, 0, 16)
    ev = b.record()
    a.wait(ev)  # b's work is complete when the host function runs; nothing asked b since
    ran: list[int] = []
    a.launch_host_func(lambda: (ev.synchronize(), ran.append(1)))
    a.synchronize()
    assert ran == [1]
    b.free(p)
    b.synchronize()


def test_stream_failure_seen_through_wait(dev):
    cpu_only(dev, PY_KERNELS)
    a, b = srt.Stream(dev, non_blocking=True), srt.Stream(dev, non_blocking=True)

    @srt.kernel
    def boom(ctx):
        raise RuntimeError("upstream")

    a.launch(boom)
    b.wait(a.record())
    with pytest.raises(srt.LaunchError, match="upstream"):
        b.synchronize()  # b's synchronize covers a's failed kernel


def test_stream_memcpy_every_direction(dev):
    s = srt.Stream(dev, non_blocking=True)
    if srt.device_count(dev.backend) < 2:
        pytest.skip(f"needs two {dev.backend} devices")
    d0 = srt.Device(f"{dev.backend}:0")
    d1 = srt.Device(f"{dev.backend}:1")
    src = np.arange(64, dtype=np.uint8)
    a = srt.malloc(64, device=d0)
    b = srt.malloc(64, device=d1)
    h = srt.malloc_host(64)
    s.memcpy(a, src, 64)  # host -> device
    s.memcpy(b, a, 64)  # peer copy
    s.memcpy(h, b, 64)  # device -> pinned host
    out = bytearray(64)
    s.memcpy(out, h, 64)  # pinned -> pageable (synchronous)
    assert bytes(out) == src.tobytes()
    mv = memoryview(bytearray(32))
    s.memcpy(mv, a + 32, 32)  # interior pointer, memoryview destination
    assert bytes(mv) == bytes(range(32, 64))
    s.memcpy(a, b"\x09" * 8, 8)  # bytes source
    s.synchronize()  # s is non-blocking: srt.read (legacy stream) is not ordered after it
    assert srt.read(a, (8,), np.uint8).tolist() == [9] * 8
    for p in (a, b):
        srt.free(p)
    srt.free_host(h)


def test_stream_memcpy_pageable_source_taken_at_call_time(s, gate):
    p = s.malloc(16)
    g = gate(s)
    host = np.full(4, 1.0, np.float32)
    s.memcpy(p, host, 16)
    host[:] = 2.0  # after the call: must not affect the queued copy (CUDA stages pageable H2D)
    g.open()
    s.synchronize()
    assert srt.read(p, (4,), np.float32).tolist() == [1.0] * 4
    s.free(p)


def test_stream_memcpy_pinned_is_asynchronous(s, gate):
    p = s.malloc(16)
    h = srt.malloc_host(16)
    srt.write(h, np.full(4, 1.0, np.float32))
    g = gate(s)
    s.memcpy(p, h, 16)
    srt.write(h, np.full(4, 2.0, np.float32))  # pinned: the copy reads it when it runs
    g.open()
    s.synchronize()
    assert srt.read(p, (4,), np.float32).tolist() == [2.0] * 4
    s.free(p)
    srt.free_host(h)


@pytest.mark.parametrize("bad", ["oob_dst", "oob_src", "unknown", "negative", "short_host",
                                 "readonly_host", "float_ptr", "noncontig", "freed"])
def test_stream_memcpy_bad_input_writes_nothing(s, bad):
    p = s.malloc(512)
    s.memset(p, 0xAB, 512)
    s.synchronize()
    q = srt.malloc(512)
    srt.free(q)
    host = np.zeros(1024, np.uint8)
    cases = {
        "oob_dst": (srt.InvalidAddressError, lambda: s.memcpy(p + 256, host, 512)),
        "oob_src": (srt.InvalidAddressError, lambda: s.memcpy(host, p + 1, 512)),
        "unknown": (srt.InvalidAddressError, lambda: s.memcpy(12345, host, 4)),
        "negative": (srt.InvalidValueError, lambda: s.memcpy(p, host, -1)),
        "short_host": (srt.InvalidValueError, lambda: s.memcpy(p, host[:10], 512)),
        "readonly_host": (srt.InvalidValueError, lambda: s.memcpy(b"x" * 512, p, 512)),
        "float_ptr": (srt.InvalidTypeError, lambda: s.memcpy(p, 3.5, 4)),
        "noncontig": (srt.InvalidValueError, lambda: s.memcpy(p, host[::2], 4)),
        "freed": (srt.InvalidAddressError, lambda: s.memcpy(q, host, 4)),
    }
    err, call = cases[bad]
    pos = s._pos
    with pytest.raises(err):
        call()
    assert s._pos == pos  # nothing enqueued
    s.synchronize()
    assert srt.read(p, (512,), np.uint8).tolist() == [0xAB] * 512
    s.free(p)


def test_stream_memset(s):
    p = s.malloc(1024)
    s.memset(p, 255, 1024)
    s.memset(p + 512, 1, 16)
    s.synchronize()  # s is non-blocking: the legacy stream (srt.read) is not ordered after it
    out = srt.read(p, (1024,), np.uint8)
    assert out[:512].tolist() == [255] * 512 and out[512:528].tolist() == [1] * 16
    for value, err in ((256, srt.InvalidValueError), (-1, srt.InvalidValueError),
                       (1.0, srt.InvalidTypeError)):
        with pytest.raises(err):
            s.memset(p, value, 4)
    with pytest.raises(srt.InvalidAddressError):
        s.memset(p + 1000, 0, 100)
    assert srt.read(p + 1000, (24,), np.uint8).tolist() == [255] * 24
    s.free(p)


def test_stream_host_func_args_and_type(s):
    got = []
    s.launch_host_func(got.extend, (1, 2))
    s.synchronize()
    assert got == [1, 2]
    with pytest.raises(srt.InvalidTypeError):
        s.launch_host_func(42)


def test_stream_destroy_completes_pending_work(dev, gate):
    s = srt.Stream(dev, non_blocking=True)
    done = threading.Event()
    g = gate(s)
    s.launch_host_func(done.set)
    s.destroy()
    with pytest.raises(srt.InvalidHandleError):
        s.launch_host_func(done.set)
    with pytest.raises(srt.InvalidHandleError):
        s.destroy()
    with pytest.raises(srt.InvalidHandleError):
        s.synchronize()
    g.open()
    dev.synchronize()  # the device still waits for the destroyed stream's work
    assert done.is_set()


def test_stream_legacy_default_stream_cannot_be_destroyed(dev):
    with pytest.raises(srt.InvalidHandleError):
        dev.default_stream.destroy()


def test_stream_current_stream_context(dev):
    s1 = srt.Stream(dev)
    assert srt.current_stream() is srt.current_device().default_stream
    with s1:
        assert srt.current_stream() is s1
        p = srt.malloc(16)
        srt.memset(p, 3, 16)  # the synchronous helpers use the current stream
        assert s1._pos > 0
    assert srt.current_stream() is srt.current_device().default_stream
    srt.free(p)


def test_stream_context_is_per_device_and_makes_its_device_current():
    # as torch.cuda.stream: entering a stream of another device switched neither the current
    # device (srt.malloc went to the old one) nor, inside `with other_device:`, the stream
    d0, d1 = srt.Device("cpu:0"), srt.Device("cpu:1")
    with d0:
        s1 = srt.Stream(d1, non_blocking=True)
        with s1:
            assert srt.current_device() is d1 and srt.current_stream() is s1
            p = srt.malloc(16)
            assert srt.pool.device_of(p) is d1
            with d0:  # another device: its own current stream
                assert srt.current_stream() is d0.default_stream
                s0 = srt.Stream(d0, non_blocking=True)
                with s0, d1:  # and back: s1 is still d1's current stream
                    assert srt.current_stream() is s1
                assert srt.current_stream() is d0.default_stream
            assert srt.current_stream() is s1
        assert srt.current_device() is d0 and srt.current_stream() is d0.default_stream
        srt.free(p)


def test_stream_constructor_validation(dev):
    with pytest.raises(srt.InvalidTypeError):
        srt.Stream(dev, priority="high")
    with pytest.raises(srt.InvalidTypeError):
        srt.Stream(dev, non_blocking=1)
    assert srt.Stream(dev, priority=-100).priority == -5  # clamped, as CUDA does
    assert srt.Stream(dev, priority=7).priority == 0


def test_stream_launch_blocking(s, dev):
    ran = []
    prev = set_launch_blocking(True)
    try:
        s.launch_host_func(ran.append, 1)
        assert ran == [1]  # synchronous: done when the call returns
        p = srt.malloc(16)
        s.launch(fill_kernel, p, 4, 2.0)
        assert s.query()
    finally:
        set_launch_blocking(prev)
    srt.free(p)


def test_stream_launch_blocking_env():
    import os
    import subprocess
    import sys

    code = (
        "import streamrt as srt\nran=[]\ns=srt.Stream(non_blocking=True)\n"
        "s.launch_host_func(ran.append, 1)\nprint(ran)\n"
    )
    env = dict(os.environ, STREAMRT_LAUNCH_BLOCKING="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[1]"


def test_stream_legacy_default_orders_blocking_streams(dev, gate, delay):
    legacy = dev.default_stream
    b = srt.Stream(dev)  # blocking
    nb = srt.Stream(dev, non_blocking=True)
    n = 16
    p = srt.malloc(n * 4)
    q = srt.malloc(n * 4)  # before the gate: on a GPU cudaMalloc may wait for the device
    g = gate(legacy)
    legacy.launch(fill_kernel, p, n, 5.0)
    b.launch(add_one_kernel, p, n)  # implicitly after the legacy stream's work
    out = np.empty(n, np.float32)
    nb.launch(fill_kernel, q, n, 9.0)  # non-blocking: not held by the legacy stream
    nb.synchronize()
    assert not b.query()
    g.open()
    b.synchronize()
    b.memcpy(out, p, n * 4)
    assert out.tolist() == [6.0] * n
    # and the other way round: legacy waits for blocking streams
    g2 = gate(b)
    b.launch(fill_kernel, p, n, 1.0)
    legacy.launch(add_one_kernel, p, n)
    assert not legacy.query()
    g2.open()
    legacy.synchronize()
    assert srt.read(p, (n,), np.float32).tolist() == [2.0] * n
    srt.free(p)
    srt.free(q)


def test_stream_wait_makes_the_consumer_wait(dev, gate):
    prod, cons = srt.Stream(dev, non_blocking=True), srt.Stream(dev, non_blocking=True)
    n = 32
    a, b = srt.malloc(n * 4), srt.malloc(n * 4)
    g = gate(prod)
    prod.launch(fill_kernel, a, n, 7.0)
    cons.wait(prod.record())
    cons.launch(copy_kernel, b, a, n)
    assert not cons.query()  # held by the gate on the producer
    g.open()
    cons.synchronize()
    assert srt.read(b, (n,), np.float32).tolist() == [7.0] * n
    srt.free(a)
    srt.free(b)


def test_stream_wait_already_ordered_enqueues_nothing(dev):
    a, b = srt.Stream(dev, non_blocking=True), srt.Stream(dev, non_blocking=True)
    a.launch_host_func(list)
    e = a.record()
    b.wait(e)
    pos = b._pos
    b.wait(e)  # the clock already covers it
    b.wait(srt.Event(dev))  # never recorded: a no-op
    b.wait(b.record())  # own event: nothing to do
    assert b._pos == pos
    with pytest.raises(srt.InvalidTypeError):
        b.wait("event")


def test_stream_query_is_false_while_its_last_operation_is_pending(s, gate):
    # the gate is the stream's only operation: an off-by-one in query() would call it done
    g = gate(s)
    assert not s.query()
    g.open()
    s.synchronize()
    assert s.query()


def test_stream_non_blocking_is_not_ordered_with_the_legacy_stream(dev, gate):
    # cudaStreamNonBlocking: no implicit synchronization with the legacy stream, either way.
    # One side is held by a gate while the other's host function must still run; the bounded
    # wait only limits how long a wrong (ordered) runtime takes to fail, it orders nothing.
    legacy, nb = dev.default_stream, srt.Stream(dev, non_blocking=True)
    for held, other, what in ((legacy, nb, "the non-blocking stream waited for the legacy stream"),
                              (nb, legacy, "the legacy stream waited for a non-blocking stream")):
        g = gate(held)
        ran = threading.Event()
        other.launch_host_func(ran.set)
        assert ran.wait(timeout=20), what
        g.open()
        held.synchronize()


def test_stream_record_on_blocking_or_legacy_stream_covers_the_other_side(dev, gate):
    # a record is an action: on a blocking stream it comes after earlier legacy work, on the
    # legacy stream after earlier blocking work, so waiting on the event orders a third,
    # non-blocking stream after that work too (CUDA legacy default stream semantics)
    legacy, b = dev.default_stream, srt.Stream(dev)
    nb = srt.Stream(dev, non_blocking=True)
    n = 16
    p, q = srt.malloc(n * 4), srt.malloc(n * 4)
    for src, dst, value in ((legacy, b, 3.0), (b, legacy, 4.0)):
        g = gate(src)
        src.launch(fill_kernel, p, n, value)
        e = dst.record()  # dst has no work of its own after the gate: only the implicit wait
        assert not e.query()  # the event stands for src's gated work
        nb.wait(e)
        nb.launch(copy_kernel, q, p, n)
        g.open()
        e.synchronize()
        nb.synchronize()
        assert srt.read(q, (n,), np.float32).tolist() == [value] * n
    srt.free(p)
    srt.free(q)


def test_stream_failure_is_reported_only_by_a_synchronize_covering_it(dev):
    s = srt.Stream(dev, non_blocking=True)
    s.launch_host_func(list)
    before = s.record()

    def bad():
        raise KeyError("later")

    s.launch_host_func(bad)
    ran = threading.Event()
    s.launch_host_func(ran.set)
    assert ran.wait(timeout=60)  # in stream order: the failure has happened
    # the event marks work before the failure, and the failure is s's, not another stream's
    before.synchronize()
    other = srt.Stream(dev, non_blocking=True)
    other.launch_host_func(list)
    other.synchronize()
    with pytest.raises(srt.LaunchError, match="later"):
        s.synchronize()
