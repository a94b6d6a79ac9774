"""acl.mdl: ri_capture_begin / ri_capture_end / ri_capture_get_info, ri_execute_async,
ri_execute, ri_update, ri_destroy over streamrt capture and graph execs."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt

from .conftest import failed


@srt.kernel
def scale(ctx, ptr, n, factor):
    x = ctx.array(ptr, (n,), np.float32)
    x *= factor


@pytest.fixture
def setup(acl):
    s, _ = acl.rt.create_stream()
    d, _ = acl.rt.malloc(16, 0)
    srt.write(d, np.ones(4, np.float32))
    yield s, d
    if s.is_capturing():
        s.end_capture()
    acl.rt.destroy_stream(s)
    acl.rt.free(d)


def capture(acl, s, d, factor=2.0):
    assert acl.mdl.ri_capture_begin(s, acl.ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL) == 0
    s.launch(scale, d, 4, factor)
    ri, ret = acl.mdl.ri_capture_end(s)
    assert ret == 0
    return ri


def test_capture_then_execute_replays(acl, setup):
    s, d = setup
    ri = capture(acl, s, d)
    np.testing.assert_array_equal(srt.read(d, (4,), np.float32), 1.0)  # captured, not run
    for _ in range(3):
        assert acl.mdl.ri_execute_async(ri, s) == 0
    acl.rt.synchronize_stream(s)
    np.testing.assert_array_equal(srt.read(d, (4,), np.float32), 8.0)
    assert acl.mdl.ri_execute(ri, 1000) == 0
    np.testing.assert_array_equal(srt.read(d, (4,), np.float32), 16.0)
    assert acl.mdl.ri_destroy(ri) == 0


def test_ri_capture_begin_refusals(acl, setup):
    s, _ = setup
    failed(acl, acl.mdl.ri_capture_begin(s, 5), acl.ACL_ERROR_INVALID_PARAM, "CaptureMode")
    assert acl.mdl.ri_capture_begin(s, acl.ACL_MODEL_RI_CAPTURE_MODE_GLOBAL) == 0
    assert acl.mdl.ri_capture_begin(s, 0) == acl.ACL_ERROR_RT_STREAM_CAPTURED
    assert "already capturing" in acl.get_recent_err_msg()
    ri, ret = acl.mdl.ri_capture_end(s)
    assert ret == 0
    acl.mdl.ri_destroy(ri)
    failed(acl, acl.mdl.ri_capture_begin(None, 0), acl.ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT)


def test_ri_capture_end_of_a_stream_not_capturing_fails(acl, setup):
    s, _ = setup
    ri, ret = acl.mdl.ri_capture_end(s)
    assert ri is None
    failed(acl, ret, acl.ACL_ERROR_RT_STREAM_NOT_CAPTURED, "not capturing")


def test_ri_capture_end_of_an_invalidated_capture_fails_and_ends_it(acl, setup):
    s, d = setup
    assert acl.mdl.ri_capture_begin(s, acl.ACL_MODEL_RI_CAPTURE_MODE_GLOBAL) == 0
    assert acl.rt.synchronize_stream(s) == acl.ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT
    acl.get_recent_err_msg()
    ri, ret = acl.mdl.ri_capture_end(s)
    assert ri is None
    failed(acl, ret, acl.ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED)
    assert acl.mdl.ri_capture_get_info(s) == (acl.ACL_MODEL_RI_CAPTURE_STATUS_NONE, None, 0)


def test_ri_capture_get_info_names_the_model_being_captured(acl, setup):
    s, d = setup
    assert acl.mdl.ri_capture_get_info(s) == (acl.ACL_MODEL_RI_CAPTURE_STATUS_NONE, None, 0)
    acl.mdl.ri_capture_begin(s, acl.ACL_MODEL_RI_CAPTURE_MODE_RELAXED)
    status, during, ret = acl.mdl.ri_capture_get_info(s)
    assert (status, ret) == (acl.ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE, 0)
    ri, _ = acl.mdl.ri_capture_end(s)
    assert ri is during  # the handle ri_capture_end completes
    acl.mdl.ri_destroy(ri)


def test_ri_capture_get_info_of_no_stream_fails(acl):
    status, ri, ret = acl.mdl.ri_capture_get_info("s")
    assert (status, ri) == (None, None)
    failed(acl, ret, acl.ACL_ERROR_RT_INVALID_HANDLE)


def test_ri_execute_async_and_destroy_of_a_destroyed_model_fail(acl, setup):
    s, d = setup
    ri = capture(acl, s, d)
    assert acl.mdl.ri_destroy(ri) == 0
    failed(acl, acl.mdl.ri_execute_async(ri, s), acl.ACL_ERROR_RT_INVALID_HANDLE, "not a live")
    failed(acl, acl.mdl.ri_destroy(ri), acl.ACL_ERROR_RT_INVALID_HANDLE)


def test_ri_execute_of_a_model_still_capturing_fails(acl, setup):
    s, d = setup
    acl.mdl.ri_capture_begin(s, acl.ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL)
    _, during, _ = acl.mdl.ri_capture_get_info(s)
    ret = acl.mdl.ri_execute(during, 0)
    ri, _ = acl.mdl.ri_capture_end(s)
    failed(acl, ret, acl.ACL_ERROR_RT_PARAM_INVALID, "still being captured")
    acl.mdl.ri_destroy(ri)


def test_ri_update_takes_another_captures_parameters(acl, setup):
    s, d = setup
    ri = capture(acl, s, d, 2.0)
    other = capture(acl, s, d, 3.0)
    assert acl.mdl.ri_update(ri, other) == 0
    acl.mdl.ri_execute_async(ri, s)
    acl.rt.synchronize_stream(s)
    np.testing.assert_array_equal(srt.read(d, (4,), np.float32), 3.0)
    for m in (ri, other):
        acl.mdl.ri_destroy(m)


def test_ri_update_with_another_topology_fails(acl, setup):
    s, d = setup
    ri = capture(acl, s, d)
    acl.mdl.ri_capture_begin(s, 1)
    s.launch(scale, d, 4, 1.0)
    s.launch(scale, d, 4, 1.0)
    two, _ = acl.mdl.ri_capture_end(s)
    failed(acl, acl.mdl.ri_update(ri, two), acl.ACL_ERROR_RT_FEATURE_NOT_SUPPORT_UPDATE_OP,
           "TOPOLOGY_CHANGED")
    for m in (ri, two):
        acl.mdl.ri_destroy(m)
