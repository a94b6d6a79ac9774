"""streamrt errors as ACL codes, the recent error message, init/finalize, and the names the
facade does not offer."""

from __future__ import annotations

import threading

import pytest

import streamrt as srt
from streamrt.acl import errors as acl_errors

from .conftest import failed


@pytest.mark.parametrize(("cls", "code"), [
    (srt.InvalidValueError, 100000),  # ACL_ERROR_INVALID_PARAM
    (srt.InvalidTypeError, 100000),
    (srt.InvalidDeviceError, 107001),  # ACL_ERROR_RT_INVALID_DEVICEID
    (srt.InvalidAddressError, 107000),  # ACL_ERROR_RT_PARAM_INVALID
    (srt.InvalidHandleError, 107017),  # ACL_ERROR_RT_INVALID_HANDLE
    (srt.OutOfMemoryError, 207001),  # ACL_ERROR_RT_MEMORY_ALLOCATION
    (srt.NotSupportedError, 207000),  # ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    (srt.LaunchError, 507015),  # ACL_ERROR_RT_AICORE_EXCEPTION
    (srt.CaptureUnsupportedError, 107030),  # ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT
    (srt.CaptureInvalidatedError, 507903),  # ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED
    (srt.CaptureUnjoinedError, 107025),  # ACL_ERROR_RT_STREAM_UNJOINED
    (srt.CaptureImplicitError, 107031),  # ACL_ERROR_RT_STREAM_CAPTURE_IMPLICIT
    (srt.CapturedEventError, 107028),  # ACL_ERROR_RT_EVENT_CAPTURED
    (srt.CaptureUnmatchedError, 107036),  # ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED
    (srt.StreamRTError, 507000),  # ACL_ERROR_RT_INTERNAL_ERROR
])
def test_each_streamrt_error_has_its_acl_code(cls, code):
    assert acl_errors.code_of(cls("x")) == code


def test_every_streamrt_error_class_has_a_specific_code():
    # none falls to the catch-all ACL_ERROR_RT_INTERNAL_ERROR but the base class itself
    for name in srt.errors.__all__:
        cls = getattr(srt.errors, name)
        if cls is not srt.StreamRTError:
            assert acl_errors.code_of(cls("x")) != 507000, name


def test_an_executor_error_keeps_its_aclnn_number():
    assert acl_errors.code_of(srt.ExecutorError("bad", 561002)) == 561002


def test_init_then_finalize_succeed(acl):
    assert acl.init() == acl.ACL_SUCCESS
    assert acl.finalize() == acl.ACL_SUCCESS


def test_init_twice_is_repeat_initialize(acl):
    assert acl.init() == 0
    try:
        failed(acl, acl.init(), acl.ACL_ERROR_REPEAT_INITIALIZE, "already")
    finally:
        assert acl.finalize() == 0


def test_finalize_without_init_is_repeat_finalize(acl):
    failed(acl, acl.finalize(), acl.ACL_ERROR_REPEAT_FINALIZE, "without acl.init")


def test_finalize_twice_is_repeat_finalize_and_init_then_works_again(acl):
    assert acl.init() == 0
    assert acl.finalize() == 0
    failed(acl, acl.finalize(), acl.ACL_ERROR_REPEAT_FINALIZE, "second time")
    assert acl.init() == 0  # the facade's state is back to "not initialized", not broken
    failed(acl, acl.init(), acl.ACL_ERROR_REPEAT_INITIALIZE, "already")
    assert acl.finalize() == 0


def test_recent_error_message_is_the_threads_own(acl):
    assert acl.rt.free(0x1234) == acl.ACL_ERROR_RT_PARAM_INVALID
    seen = []
    t = threading.Thread(target=lambda: seen.append(acl.get_recent_err_msg()))
    t.start()
    t.join()
    assert seen == [None]  # another thread's failure is not this thread's
    assert "acl.rt.free" in acl.get_recent_err_msg()
    assert acl.get_recent_err_msg() is None


def test_get_recent_err_msg_is_none_without_a_failure(acl):
    assert acl.rt.get_run_mode() == (acl.ACL_HOST, 0)
    assert acl.get_recent_err_msg() is None


@pytest.mark.parametrize(("path", "words"), [
    ("rt.launch_callback", "launch_host_func"),
    ("rt.launch_kernel_with_config", "README"),
    ("rt.no_such_call", "README"),
    ("mdl.load_from_file", "captured"),
    ("media.dvpp_vpc_resize_async", "README"),
    ("op", "streamrt.ops"),
    ("nn.conv2d", "shipped operators"),
])
def test_a_name_not_offered_is_an_attribute_error_saying_what_to_use(acl, path, words):
    ns, name = path.rsplit(".", 1) if "." in path else ("", path)
    obj = getattr(acl, ns) if ns else acl
    with pytest.raises(AttributeError, match=words) as info:
        getattr(obj, name)
    assert f"{name} is not offered" in str(info.value)
    assert not hasattr(acl.rt, "__wrapped__")  # dunders stay plain misses
