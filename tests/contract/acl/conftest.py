"""Fixtures of the ACL facade's tests: the facade with device 0 set (its registrations released
after each test), and the check that a failed call left the runtime usable."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from streamrt import acl as facade


@pytest.fixture
def acl():
    """``streamrt.acl`` with device 0 current and no stale error message."""
    facade.get_recent_err_msg()
    assert facade.rt.set_device(0) == facade.ACL_SUCCESS
    yield facade
    srt.Device("cpu:0").synchronize()
    # the buffers acl.util registered go, as at acl.finalize: a mapping left behind would make
    # a later test's dev.reset() fail (the cpu backend's reset refuses "external" memory)
    facade.util.release_all()


def usable(acl) -> None:
    """A round trip through device memory on a new stream still works (after a failure)."""
    host = np.arange(8, dtype=np.int32)
    back = np.zeros(8, np.int32)
    ptr, ret = acl.rt.malloc(host.nbytes, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    assert ret == acl.ACL_SUCCESS
    s, ret = acl.rt.create_stream()
    assert ret == acl.ACL_SUCCESS
    assert acl.rt.memcpy_async(ptr, 32, acl.util.numpy_to_ptr(host), 32,
                               acl.ACL_MEMCPY_HOST_TO_DEVICE, s) == 0
    assert acl.rt.memcpy_async(acl.util.numpy_to_ptr(back), 32, ptr, 32,
                               acl.ACL_MEMCPY_DEVICE_TO_HOST, s) == 0
    assert acl.rt.synchronize_stream(s) == 0
    np.testing.assert_array_equal(back, host)
    assert acl.rt.destroy_stream(s) == 0
    assert acl.rt.free(ptr) == 0


def failed(acl, ret, code, words: str = "") -> None:
    """``ret`` is ``code``, the message says ``words`` and the runtime is still usable."""
    assert ret == code, (ret, acl.get_recent_err_msg())
    msg = acl.get_recent_err_msg()
    assert msg and words in msg, msg
    assert acl.get_recent_err_msg() is None  # read once
    usable(acl)
