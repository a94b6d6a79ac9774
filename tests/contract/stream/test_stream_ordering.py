"""Stream order on every backend: streams, events, the legacy default stream, host functions."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt
from tests.conftest import add_one_kernel, copy_kernel, delayed, fill_kernel
from tests.contract.backend_kernels import _dev_f32, add_one


def test_ordering_producer_consumer_chain_with_delays(dev):
    # three streams pass a buffer along; with random delays, a missing wait corrupts the result
    n = 256
    streams = [srt.Stream(dev, non_blocking=True) for _ in range(3)]
    bufs = [srt.malloc(n * 4) for _ in range(3)]
    with delayed(300):
        streams[0].launch(fill_kernel, bufs[0], n, 1.0)
        for step in range(12):
            src, dst = step % 3, (step + 1) % 3
            e = streams[src].record()
            streams[dst].wait(e)
            streams[dst].launch(copy_kernel, bufs[dst], bufs[src], n)
            streams[dst].launch(add_one_kernel, bufs[dst], n)
        last = streams[12 % 3]
        out = np.empty(n, np.float32)
        last.memcpy(out, bufs[12 % 3], n * 4)
    assert out.tolist() == [13.0] * n
    dev.synchronize()
    for b in bufs:
        srt.free(b)


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


def test_backend_event_wait_orders_streams(bdev, gate):
    s1, s2 = srt.Stream(bdev, non_blocking=True), srt.Stream(bdev, non_blocking=True)
    n = 256
    src, dst = _dev_f32(bdev, np.zeros(n)), _dev_f32(bdev, np.zeros(n))
    g = gate(s1)
    s1.launch(add_one, src, n, grid=1, block=256)
    e = s1.record()
    assert not e.query() and not s1.query()
    s2.wait(e)
    s2.memcpy(dst, src, 4 * n)  # must see add_one's result: it waits for the gate
    assert not s2.query()
    g.open()
    s2.synchronize()
    assert e.query()
    assert np.array_equal(srt.read(dst, (n,), np.float32), np.ones(n, np.float32))
    for p in (src, dst):
        srt.free(p)


def test_backend_host_functions_run_in_stream_order(bdev, gate):
    s = srt.Stream(bdev, non_blocking=True)
    seen: list[int] = []
    g = gate(s)
    for i in range(5):
        s.launch_host_func(seen.append, i)
    done = s.record()
    assert not done.query()
    assert seen == []  # the gate holds them back
    g.open()
    done.synchronize()
    assert seen == [0, 1, 2, 3, 4]


def test_backend_blocking_stream_follows_legacy_default_stream(bdev, gate):
    legacy = bdev.default_stream
    blocking = srt.Stream(bdev)  # implicitly ordered after the legacy stream
    g = gate(legacy)
    blocking.launch_host_func(lambda: None)
    assert not blocking.query()
    g.open()
    blocking.synchronize()
    assert legacy.query()
