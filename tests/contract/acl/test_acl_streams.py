"""Streams and events: create/destroy/synchronize/query_stream, create_event(_with_flag),
record_event, stream_wait_event, synchronize_event, query_event_status, event_elapsed_time,
destroy_event."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt

from .conftest import failed, usable


@srt.kernel
def wait_for(ctx, gate):
    gate.wait()


@srt.kernel
def fill(ctx, ptr, n, value):
    ctx.array(ptr, (n,), np.float32)[:] = value


def test_create_stream_runs_work_in_order(acl):
    s, ret = acl.rt.create_stream()
    assert ret == 0 and isinstance(s, srt.Stream) and s.device is srt.Device("cpu:0")
    ptr, _ = acl.rt.malloc(16, 0)
    s.launch(fill, ptr, 4, 3.0)
    out = np.zeros(4, np.float32)
    assert acl.rt.memcpy_async(acl.util.numpy_to_ptr(out), 16, ptr, 16,
                               acl.ACL_MEMCPY_DEVICE_TO_HOST, s) == 0
    assert acl.rt.synchronize_stream(s) == 0
    np.testing.assert_array_equal(out, 3.0)
    assert acl.rt.destroy_stream(s) == 0
    acl.rt.free(ptr)


def test_create_stream_follows_the_current_device(acl):
    acl.rt.set_device(1)
    try:
        s, ret = acl.rt.create_stream()
        assert ret == 0 and s.device is srt.Device("cpu:1")
        assert acl.rt.destroy_stream(s) == 0
    finally:
        acl.rt.set_device(0)


def test_destroy_stream_twice_or_the_default_one_is_invalid_handle(acl):
    s, _ = acl.rt.create_stream()
    assert acl.rt.destroy_stream(s) == 0
    failed(acl, acl.rt.destroy_stream(s), acl.ACL_ERROR_RT_INVALID_HANDLE, "destroyed")
    failed(acl, acl.rt.destroy_stream(None), acl.ACL_ERROR_RT_INVALID_HANDLE, "default")


def test_synchronize_stream_of_no_stream_is_invalid_handle(acl):
    failed(acl, acl.rt.synchronize_stream(42), acl.ACL_ERROR_RT_INVALID_HANDLE, "not a stream")


def test_synchronize_stream_reports_a_failed_kernel(acl):
    @srt.kernel
    def boom(ctx):
        raise RuntimeError("bad kernel")

    s, _ = acl.rt.create_stream()
    s.launch(boom)
    failed(acl, acl.rt.synchronize_stream(s), acl.ACL_ERROR_RT_AICORE_EXCEPTION, "bad kernel")
    acl.rt.destroy_stream(s)


def test_query_stream_sees_pending_then_complete(acl):
    s, _ = acl.rt.create_stream()
    gate = threading.Event()
    s.launch(wait_for, gate)
    assert acl.rt.query_stream(s) == (acl.ACL_STREAM_STATUS_NOT_READY, 0)
    gate.set()
    acl.rt.synchronize_stream(s)
    assert acl.rt.query_stream(s) == (acl.ACL_STREAM_STATUS_COMPLETE, 0)
    acl.rt.destroy_stream(s)
    failed(acl, acl.rt.query_stream(s)[1], acl.ACL_ERROR_RT_INVALID_HANDLE)


def test_events_order_two_streams(acl):
    s1, _ = acl.rt.create_stream()
    s2, _ = acl.rt.create_stream()
    ev, ret = acl.rt.create_event()
    assert ret == 0 and ev.timing
    ptr, _ = acl.rt.malloc(16, 0)
    gate = threading.Event()
    s1.launch(wait_for, gate)
    s1.launch(fill, ptr, 4, 5.0)
    assert acl.rt.record_event(ev, s1) == 0
    assert acl.rt.query_event_status(ev) == (acl.ACL_EVENT_RECORDED_STATUS_NOT_READY, 0)
    assert acl.rt.stream_wait_event(s2, ev) == 0
    out = np.zeros(4, np.float32)
    assert acl.rt.memcpy_async(acl.util.numpy_to_ptr(out), 16, ptr, 16, 2, s2) == 0
    assert not s2.query()  # held back by the event
    gate.set()
    assert acl.rt.synchronize_event(ev) == 0
    assert acl.rt.query_event_status(ev) == (acl.ACL_EVENT_RECORDED_STATUS_COMPLETE, 0)
    acl.rt.synchronize_stream(s2)
    np.testing.assert_array_equal(out, 5.0)
    for s in (s1, s2):
        acl.rt.destroy_stream(s)
    assert acl.rt.destroy_event(ev) == 0
    acl.rt.free(ptr)


def test_create_event_with_flag(acl):
    ev, ret = acl.rt.create_event_with_flag(acl.ACL_EVENT_SYNC)
    assert ret == 0 and not ev.timing
    timed, ret = acl.rt.create_event_with_flag(acl.ACL_EVENT_TIME_LINE | acl.ACL_EVENT_SYNC)
    assert ret == 0 and timed.timing
    ev2, ret = acl.rt.create_event_with_flag(0x400)
    assert ev2 is None
    failed(acl, ret, acl.ACL_ERROR_INVALID_PARAM, "ACL_EVENT_")


def test_create_event_then_elapsed_time(acl):
    start, _ = acl.rt.create_event()
    end, _ = acl.rt.create_event()
    s, _ = acl.rt.create_stream()
    acl.rt.record_event(start, s)
    acl.rt.record_event(end, s)
    acl.rt.synchronize_event(end)
    ms, ret = acl.rt.event_elapsed_time(start, end)
    assert ret == 0 and ms >= 0.0
    acl.rt.destroy_stream(s)


def test_event_elapsed_time_of_an_unrecorded_event_fails(acl):
    start, _ = acl.rt.create_event()
    end, _ = acl.rt.create_event()
    ms, ret = acl.rt.event_elapsed_time(start, end)
    assert ms is None
    failed(acl, ret, acl.ACL_ERROR_RT_INVALID_HANDLE, "not been recorded")


def test_record_event_on_another_devices_stream_is_invalid_handle(acl):
    acl.rt.set_device(1)
    ev, _ = acl.rt.create_event()
    acl.rt.set_device(0)
    s, _ = acl.rt.create_stream()
    failed(acl, acl.rt.record_event(ev, s), acl.ACL_ERROR_RT_INVALID_HANDLE, "cpu:1")
    acl.rt.destroy_stream(s)


def test_stream_wait_event_of_no_event_is_invalid_handle(acl):
    failed(acl, acl.rt.stream_wait_event(None, "ev"), acl.ACL_ERROR_RT_INVALID_HANDLE,
           "not an event")


def test_synchronize_event_query_and_destroy_of_a_destroyed_event_fail(acl):
    ev, _ = acl.rt.create_event()
    assert acl.rt.destroy_event(ev) == 0
    failed(acl, acl.rt.synchronize_event(ev), acl.ACL_ERROR_RT_INVALID_HANDLE, "destroyed")
    failed(acl, acl.rt.query_event_status(ev)[1], acl.ACL_ERROR_RT_INVALID_HANDLE)
    failed(acl, acl.rt.destroy_event(ev), acl.ACL_ERROR_RT_INVALID_HANDLE)


@pytest.mark.parametrize("call", ["create_stream", "create_event", "create_event_with_flag"])
def test_create_in_a_thread_that_set_no_device_is_context_null(acl, call):
    # aclrtCreateStream / aclrtCreateEvent need the thread's context: a thread that called
    # neither aclrtSetDevice nor aclrtSetCurrentContext has none (107002)
    make = getattr(acl.rt, call)
    args = (acl.ACL_EVENT_SYNC,) if call == "create_event_with_flag" else ()
    seen = []

    def thread():
        seen.append((make(*args), acl.get_recent_err_msg()))
        assert acl.rt.set_device(0) == 0  # then it can, in that thread
        obj, ret = make(*args)
        seen.append(ret)
        (acl.rt.destroy_stream if call == "create_stream" else acl.rt.destroy_event)(obj)

    t = threading.Thread(target=thread)
    t.start()
    t.join()
    (value, msg), ret = seen
    assert value == (None, acl.ACL_ERROR_RT_CONTEXT_NULL) and ret == 0
    assert f"acl.rt.{call}" in msg and "set_device" in msg
    usable(acl)
