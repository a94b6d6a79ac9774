"""Devices and contexts: set_device, reset_device, get_device, get_device_count, get_run_mode,
synchronize_device, create/destroy/set_current/get_current_context."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt

from .conftest import failed


def in_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def test_set_device_makes_it_current(acl):
    assert acl.rt.set_device(1) == 0
    try:
        assert srt.current_device() is srt.Device("cpu:1")
        assert acl.rt.get_device() == (1, 0)
    finally:
        acl.rt.set_device(0)


def test_set_device_past_the_count_is_invalid_deviceid(acl):
    failed(acl, acl.rt.set_device(99), acl.ACL_ERROR_RT_INVALID_DEVICEID, "cpu:99")
    assert acl.rt.get_device() == (0, 0)  # unchanged
    failed(acl, acl.rt.set_device("0"), acl.ACL_ERROR_INVALID_PARAM, "int")


def test_reset_device_releases_its_memory(acl):
    assert acl.rt.set_device(1) == 0
    try:
        ptr, ret = acl.rt.malloc(256, acl.ACL_MEM_MALLOC_HUGE_FIRST)
        host = np.ones(4, np.float32)
        hptr = acl.util.numpy_to_ptr(host)
        assert acl.rt.memcpy(ptr, 16, hptr, 16, acl.ACL_MEMCPY_HOST_TO_DEVICE) == 0
        assert acl.rt.reset_device(1) == 0
        assert acl.rt.free(ptr) == acl.ACL_ERROR_RT_PARAM_INVALID  # gone with the reset
        acl.get_recent_err_msg()
    finally:
        acl.rt.set_device(0)


def test_reset_device_of_no_device_fails(acl):
    failed(acl, acl.rt.reset_device(42), acl.ACL_ERROR_RT_INVALID_DEVICEID)


def test_get_device_without_a_device_set_is_context_null(acl):
    ret = in_thread(acl.rt.get_device)
    assert ret == (None, acl.ACL_ERROR_RT_CONTEXT_NULL)
    assert in_thread(lambda: (acl.rt.set_device(1), acl.rt.get_device())) == (0, (1, 0))
    assert acl.rt.get_device() == (0, 0)  # this thread's own device


def test_get_device_count_and_run_mode(acl):
    assert acl.rt.get_device_count() == (srt.device_count("cpu"), 0)
    assert acl.rt.get_run_mode() == (acl.ACL_HOST, 0)


def test_get_device_count_of_an_unusable_backend_is_no_device(acl, monkeypatch):
    # aclrtGetDeviceCount fails when the driver answers no devices; here the backend's
    # device_count raises as a backend does when its driver is missing (cuda's, on a machine
    # without one): ACL_ERROR_RT_NO_DEVICE, count 0, and the next call answers again
    from streamrt.acl import context

    def no_driver(backend):
        raise srt.BackendUnavailableError(f"the {backend} backend cannot be used here: no driver")

    monkeypatch.setattr(context, "device_count", no_driver)
    count, ret = acl.rt.get_device_count()
    assert count == 0
    monkeypatch.undo()
    failed(acl, ret, acl.ACL_ERROR_RT_NO_DEVICE, "no driver")
    assert acl.rt.get_device_count() == (srt.device_count("cpu"), 0)


def test_get_run_mode_has_no_failure(acl):
    # aclrtGetRunMode's one failure is a null runMode out pointer (ACL_ERROR_INVALID_PARAM),
    # which a Python call returning its value cannot make; it answers in any thread, device set
    # or not (the mode is the process's), so there is no failing call to test
    assert in_thread(acl.rt.get_run_mode) == (acl.ACL_HOST, 0)
    with pytest.raises(TypeError):
        acl.rt.get_run_mode(0)  # (an argument is a Python error, not an ACL code)


@srt.kernel
def boom(ctx):
    raise RuntimeError("kernel failed")


def test_synchronize_device_waits_for_every_stream(acl):
    s, _ = acl.rt.create_stream()
    ptr, _ = acl.rt.malloc(64, 0)
    assert acl.rt.memset_async(ptr, 64, 7, 64, s) == 0
    assert acl.rt.synchronize_device() == 0
    assert s.query()
    np.testing.assert_array_equal(srt.read(ptr, (64,), np.uint8), 7)
    acl.rt.free(ptr)
    acl.rt.destroy_stream(s)


def test_synchronize_device_after_a_failed_kernel_is_aicore_exception(acl):
    s, _ = acl.rt.create_stream()
    s.launch(boom)
    failed(acl, acl.rt.synchronize_device(), acl.ACL_ERROR_RT_AICORE_EXCEPTION, "kernel failed")
    acl.rt.destroy_stream(s)


def test_create_context_is_current_and_streams_follow_it(acl):
    ctx, ret = acl.rt.create_context(1)
    assert ret == 0
    try:
        assert acl.rt.get_current_context() == (ctx, 0)
        s, _ = acl.rt.create_stream()
        assert s.device is srt.Device("cpu:1")
        acl.rt.destroy_stream(s)
    finally:
        assert acl.rt.destroy_context(ctx) == 0
        acl.rt.set_device(0)


def test_create_context_of_no_device_fails(acl):
    ret = acl.rt.create_context(7)
    assert ret[0] is None
    failed(acl, ret[1], acl.ACL_ERROR_RT_INVALID_DEVICEID)


def test_contexts_are_per_thread(acl):
    ctx, _ = acl.rt.create_context(1)
    acl.rt.set_device(0)
    # another thread sets ctx; this thread's current context stays its own
    assert in_thread(lambda: (acl.rt.set_current_context(ctx), acl.rt.get_current_context())) \
        == (0, (ctx, 0))
    own, ret = acl.rt.get_current_context()
    assert ret == 0 and own is not ctx and own.device is srt.Device("cpu:0")
    assert acl.rt.set_current_context(ctx) == 0
    assert srt.current_device() is srt.Device("cpu:1")
    assert acl.rt.set_current_context(own) == 0
    assert srt.current_device() is srt.Device("cpu:0")
    assert acl.rt.destroy_context(ctx) == 0


def test_set_current_context_of_a_destroyed_one_is_invalid_handle(acl):
    ctx, _ = acl.rt.create_context(0)
    assert acl.rt.destroy_context(ctx) == 0
    failed(acl, acl.rt.set_current_context(ctx), acl.ACL_ERROR_RT_INVALID_HANDLE, "destroyed")
    failed(acl, acl.rt.set_current_context("ctx"), acl.ACL_ERROR_RT_INVALID_HANDLE)


def test_destroy_context_twice_or_a_default_one_fails(acl):
    ctx, _ = acl.rt.create_context(0)
    assert acl.rt.destroy_context(ctx) == 0
    failed(acl, acl.rt.destroy_context(ctx), acl.ACL_ERROR_RT_INVALID_HANDLE, "destroyed")
    default, _ = acl.rt.get_current_context()  # back to the device's default context
    assert default.default
    failed(acl, acl.rt.destroy_context(default), acl.ACL_ERROR_RT_INVALID_HANDLE, "default")


def test_get_current_context_without_one_is_context_null(acl):
    assert in_thread(acl.rt.get_current_context) == (None, acl.ACL_ERROR_RT_CONTEXT_NULL)
    ctx, ret = acl.rt.get_current_context()
    assert ret == 0 and ctx.device is srt.Device("cpu:0")
