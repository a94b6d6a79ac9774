"""API.md §1: devices (registry, attributes, count, current device, memory, pools, reset)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import streamrt as srt

from .conftest import _sub, call_with_timeout, sync

pytestmark = [pytest.mark.api, pytest.mark.timeout(60)]


# ---- devices -------------------------------------------------------------------------------

def test_device_same_spec_same_object():
    assert srt.Device("cpu:0") is srt.Device("cpu:0")
    assert srt.Device("cpu:1") is srt.Device("cpu:1")
    assert srt.Device("cpu") is srt.Device("cpu:0")
    with srt.Device("cpu:0"):
        assert srt.Device(0) is srt.Device("cpu:0")
        assert srt.Device(1) is srt.Device("cpu:1")
        assert srt.Device(None) is srt.current_device()


def test_device_attributes():
    d = srt.Device("cpu:1")
    assert d.backend == "cpu" and d.index == 1 and d.name == "cpu:1"
    assert isinstance(d.index, int)


def test_device_count_default_and_env():
    assert srt.device_count("cpu") == int(os.environ.get("STREAMRT_CPU_DEVICES", 2))
    assert srt.device_count() == srt.device_count("cpu")
    out = _sub("import streamrt as s; print(s.device_count('cpu'))", STREAMRT_CPU_DEVICES="3")
    assert out == "3"


def test_device_current_and_with():
    d0, d1 = srt.Device("cpu:0"), srt.Device("cpu:1")
    d0.set_current()
    assert srt.current_device() is d0
    with d1:
        assert srt.current_device() is d1
        assert srt.Stream().device is d1 if hasattr(srt.Stream(), "device") else True
    assert srt.current_device() is d0


def test_device_memory_info_and_env():
    free, total = srt.Device("cpu:0").memory_info()
    assert isinstance(free, int) and isinstance(total, int) and 0 <= free <= total
    out = _sub("import streamrt as s; print(s.Device('cpu:0').memory_info()[1])",
               STREAMRT_CPU_MEMORY=str(256 << 20))
    assert int(out) == 256 << 20


def test_device_memory_info_counts_allocations():
    d = srt.Device("cpu:0")
    free0, _ = d.memory_info()
    p = srt.malloc(64 << 20, device=d)
    free1, _ = d.memory_info()
    assert free1 <= free0 - (64 << 20)
    srt.free(p)


def test_device_env_cpu_memory_limits_malloc():
    out = _sub(
        "import streamrt as s\n"
        "try:\n    s.malloc(64 << 20)\n"
        "except s.OutOfMemoryError as e:\n    print('oom', isinstance(e, MemoryError))\n",
        STREAMRT_CPU_MEMORY=str(16 << 20))
    assert out == "oom True"


def test_device_pools(dev):
    assert isinstance(dev.default_mem_pool, srt.MemPool)
    assert dev.mem_pool is dev.default_mem_pool
    pool = srt.MemPool(dev)
    dev.set_mem_pool(pool)
    try:
        assert dev.mem_pool is pool
        s = srt.Stream()
        p = s.malloc(1000)
        assert pool.used_mem_current >= 1000
        s.free(p)
        sync(s)
    finally:
        dev.set_mem_pool(dev.default_mem_pool)
    assert dev.mem_pool is dev.default_mem_pool


def test_device_reset_destroys_then_usable():
    d = srt.Device("cpu:1")
    with d:
        s = srt.Stream()
        p = srt.malloc(4096)
        s.memset(p, 1, 4096)
        call_with_timeout(d.reset)
        # device still usable afterwards
        q = srt.malloc(16)
        srt.memset(q, 7, 16)
        assert (srt.read(q, (16,), np.uint8) == 7).all()
        srt.free(q)


def test_device_reset_destroys_streams_and_pools():
    d = srt.Device("cpu:1")
    with d:
        s = srt.Stream(non_blocking=True)
        pool = srt.MemPool(d)
        p = s.malloc(1024, pool)
        call_with_timeout(d.reset)
        with pytest.raises(srt.StreamRTError):
            s.launch_host_func(lambda: None)
        with pytest.raises(srt.StreamRTError):
            srt.read(p, (4,), np.uint8)
        s2 = srt.Stream(non_blocking=True)
        q = s2.malloc(64)
        s2.free(q)
        sync(s2)
