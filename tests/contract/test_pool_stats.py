"""Pool statistics: the high watermarks reset only to the current value; exact-size reuse counts."""

from __future__ import annotations

import pytest

import streamrt as srt
from tests.contract.pools import BLOCK, chunks, stream


# -- watermarks ------------------------------------------------------------------------------
def test_pool_watermarks_reset_only_to_current_value(dev):
    pool = srt.MemPool(dev)
    s = stream(dev)
    a, b, c = chunks(pool, s, 3)
    s.free(a)
    s.free(b)
    s.synchronize()
    st = pool.stats()
    assert (st["reserved_mem_current"], st["used_mem_current"]) == (BLOCK, BLOCK)
    assert (st["reserved_mem_high"], st["used_mem_high"]) == (3 * BLOCK, 3 * BLOCK)
    pool.used_mem_high = 0
    assert pool.used_mem_high == BLOCK  # reset to the current value, not to 0
    assert pool.reserved_mem_high == 3 * BLOCK
    pool.set_attr(srt.MemPoolAttr.RESERVED_MEM_HIGH, 0)
    assert pool.get_attr(srt.MemPoolAttr.RESERVED_MEM_HIGH) == BLOCK
    before = pool.stats()
    for attr in (srt.MemPoolAttr.RESERVED_MEM_HIGH, srt.MemPoolAttr.USED_MEM_HIGH):
        with pytest.raises(srt.InvalidValueError):
            pool.set_attr(attr, 5)
        with pytest.raises(srt.InvalidValueError):
            pool.set_attr(attr, -1)
    with pytest.raises(srt.InvalidValueError):
        pool.reserved_mem_high = 3 * BLOCK
    with pytest.raises(srt.InvalidValueError):
        pool.used_mem_high = 1
    assert pool.stats() == before
    s.free(c)
    d = s.malloc(BLOCK, pool)
    e = s.malloc(BLOCK, pool)
    assert pool.used_mem_high == 2 * BLOCK  # grows again from the reset value
    s.free(d)
    s.free(e)


def test_pool_used_high_grows_on_exact_size_reuse(dev):
    # the same-stream exact-size reuse (the pool's fast path) must move the watermark too
    pool = srt.MemPool(dev)
    s = stream(dev)
    p = s.malloc(4096, pool)
    s.free(p)
    pool.used_mem_high = 0  # reset to the current value: 0
    assert pool.used_mem_high == 0
    before = pool.stats()
    q = s.malloc(4096, pool)
    assert q == p and pool.stats()["reuse_same_stream"] == before["reuse_same_stream"] + 1
    assert pool.used_mem_high == pool.used_mem_current == 4096
    s.free(q)
    assert pool.used_mem_high == 4096
