"""API.md §2: events (record, query, elapsed time, waits, other devices)."""

from __future__ import annotations

import pytest

import streamrt as srt

from .conftest import Gate, assert_ordered, call_with_timeout, fill, sync

pytestmark = [pytest.mark.api, pytest.mark.timeout(60)]


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


def test_event_query_before_record_is_true(dev):
    # cudaEventQuery on a never-recorded event returns cudaSuccess
    assert srt.Event().query() is True
    call_with_timeout(srt.Event().synchronize)
