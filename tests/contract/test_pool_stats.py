"""Pool statistics: the high watermarks reset only to the current value; exact-size reuse counts;
each allocation counted by the kind of memory it got (fresh, reused after a synchronize, reused
on its own stream); an OOM that a synchronize would resolve says so."""

from __future__ import annotations

import pytest

import streamrt as srt
from tests.contract.pools import BLOCK, RULES, chunks, served, stream


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


# -- what each allocation is counted as ----------------------------------------------------------
def test_pool_fresh_mallocs_count_as_fresh_not_as_reuse(dev):
    # four small mallocs, no free, no synchronize: the first grows the pool, the next three take
    # the rest of that chunk, which no allocation used (they were counted as reuse_after_sync)
    pool = srt.MemPool(dev)
    s = stream(dev)
    ptrs = [s.malloc(1000, pool) for _ in range(4)]
    st = pool.stats()
    assert (st["grow_count"], st["fresh_count"], st["alloc_count"]) == (1, 3, 4)
    assert [k for k in RULES if k not in ("grow_count", "fresh_count") and st[k]] == []
    assert sum(st[k] for k in RULES) + st["reuse_merged"] == st["alloc_count"]  # one kind each
    for p in ptrs:
        s.free(p)
    pool.destroy()


def test_pool_reuse_after_sync_and_same_stream_reuse_count_apart(dev):
    pool = srt.MemPool(dev, release_threshold=1 << 30)
    a, b = stream(dev), stream(dev)
    p = a.malloc(4096, pool)
    keep = a.malloc(4096, pool)  # fresh: the rest of p's chunk
    a.free(p)
    before = pool.stats()
    assert a.malloc(4096, pool) == p  # freed on a, pending: a's own stream order protects it
    assert served(pool, before) == ["reuse_same_stream"]
    a.free(p)
    a.synchronize()  # the free proven: any stream may take the block
    before = pool.stats()
    assert b.malloc(4096, pool) == p
    assert served(pool, before) == ["reuse_after_sync"]
    before = pool.stats()
    q = b.malloc(4096, pool)  # never used before: fresh, though the pool has synchronized
    assert q not in (p, keep) and served(pool, before) == ["fresh_count"]
    for x in (p, q):
        b.free(x)
    a.free(keep)
    pool.destroy()


def test_pool_fresh_memory_next_to_a_proven_free_is_reuse(dev):
    # a freed block absorbs the fresh rest of its chunk when it coalesces: that block is not fresh
    pool = srt.MemPool(dev, release_threshold=1 << 30)
    s = stream(dev)
    p = s.malloc(4096, pool)  # the top of the chunk; the rest below it is fresh
    s.free(p)
    s.synchronize()
    before = pool.stats()
    q = s.malloc(8192, pool)
    assert served(pool, before) == ["reuse_after_sync"]
    s.free(q)
    pool.destroy()


def test_pool_oom_that_a_synchronize_resolves_says_so(dev, gate):
    pool = srt.MemPool(dev, max_size=2 * BLOCK, reuse_allow_internal_dependencies=False)
    a, b = stream(dev), stream(dev)
    g = gate(b)  # b's frees stay pending: nothing proves them
    ptrs = [b.malloc(BLOCK // 2, pool) for _ in range(4)]
    for p in ptrs:
        b.free(p)
    with pytest.raises(srt.OutOfMemoryError, match=rf"{2 * BLOCK} bytes are freed on streams but "
                       r"not yet reusable by <Stream .*>: synchronize"):
        a.malloc(BLOCK, pool)
    g.open()
    b.synchronize()
    q = a.malloc(BLOCK, pool)  # as the message said
    a.free(q)
    # an OOM no synchronize would resolve does not say it
    with pytest.raises(srt.OutOfMemoryError) as info:
        a.malloc(3 * BLOCK, pool)
    assert "not yet reusable" not in str(info.value)
    pool.destroy()
