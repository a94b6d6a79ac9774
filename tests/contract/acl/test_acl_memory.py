"""Memory: malloc(size, policy), free, malloc_host, free_host, memcpy / memcpy_async with
destMax and kind (HOST_TO_HOST between any two host pointers), memset / memset_async,
get_mem_info; and acl.media.dvpp_malloc / dvpp_free."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt

from .conftest import failed


def test_malloc_every_policy_is_device_memory(acl):
    for policy in (acl.ACL_MEM_MALLOC_HUGE_FIRST, acl.ACL_MEM_MALLOC_HUGE_ONLY,
                   acl.ACL_MEM_MALLOC_NORMAL_ONLY,
                   acl.ACL_MEM_MALLOC_HUGE_FIRST_P2P | acl.ACL_MEM_TYPE_HIGH_BAND_WIDTH):
        ptr, ret = acl.rt.malloc(100, policy)
        assert ret == 0
        srt.write(ptr, np.arange(25, dtype=np.float32))
        np.testing.assert_array_equal(srt.read(ptr, (25,), np.float32), np.arange(25))
        assert acl.rt.free(ptr) == 0


@pytest.mark.parametrize(("size", "policy", "code", "words"), [
    (0, 0, 100000, "> 0"),
    (-4, 0, 100000, "> 0"),
    (16, 9, 100000, "aclrtMemMallocPolicy"),
    (1 << 50, 0, 207001, "cannot allocate"),
])
def test_malloc_refusals(acl, size, policy, code, words):
    ptr, ret = acl.rt.malloc(size, policy)
    assert ptr is None
    failed(acl, ret, code, words)


def test_free_twice_is_param_invalid(acl):
    ptr, _ = acl.rt.malloc(64, 0)
    assert acl.rt.free(ptr) == 0
    failed(acl, acl.rt.free(ptr), acl.ACL_ERROR_RT_PARAM_INVALID, "not a live")


def test_malloc_host_is_a_host_endpoint_viewed_by_ptr_to_numpy(acl):
    hptr, ret = acl.rt.malloc_host(64)
    assert ret == 0
    view = acl.util.ptr_to_numpy(hptr, (16,), np.float32)
    view[:] = np.arange(16)
    dptr, _ = acl.rt.malloc(64, 0)
    assert acl.rt.memcpy(dptr, 64, hptr, 64, acl.ACL_MEMCPY_HOST_TO_DEVICE) == 0
    np.testing.assert_array_equal(srt.read(dptr, (16,), np.float32), np.arange(16))
    assert acl.rt.free_host(hptr) == 0
    acl.rt.free(dptr)


def test_malloc_host_of_nothing_and_free_host_of_no_host_memory_fail(acl):
    ptr, ret = acl.rt.malloc_host(0)
    assert ptr is None
    failed(acl, ret, acl.ACL_ERROR_INVALID_PARAM)
    dptr, _ = acl.rt.malloc(64, 0)
    failed(acl, acl.rt.free_host(dptr), acl.ACL_ERROR_RT_PARAM_INVALID, "pinned")
    acl.rt.free(dptr)


def test_memcpy_both_ways_and_device_to_device(acl):
    a = np.arange(32, dtype=np.int16)
    b = np.zeros_like(a)
    d1, _ = acl.rt.malloc(64, 0)
    d2, _ = acl.rt.malloc(64, 0)
    assert acl.rt.memcpy(d1, 64, acl.util.numpy_to_ptr(a), 64, acl.ACL_MEMCPY_HOST_TO_DEVICE) == 0
    assert acl.rt.memcpy(d2, 64, d1, 64, acl.ACL_MEMCPY_DEVICE_TO_DEVICE) == 0
    assert acl.rt.memcpy(acl.util.numpy_to_ptr(b), 64, d2 + 32, 32,
                         acl.ACL_MEMCPY_DEVICE_TO_HOST) == 0
    np.testing.assert_array_equal(b[:16], a[16:])
    for p in (d1, d2):
        acl.rt.free(p)


def test_memcpy_host_to_host_between_any_two_host_pointers(acl):
    src = np.arange(8, dtype=np.float64)
    dst = np.zeros(8)
    pinned, _ = acl.rt.malloc_host(64)
    assert acl.rt.memcpy(pinned, 64, acl.util.numpy_to_ptr(src), 64,
                         acl.ACL_MEMCPY_HOST_TO_HOST) == 0
    assert acl.rt.memcpy(acl.util.bytes_to_ptr(memoryview(dst).cast("B")), 64, pinned, 64,
                         acl.ACL_MEMCPY_HOST_TO_HOST) == 0
    np.testing.assert_array_equal(dst, src)
    other = np.zeros(8)
    assert acl.rt.memcpy(acl.util.numpy_to_ptr(other), 64, acl.util.numpy_to_ptr(dst), 64,
                         acl.ACL_MEMCPY_HOST_TO_HOST) == 0
    np.testing.assert_array_equal(other, src)
    acl.rt.free_host(pinned)


@pytest.mark.parametrize(("case", "code", "words"), [
    ("over_dest_max", 100000, "max 32"),
    ("kind_mismatch", 100000, "is device memory, not host"),
    ("bad_kind", 100000, "aclrtMemcpyKind"),
    ("freed", 107000, "not inside any live allocation"),
])
def test_memcpy_refusals(acl, case, code, words):
    host = np.zeros(16, np.float32)
    h = acl.util.numpy_to_ptr(host)
    d, _ = acl.rt.malloc(64, 0)
    if case == "freed":
        acl.rt.free(d)
    args = {"over_dest_max": (d, 32, h, 64, 1), "kind_mismatch": (d, 64, h, 64, 2),
            "bad_kind": (d, 64, h, 64, 7), "freed": (d, 64, h, 64, 1)}[case]
    failed(acl, acl.rt.memcpy(*args), code, words)
    if case != "freed":
        acl.rt.free(d)


def test_memcpy_async_is_stream_ordered_both_ways(acl):
    s, _ = acl.rt.create_stream()
    host = np.arange(16, dtype=np.float32)
    back = np.zeros(16, np.float32)
    d, _ = acl.rt.malloc(64, 0)
    assert acl.rt.memcpy_async(d, 64, acl.util.numpy_to_ptr(host), 64, 1, s) == 0
    assert acl.rt.memset_async(d, 64, 0, 16, s) == 0  # after the copy: first 4 floats zeroed
    assert acl.rt.memcpy_async(acl.util.numpy_to_ptr(back), 64, d, 64, 2, s) == 0
    assert acl.rt.synchronize_stream(s) == 0
    np.testing.assert_array_equal(back, np.r_[np.zeros(4), np.arange(4, 16)])
    acl.rt.destroy_stream(s)
    acl.rt.free(d)


def test_memcpy_async_refusals_enqueue_nothing(acl):
    s, _ = acl.rt.create_stream()
    d, _ = acl.rt.malloc(64, 0)
    acl.rt.memset(d, 64, 0, 64)
    host = np.ones(16, np.float32)
    failed(acl, acl.rt.memcpy_async(d, 16, acl.util.numpy_to_ptr(host), 64, 1, s),
           acl.ACL_ERROR_INVALID_PARAM, "max 16")
    failed(acl, acl.rt.memcpy_async(d, 64, d, 64, acl.ACL_MEMCPY_HOST_TO_DEVICE, s),
           acl.ACL_ERROR_INVALID_PARAM, "source")
    failed(acl, acl.rt.memcpy_async(d, 64, d, 64, 3, "s"), acl.ACL_ERROR_RT_INVALID_HANDLE)
    acl.rt.synchronize_stream(s)
    np.testing.assert_array_equal(srt.read(d, (16,), np.float32), 0.0)  # nothing was copied
    acl.rt.destroy_stream(s)
    acl.rt.free(d)


def test_memset_fills_bytes(acl):
    d, _ = acl.rt.malloc(32, 0)
    assert acl.rt.memset(d, 32, 0xAB, 32) == 0
    np.testing.assert_array_equal(srt.read(d, (32,), np.uint8), 0xAB)
    acl.rt.free(d)


def test_memset_refusals(acl):
    d, _ = acl.rt.malloc(32, 0)
    failed(acl, acl.rt.memset(d, 16, 1, 32), acl.ACL_ERROR_INVALID_PARAM, "max 16")
    failed(acl, acl.rt.memset(0x1234, 16, 1, 16), acl.ACL_ERROR_RT_PARAM_INVALID)
    np.testing.assert_array_equal(srt.read(d, (32,), np.uint8) == 1, False)  # nothing written
    acl.rt.free(d)


def test_memset_async_in_stream_order(acl):
    s, _ = acl.rt.create_stream()
    d, _ = acl.rt.malloc(32, 0)
    assert acl.rt.memset_async(d, 32, 3, 32, s) == 0
    assert acl.rt.memset_async(d, 32, 9, 8, s) == 0
    acl.rt.synchronize_stream(s)
    np.testing.assert_array_equal(srt.read(d, (32,), np.uint8), [9] * 8 + [3] * 24)
    acl.rt.destroy_stream(s)
    acl.rt.free(d)


def test_memset_async_refusals(acl):
    d, _ = acl.rt.malloc(32, 0)
    failed(acl, acl.rt.memset_async(d, 8, 1, 32, None), acl.ACL_ERROR_INVALID_PARAM, "max 8")
    failed(acl, acl.rt.memset_async(d, 32, 256, 32, None), acl.ACL_ERROR_INVALID_PARAM, "byte")
    acl.rt.free(d)


def test_get_mem_info_is_the_devices_memory_info(acl):
    free0, total, ret = acl.rt.get_mem_info(acl.ACL_HBM_MEM)
    assert ret == 0 and total == srt.Device("cpu:0").memory_info()[1]
    d, _ = acl.rt.malloc(1 << 20, 0)
    free1, total1, _ = acl.rt.get_mem_info(acl.ACL_DDR_MEM)
    assert total1 == total and free1 <= free0 - (1 << 20)
    acl.rt.free(d)


def test_get_mem_info_of_no_attr_fails(acl):
    f, t, ret = acl.rt.get_mem_info(10)
    assert (f, t) == (0, 0)
    failed(acl, ret, acl.ACL_ERROR_INVALID_PARAM, "aclrtMemAttr")


def test_dvpp_malloc_is_device_memory(acl):
    ptr, ret = acl.media.dvpp_malloc(128)
    assert ret == 0
    assert acl.rt.memset(ptr, 128, 5, 128) == 0
    np.testing.assert_array_equal(srt.read(ptr, (128,), np.uint8), 5)
    assert acl.media.dvpp_free(ptr) == 0


def test_dvpp_malloc_of_nothing_and_dvpp_free_twice_fail(acl):
    ptr, ret = acl.media.dvpp_malloc(0)
    assert ptr is None
    failed(acl, ret, acl.ACL_ERROR_INVALID_PARAM)
    ptr, _ = acl.media.dvpp_malloc(16)
    acl.media.dvpp_free(ptr)
    failed(acl, acl.media.dvpp_free(ptr), acl.ACL_ERROR_RT_PARAM_INVALID)
