"""Events: record, wait, query, synchronize, elapsed time, and their errors (every backend)."""

from __future__ import annotations

import threading

import pytest

import streamrt as srt


@pytest.fixture
def dev(any_dev):
    """Device 0 of each backend: events are a contract of every backend."""
    return any_dev


@pytest.fixture
def s(dev):
    return srt.Stream(dev, non_blocking=True)


def test_event_unrecorded_is_complete(dev):
    e = srt.Event(dev)
    assert e.query()
    e.synchronize()  # returns at once


def test_event_query_and_synchronize(s, gate):
    g = gate(s)
    ran = []
    s.launch_host_func(ran.append, 1)
    e = s.record()
    assert isinstance(e, srt.Event) and not e.query()
    g.open()
    e.synchronize()
    assert e.query() and ran == [1]


def test_event_record_marks_only_earlier_work(s, gate):
    e = s.record()
    g = gate(s)  # enqueued after the record
    assert e.query()
    e.synchronize()  # must not wait for the gate
    g.open()


def test_event_rerecord_moves_the_marker(s, gate):
    e = srt.Event(s.device)
    s.record(e)
    assert e.query()
    g = gate(s)
    s.record(e)
    assert not e.query()
    g.open()
    e.synchronize()
    assert e.query()


def test_event_wait_follows_that_event_not_an_earlier_one(s, gate):
    # two records on one stream with pending work between them: a wait for the later one must
    # not be satisfied by the earlier one, which has completed (a backend marks each record)
    t = srt.Stream(s.device, non_blocking=True)
    early = s.record()
    g = gate(s)
    late = s.record()
    t.wait(late)
    assert early.query() and not late.query()
    assert not t.record().query()  # t is held by the gate
    g.open()
    t.synchronize()
    assert late.query()


def test_event_wait_snapshot_at_call_time(dev, gate):
    # cudaStreamWaitEvent uses the record current at the call; a later re-record does not matter
    a, b = srt.Stream(dev, non_blocking=True), srt.Stream(dev, non_blocking=True)
    a.launch_host_func(list)  # a record of an empty stream is complete: b.wait would do nothing
    e = a.record()
    b.wait(e)
    g = gate(a)
    a.record(e)
    ran = threading.Event()
    b.launch_host_func(ran.set)
    # a wait that followed the re-record would hold b on the gate; the bounded wait only limits
    # how long that takes to fail (a plain b.synchronize() would pass once the gate timed out)
    assert ran.wait(timeout=20), "the wait followed the event's later re-record"
    g.open()
    b.synchronize()


def test_event_elapsed_time(s):
    start, stop = srt.Event(s.device, timing=True), srt.Event(s.device, timing=True)
    s.record(start)
    s.launch_host_func(sum, range(10000))
    s.record(stop)
    stop.synchronize()
    ms = start.elapsed_time(stop)
    assert isinstance(ms, float) and ms >= 0.0
    assert stop.elapsed_time(start) == pytest.approx(-ms)


def test_event_elapsed_time_errors(s, gate):
    timing = srt.Event(s.device, timing=True)
    plain = srt.Event(s.device)
    s.record(timing)
    s.record(plain)
    s.synchronize()
    with pytest.raises(srt.InvalidHandleError, match="timing"):
        timing.elapsed_time(plain)  # non-timing event
    with pytest.raises(srt.InvalidHandleError, match="recorded"):
        timing.elapsed_time(srt.Event(s.device, timing=True))  # never recorded
    g = gate(s)
    late = s.record(srt.Event(s.device, timing=True))
    with pytest.raises(srt.NotReadyError):
        timing.elapsed_time(late)
    g.open()
    late.synchronize()
    assert timing.elapsed_time(late) >= 0
    with pytest.raises(srt.InvalidTypeError):
        timing.elapsed_time(None)


def test_event_other_device_and_bad_types(dev):
    s = srt.Stream(dev, non_blocking=True)
    e1 = srt.Event("cpu:1")
    with pytest.raises(srt.InvalidHandleError):
        s.record(e1)
    with pytest.raises(srt.InvalidTypeError):
        s.record("e")
    with pytest.raises(srt.InvalidTypeError):
        srt.Event(dev, timing="yes")
    # two devices' events measure nothing together (cpu:1's clock was read against cpu:0's)
    t0 = s.record(srt.Event(dev, timing=True))
    s1 = srt.Stream("cpu:1", non_blocking=True)
    t1 = s1.record(srt.Event("cpu:1", timing=True))
    s.synchronize()
    s1.synchronize()
    with pytest.raises(srt.InvalidHandleError, match="two devices"):
        t0.elapsed_time(t1)


def test_event_cross_device_wait(gate):
    a = srt.Stream("cpu:0", non_blocking=True)
    b = srt.Stream("cpu:1", non_blocking=True)
    g = gate(a)
    e = a.record()
    b.wait(e)  # waiting on another device's event is allowed, as in CUDA
    ran = []
    b.launch_host_func(ran.append, 1)
    assert not b.query()
    g.open()
    b.synchronize()
    assert ran == [1]


def test_event_destroy(dev):
    e = srt.Event(dev)
    e.destroy()
    for call in (e.query, e.synchronize, e.destroy):
        with pytest.raises(srt.InvalidHandleError):
            call()
    with pytest.raises(srt.InvalidHandleError):
        srt.Stream(dev).record(e)


def test_backend_timing_events(bdev, gate):
    s = srt.Stream(bdev, non_blocking=True)
    start = srt.Event(bdev, timing=True)
    end = srt.Event(bdev, timing=True)
    s.record(start)
    g = gate(s)
    s.record(end)
    with pytest.raises(srt.NotReadyError):
        start.elapsed_time(end)
    g.open()
    end.synchronize()
    assert start.elapsed_time(end) >= 0.0
    with pytest.raises(srt.InvalidHandleError):
        srt.Event(bdev).elapsed_time(end)  # not a timing event
