"""Pools: mem_pool_create(props as dict of C field names or MemPoolProps), mem_pool_destroy,
mem_pool_malloc_async, mem_pool_free_async, mem_pool_set_attr / get_attr (the eight
ACL_RT_MEM_POOL_ATTR_*), mem_pool_trim_to."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from streamrt.acl.pools import MemLocation, MemPoolProps

from .conftest import failed

PROPS = {"allocType": 0, "handleType": 0, "location": {"id": 0, "type": 1},
         "maxSize": 1 << 20, "reserved": [0]}


@pytest.fixture
def pool(acl):
    p, ret = acl.rt.mem_pool_create(PROPS)
    assert ret == 0
    yield p
    if not p._destroyed:
        acl.rt.mem_pool_destroy(p)


def test_mem_pool_create_from_a_dict_of_c_fields(acl, pool):
    assert isinstance(pool, srt.MemPool)
    assert pool.device is srt.Device("cpu:0") and pool.max_size == 1 << 20


def test_mem_pool_create_from_props_on_device_1(acl):
    p, ret = acl.rt.mem_pool_create(MemPoolProps(location=MemLocation(id=1), maxSize=0))
    assert ret == 0 and p.device is srt.Device("cpu:1")
    assert acl.rt.mem_pool_destroy(p) == 0


@pytest.mark.parametrize(("change", "code", "words"), [
    ({"allocType": 3}, 100000, "PINNED"),
    ({"handleType": 1}, 100000, "HANDLE_TYPE_NONE"),
    ({"location": {"id": 0, "type": 0}}, 100000, "LOCATION_TYPE_DEVICE"),
    ({"location": {"id": 9, "type": 1}}, 107001, "cpu:9"),
    ({"location": {"idx": 0}}, 100000, "no field"),
    ({"maxSize": -1}, 100000, "max_size"),
    ({"size": 1}, 100000, "no field"),
])
def test_mem_pool_create_refusals(acl, change, code, words):
    p, ret = acl.rt.mem_pool_create({**PROPS, **change})
    assert p is None
    failed(acl, ret, code, words)
    p, ret = acl.rt.mem_pool_create([1, 2])
    failed(acl, ret, acl.ACL_ERROR_INVALID_PARAM, "dict")


def test_mem_pool_malloc_and_free_async_in_stream_order(acl, pool):
    s, _ = acl.rt.create_stream()
    ptr, ret = acl.rt.mem_pool_malloc_async(256, pool, s)
    assert ret == 0
    host = np.arange(64, dtype=np.float32)
    back = np.zeros_like(host)
    acl.rt.memcpy_async(ptr, 256, acl.util.numpy_to_ptr(host), 256, 1, s)
    acl.rt.memcpy_async(acl.util.numpy_to_ptr(back), 256, ptr, 256, 2, s)
    assert acl.rt.mem_pool_free_async(ptr, s) == 0  # no synchronize needed before it
    again, ret = acl.rt.mem_pool_malloc_async(256, pool, s)
    assert ret == 0 and again == ptr  # reused in the same stream
    acl.rt.mem_pool_free_async(again, s)
    acl.rt.synchronize_stream(s)
    np.testing.assert_array_equal(back, host)
    assert acl.rt.mem_pool_get_attr(pool, acl.ACL_RT_MEM_POOL_ATTR_USED_MEM_CURRENT) == (0, 0)
    acl.rt.destroy_stream(s)


def test_mem_pool_malloc_async_past_max_size_or_of_nothing_fails(acl, pool):
    ptr, ret = acl.rt.mem_pool_malloc_async(2 << 20, pool, None)
    assert ptr is None
    failed(acl, ret, acl.ACL_ERROR_RT_MEMORY_ALLOCATION, "max_size")
    failed(acl, acl.rt.mem_pool_malloc_async(0, pool, None)[1], acl.ACL_ERROR_INVALID_PARAM)
    failed(acl, acl.rt.mem_pool_malloc_async(16, "pool", None)[1],
           acl.ACL_ERROR_RT_INVALID_HANDLE, "not a memory pool")


def test_mem_pool_free_async_of_no_pool_memory_fails(acl, pool):
    d, _ = acl.rt.malloc(64, 0)
    failed(acl, acl.rt.mem_pool_free_async(d, None), acl.ACL_ERROR_RT_PARAM_INVALID,
           "stream-ordered")
    acl.rt.free(d)


@pytest.mark.parametrize("name", ["REUSE_FOLLOW_EVENT_DEPENDENCIES", "REUSE_ALLOW_OPPORTUNISTIC",
                                  "REUSE_ALLOW_INTERNAL_DEPENDENCIES"])
def test_reuse_switches_under_both_spellings(acl, pool, name):
    header = getattr(acl, f"ACL_RT_MEM_POOL_{name}")
    assert getattr(acl, f"ACL_RT_MEM_POOL_ATTR_{name}") == header
    assert acl.rt.mem_pool_set_attr(pool, header, 0) == 0
    assert acl.rt.mem_pool_get_attr(pool, header) == (0, 0)
    assert pool.get_attr(srt.MemPoolAttr[name]) == 0


def test_release_threshold_and_the_watermarks(acl, pool):
    A = acl
    assert A.rt.mem_pool_set_attr(pool, A.ACL_RT_MEM_POOL_ATTR_RELEASE_THRESHOLD, 4096) == 0
    assert A.rt.mem_pool_get_attr(pool, A.ACL_RT_MEM_POOL_ATTR_RELEASE_THRESHOLD) == (4096, 0)
    s, _ = A.rt.create_stream()
    ptr, _ = A.rt.mem_pool_malloc_async(1024, pool, s)
    used, _ = A.rt.mem_pool_get_attr(pool, A.ACL_RT_MEM_POOL_ATTR_USED_MEM_CURRENT)
    assert used >= 1024
    A.rt.mem_pool_free_async(ptr, s)
    A.rt.synchronize_stream(s)
    assert A.rt.mem_pool_get_attr(pool, A.ACL_RT_MEM_POOL_ATTR_USED_MEM_HIGH)[0] >= 1024
    assert A.rt.mem_pool_set_attr(pool, A.ACL_RT_MEM_POOL_ATTR_USED_MEM_HIGH, 0) == 0
    assert A.rt.mem_pool_get_attr(pool, A.ACL_RT_MEM_POOL_ATTR_USED_MEM_HIGH) == (0, 0)
    reserved, _ = A.rt.mem_pool_get_attr(pool, A.ACL_RT_MEM_POOL_ATTR_RESERVED_MEM_CURRENT)
    assert reserved > 0  # kept: under the threshold
    assert A.rt.mem_pool_get_attr(pool, A.ACL_RT_MEM_POOL_ATTR_RESERVED_MEM_HIGH)[0] >= reserved
    A.rt.destroy_stream(s)


def test_mem_pool_set_attr_refusals(acl, pool):
    failed(acl, acl.rt.mem_pool_set_attr(pool, acl.ACL_RT_MEM_POOL_ATTR_USED_MEM_CURRENT, 1),
           acl.ACL_ERROR_INVALID_PARAM, "read-only")
    failed(acl, acl.rt.mem_pool_set_attr(pool, 9, 1), acl.ACL_ERROR_INVALID_PARAM,
           "aclrtMemPoolAttr")


def test_mem_pool_get_attr_of_no_attr_fails(acl, pool):
    value, ret = acl.rt.mem_pool_get_attr(pool, 0)
    assert value is None
    failed(acl, ret, acl.ACL_ERROR_INVALID_PARAM, "aclrtMemPoolAttr")


def test_mem_pool_trim_to_releases_free_memory(acl, pool):
    s, _ = acl.rt.create_stream()
    acl.rt.mem_pool_set_attr(pool, acl.ACL_RT_MEM_POOL_ATTR_RELEASE_THRESHOLD, 1 << 20)
    ptr, _ = acl.rt.mem_pool_malloc_async(4096, pool, s)
    acl.rt.mem_pool_free_async(ptr, s)
    acl.rt.synchronize_stream(s)
    assert acl.rt.mem_pool_get_attr(pool, acl.ACL_RT_MEM_POOL_ATTR_RESERVED_MEM_CURRENT)[0] > 0
    assert acl.rt.mem_pool_trim_to(pool, 0) == 0
    assert acl.rt.mem_pool_get_attr(pool, acl.ACL_RT_MEM_POOL_ATTR_RESERVED_MEM_CURRENT) == (0, 0)
    acl.rt.destroy_stream(s)


def test_mem_pool_trim_to_a_negative_size_fails(acl, pool):
    failed(acl, acl.rt.mem_pool_trim_to(pool, -1), acl.ACL_ERROR_INVALID_PARAM, ">= 0")


def test_mem_pool_destroy_then_its_use_is_invalid_handle(acl, pool):
    assert acl.rt.mem_pool_destroy(pool) == 0
    failed(acl, acl.rt.mem_pool_destroy(pool), acl.ACL_ERROR_RT_INVALID_HANDLE, "destroyed")
    failed(acl, acl.rt.mem_pool_malloc_async(16, pool, None)[1], acl.ACL_ERROR_RT_INVALID_HANDLE)
