"""Pool limits: out of memory (its message and the state it leaves), ``max_size``, the device's
capacity, and the largest free block."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from tests.contract.pools import BLOCK, chunks, stream, without


# -- OOM and max_size --------------------------------------------------------------------------
def test_pool_oom_message_and_state(dev):
    limit = 5 << 20
    pool = srt.MemPool(dev, max_size=limit)
    s = stream(dev)
    a, b = chunks(pool, s, 2)
    s.free(b)  # 4 MiB reserved, 2 MiB used, b's free 2 MiB at the top of the arena
    before = pool.stats()
    with pytest.raises(srt.OutOfMemoryError) as info:
        s.malloc(3_500_000, pool)  # b's block grown to the limit is still 3 MiB: too small
    err = info.value
    assert isinstance(err, MemoryError) and isinstance(err, srt.StreamRTError)
    msg = str(err)
    assert "3500000" in msg  # the requested size
    assert str(4 << 20) in msg  # pool reserved
    assert str(2 << 20) in msg  # pool used
    assert str(limit) in msg  # the limit
    after = pool.stats()
    assert after["oom_count"] == before["oom_count"] + 1
    assert without(after, "oom_count") == without(before, "oom_count")
    assert s.malloc(BLOCK, pool) == b  # still fully usable
    s.free(a)
    s.free(b)


def test_pool_max_size_respected(dev):
    limit = 3 << 20
    pool = srt.MemPool(dev, max_size=limit)
    s = stream(dev)
    a = s.malloc(BLOCK, pool)  # fills the first 2 MiB granule
    small = s.malloc(512, srt.MemPool(dev, max_size=limit))  # another pool: one granule fits
    with pytest.raises(srt.OutOfMemoryError):
        s.malloc(512, pool)  # memory is mapped by whole granules: a second one passes 3 MiB
    with pytest.raises(srt.OutOfMemoryError):
        s.malloc(limit + 1, pool)
    assert pool.reserved_mem_current == BLOCK
    assert pool.reserved_mem_high <= limit
    assert pool.get_attr(srt.MemPoolAttr.RESERVED_MEM_HIGH) <= limit
    s.free(a)
    b = s.malloc(512, pool)  # a's granule, freed on this stream: usable again
    assert a <= b < a + BLOCK
    s.free(b)
    s.free(small)


def test_pool_largest_free_block_counts_only_memory_it_holds(dev):
    # free addresses whose granules went back to the device were counted as a free block:
    # reserved 0, largest_free_block 4 MiB
    pool = srt.MemPool(dev)  # threshold 0: released at each synchronize
    s = stream(dev)
    x = s.malloc(2 * BLOCK, pool)
    s.free(x)
    s.synchronize()
    st = pool.stats()
    assert st["reserved_mem_current"] == 0 and st["largest_free_block"] == 0
    y = s.malloc(BLOCK // 2, pool)  # maps one granule of the old block again
    st = pool.stats()
    assert st["reserved_mem_current"] == BLOCK
    assert st["largest_free_block"] == BLOCK // 2 == st["reserved_mem_current"] - st["used_mem_current"]
    s.free(y)


@pytest.mark.parametrize("limit", [64 << 10, 1 << 20, (1 << 20) + 4096, 3 << 19])
def test_pool_max_size_below_a_granule_serves_up_to_its_size(dev, limit):
    # a pool smaller than the 2 MiB mapping granule could not map anything: every allocation,
    # 20 bytes included, was OutOfMemoryError; it maps in granules of about a sixteenth of it,
    # so allocations of three quarters of its limit fit (each wastes less than a granule)
    pool = srt.MemPool(dev, max_size=limit)
    s = stream(dev)
    tiny = s.malloc(20, pool)
    part = limit // 4 - 512
    ptrs = [s.malloc(part, pool) for _ in range(3)]
    assert pool.reserved_mem_current <= limit and pool.used_mem_current == 512 + 3 * (
        (part + 511) // 512 * 512)
    with pytest.raises(srt.OutOfMemoryError):
        s.malloc(limit // 2, pool)  # past the limit
    for i, p in enumerate(ptrs):
        s.memset(p, i + 1, part)
    s.synchronize()
    assert [int(srt.read(p, (part,), np.uint8).min()) for p in ptrs] == [1, 2, 3]
    for p in (tiny, *ptrs):
        s.free(p)
    s.synchronize()
    assert pool.reserved_mem_current == 0  # threshold 0: released at the synchronize
    assert pool.reserved_mem_high <= limit


def test_pool_max_size_skips_a_block_it_could_not_map_again(dev, gate):
    # max_size bounds mapped (reserved) bytes, not used ones: a ready block whose granule went
    # back to the device is usable only if mapping it again fits; if not, the next step serves
    pool = srt.MemPool(dev, max_size=3 * BLOCK)  # threshold 0
    s, t = stream(dev), stream(dev)
    a, b = chunks(pool, s, 2)
    s.free(a)
    s.synchronize()  # a's granule is released; its addresses stay a ready free block
    assert pool.reserved_mem_current == BLOCK
    g = gate(s)
    big = s.malloc(2 * BLOCK, pool)  # does not fit a's block: grows to the limit
    s.memset(big, 1, 2 * BLOCK)
    s.free(big)  # pending behind the gate
    st = pool.stats()
    assert (st["reserved_mem_current"], st["used_mem_current"]) == (3 * BLOCK, BLOCK)
    before = pool.stats()
    q = t.malloc(BLOCK, pool)  # a's block would need 2 more MiB mapped: past max_size
    assert q == big
    assert [k for k in ("reuse_after_sync", "grow_count", "reuse_internal_dependency")
            if pool.stats()[k] != before[k]] == ["reuse_internal_dependency"]
    assert pool.reserved_mem_current == 3 * BLOCK
    g.open()
    t.memset(q, 2, BLOCK)  # ordered after big's free by the internal dependency
    t.free(q)
    s.free(b)
    dev.synchronize()
    assert pool.reserved_mem_current == 0


def test_pool_device_oom_without_pool_limit(dev):
    pool = srt.MemPool(dev)
    s = stream(dev)
    before = pool.stats()
    free, total = dev.memory_info()
    with pytest.raises(srt.OutOfMemoryError) as info:
        s.malloc(total + (1 << 40), pool)
    assert "no pool limit" in str(info.value)
    assert without(pool.stats(), "oom_count") == without(before, "oom_count")
    assert dev.memory_info()[0] == free


def test_pool_device_oom_after_a_merge_keeps_the_merged_free_pending(dev, gate, monkeypatch):
    # Before growing, a ready block and a neighbour pending on a are merged for a's request; when
    # the device cannot back the ready part, the rollback must leave the merged block pending on
    # a (not ready: another stream would take a's memory while a's work on it is pending).
    pool = srt.MemPool(dev, reuse_follow_event_dependencies=False, reuse_allow_opportunistic=False,
                       reuse_allow_internal_dependencies=False)
    a, b, c = stream(dev), stream(dev), stream(dev)
    x = b.malloc(BLOCK, pool)
    y = a.malloc(BLOCK, pool)
    assert y == x + BLOCK  # neighbours, each on a granule of its own
    gate(a)
    a.memset(y, 1, BLOCK)
    a.free(y)  # pending on a, behind the gate
    b.free(x)
    b.synchronize()  # x ready (not merged with y, pending on a), and its granule released
    assert pool.stats()["reserved_mem_current"] == BLOCK
    monkeypatch.setattr(dev._impl, "capacity", dev._impl._used)  # the device is full
    before = pool.stats()
    with pytest.raises(srt.OutOfMemoryError):
        a.malloc(2 * BLOCK, pool)  # merges x and y, then cannot map x's granule
    assert without(pool.stats(), "oom_count") == without(before, "oom_count")
    monkeypatch.undo()
    q = c.malloc(512, pool)  # c has no order with a: y is not reusable by c
    assert not x <= q < y + BLOCK
    after = pool.stats()
    assert (after["grow_count"], after["reuse_after_sync"]) == (before["grow_count"] + 1,
                                                               before["reuse_after_sync"])


def test_backend_pool_limit_raises_out_of_memory(bdev):
    s = srt.Stream(bdev, non_blocking=True)
    pool = srt.MemPool(bdev, max_size=64 << 20)
    with pytest.raises(srt.OutOfMemoryError):
        s.malloc(256 << 20, pool)
    p = s.malloc(1 << 20, pool)  # the pool still works
    s.free(p)
    s.synchronize()
    pool.destroy()
