"""Stream-ordered pool allocation on every backend: malloc and free on streams, attributes and reuse
flags given at creation, zero-byte allocations."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from tests.contract.backend_kernels import add_one


def test_backend_pool_stream_ordered_allocation(bdev):
    s1, s2 = srt.Stream(bdev, non_blocking=True), srt.Stream(bdev, non_blocking=True)
    pool = srt.MemPool(bdev, release_threshold=1 << 20)
    assert pool.get_attr(srt.MemPoolAttr.RELEASE_THRESHOLD) == 1 << 20
    assert pool.reuse_allow_opportunistic is True
    pool.reuse_allow_opportunistic = False
    assert pool.get_attr(srt.MemPoolAttr.REUSE_ALLOW_OPPORTUNISTIC) == 0
    n = 4096
    p = s1.malloc(4 * n, pool)
    s1.memcpy(p, np.arange(n, dtype=np.float32), 4 * n)
    s1.launch(add_one, p, n, grid=n // 256, block=256)
    back = np.empty(n, np.float32)
    s1.memcpy(back, p, 4 * n)
    assert np.array_equal(back, np.arange(n, dtype=np.float32) + 1)
    e = s1.record()
    s2.wait(e)
    s2.free(p)  # freed on another stream than it was allocated on
    s2.synchronize()
    st = pool.stats()
    assert st["alloc_count"] == 1 and st["free_count"] == 1
    assert st["used_mem_current"] == 0
    assert st["reserved_mem_high"] >= 4 * n and st["used_mem_high"] >= 4 * n
    pool.set_attr(srt.MemPoolAttr.USED_MEM_HIGH, 0)
    assert pool.used_mem_high == pool.used_mem_current
    with pytest.raises(srt.InvalidValueError):
        pool.set_attr(srt.MemPoolAttr.USED_MEM_CURRENT, 0)
    with pytest.raises(srt.InvalidAddressError):
        s1.free(p)  # double free
    pool.trim_to(0)
    assert pool.reserved_mem_current == 0
    pool.destroy()
    with pytest.raises(srt.InvalidValueError):
        bdev.default_mem_pool.destroy()


_REUSE_FLAGS = ("reuse_follow_event_dependencies", "reuse_allow_opportunistic",
                "reuse_allow_internal_dependencies")


@pytest.mark.parametrize("off", _REUSE_FLAGS)
def test_backend_pool_created_with_one_reuse_flag_off(bdev, off):
    # each constructor flag reaches its own attribute (a native pool sets them by number)
    pool = srt.MemPool(bdev, **{off: False})
    for flag in _REUSE_FLAGS:
        assert pool.get_attr(srt.MemPoolAttr[flag.upper()]) == (flag != off), flag
    pool.destroy()


def test_backend_pool_zero_byte_allocations(bdev):
    # as malloc(0) in C: distinct live pointers, each freed once (CUDA's allocators may refuse
    # a size of 0, as cuMemAlloc documents: the backend must not pass it on)
    pool = srt.MemPool(bdev)
    s = srt.Stream(bdev, non_blocking=True)
    a, b = s.malloc(0, pool), s.malloc(0, pool)
    assert a and b and a != b
    s.free(a)
    s.free(b)
    with pytest.raises(srt.InvalidAddressError):
        s.free(a)
    s.synchronize()
    pool.destroy()
