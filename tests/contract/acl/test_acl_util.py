"""acl.util: numpy_to_ptr, bytes_to_ptr, ptr_to_numpy, ptr_to_bytes: host buffers addressed by
int, registered as host memory for copies."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt

from .conftest import usable


def test_numpy_to_ptr_is_stable_and_written_through(acl):
    a = np.zeros(8, np.float32)
    p = acl.util.numpy_to_ptr(a)
    assert acl.util.numpy_to_ptr(a) == p  # the same memory, the same pointer
    view = acl.util.ptr_to_numpy(p, (8,), np.float32)
    view[3] = 7.0
    assert a[3] == 7.0  # a view, not a copy
    d, _ = acl.rt.malloc(32, 0)
    srt.write(d, np.full(8, 2.0, np.float32))
    assert acl.rt.memcpy(p + 16, 16, d, 16, acl.ACL_MEMCPY_DEVICE_TO_HOST) == 0
    np.testing.assert_array_equal(a, [0, 0, 0, 7, 2, 2, 2, 2])
    acl.rt.free(d)


def test_numpy_to_ptr_refusals(acl):
    with pytest.raises(srt.InvalidValueError, match="C-contiguous"):
        acl.util.numpy_to_ptr(np.zeros((4, 4))[:, 1])
    with pytest.raises(srt.InvalidTypeError, match="numpy array"):
        acl.util.numpy_to_ptr([1, 2, 3])
    with pytest.raises(srt.InvalidValueError, match="empty"):
        acl.util.numpy_to_ptr(np.zeros(0))
    usable(acl)


def test_bytes_to_ptr_reads_bytes_and_writes_a_bytearray(acl):
    data = np.arange(4, dtype=np.int32).tobytes()
    d, _ = acl.rt.malloc(16, 0)
    assert acl.rt.memcpy(d, 16, acl.util.bytes_to_ptr(data), 16, 1) == 0
    out = bytearray(16)
    assert acl.rt.memcpy(acl.util.bytes_to_ptr(out), 16, d, 16, 2) == 0
    assert bytes(out) == data
    acl.rt.free(d)


def test_bytes_to_ptr_of_a_str_is_refused(acl):
    with pytest.raises(srt.InvalidTypeError, match="bytes"):
        acl.util.bytes_to_ptr("text")
    usable(acl)


def test_ptr_to_numpy_takes_pyacls_numpy_type_numbers(acl):
    a = np.arange(6, dtype=np.float32)
    p = acl.util.numpy_to_ptr(a)
    NPY_FLOAT = np.dtype(np.float32).num  # 11, as pyACL samples spell it
    np.testing.assert_array_equal(acl.util.ptr_to_numpy(p, (2, 3), NPY_FLOAT), a.reshape(2, 3))
    np.testing.assert_array_equal(acl.util.ptr_to_numpy(p + 8, (4,), "float32"), a[2:])


def test_ptr_to_numpy_refuses_device_memory_and_overruns(acl):
    d, _ = acl.rt.malloc(16, 0)
    with pytest.raises(srt.InvalidAddressError, match="DEVICE_TO_HOST"):
        acl.util.ptr_to_numpy(d, (4,), np.float32)
    p = acl.util.numpy_to_ptr(np.zeros(4, np.float32))
    with pytest.raises(srt.InvalidAddressError, match="leaves its buffer"):
        acl.util.ptr_to_numpy(p, (5,), np.float32)
    with pytest.raises(srt.InvalidValueError, match="type number"):
        acl.util.ptr_to_numpy(p, (4,), 999)
    acl.rt.free(d)
    usable(acl)


def test_ptr_to_bytes_copies_host_memory(acl):
    h, _ = acl.rt.malloc_host(8)
    acl.util.ptr_to_numpy(h, (8,), np.uint8)[:] = np.arange(8)
    got = acl.util.ptr_to_bytes(h, 8)
    assert got == bytes(range(8))
    acl.util.ptr_to_numpy(h, (8,), np.uint8)[:] = 0
    assert got == bytes(range(8))  # a copy
    acl.rt.free_host(h)


def test_ptr_to_bytes_of_a_freed_host_pointer_is_refused(acl):
    h, _ = acl.rt.malloc_host(8)
    acl.rt.free_host(h)
    with pytest.raises(srt.InvalidAddressError, match="not host memory"):
        acl.util.ptr_to_bytes(h, 8)
    usable(acl)


def test_finalize_releases_the_registrations(acl):
    assert acl.init() == 0
    a = np.zeros(4, np.float32)
    p = acl.util.numpy_to_ptr(a)
    assert acl.finalize() == 0
    with pytest.raises(srt.InvalidAddressError):
        acl.util.ptr_to_numpy(p, (4,), np.float32)
    assert acl.util.numpy_to_ptr(a) != 0  # registered again on demand
