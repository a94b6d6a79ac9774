"""The device's default and current pool (``default_mem_pool``, ``set_mem_pool``, ``mem_pool``)."""

from __future__ import annotations

import pytest

import streamrt as srt
from tests.contract.pools import stream


# -- device pools ------------------------------------------------------------------------------
def test_pool_device_default_and_current_pool(dev):
    default = dev.default_mem_pool
    assert dev.default_mem_pool is default
    assert dev.mem_pool is default
    assert srt.Device("cpu:1").default_mem_pool is not default
    assert default.device is dev
    pool = srt.MemPool(dev)
    s = stream(dev)
    dev.set_mem_pool(pool)
    try:
        assert dev.mem_pool is pool
        assert dev.default_mem_pool is default
        before = default.stats()
        p = s.malloc(100)  # no pool: the device's current pool
        assert pool.stats()["alloc_count"] == 1 and default.stats() == before
        s.free(p)
        with pytest.raises(srt.InvalidTypeError):
            dev.set_mem_pool("pool")
        with pytest.raises(srt.InvalidValueError):
            dev.set_mem_pool(srt.Device("cpu:1").default_mem_pool)
        assert dev.mem_pool is pool
        s.synchronize()
        pool.destroy()
        assert dev.mem_pool is default  # destroying the current pool falls back to the default
        with pytest.raises(srt.InvalidHandleError):
            dev.set_mem_pool(pool)
        q = s.malloc(100)
        assert default.stats()["alloc_count"] == before["alloc_count"] + 1
        s.free(q)
    finally:
        dev.set_mem_pool(default)


def test_backend_default_pool_and_current_pool(bdev):
    s = srt.Stream(bdev, non_blocking=True)
    pool = srt.MemPool(bdev)
    bdev.set_mem_pool(pool)
    try:
        p = s.malloc(1024)
        assert srt.pool.find_pool(p) is pool
        s.free(p)
    finally:
        bdev.set_mem_pool(bdev.default_mem_pool)
    q = s.malloc(1024)
    assert srt.pool.find_pool(q) is bdev.default_mem_pool
    s.free(q)
    s.synchronize()
    pool.destroy()
