"""Pool memory going back to the device: release threshold, trim_to, watermarks, OOM, destroy,
and the device's default/current pool."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt

BLOCK = 2 << 20  # a whole granule
BIG = 1 << 30


def stream(dev) -> srt.Stream:
    return srt.Stream(dev, non_blocking=True)


def chunks(pool: srt.MemPool, s: srt.Stream, n: int) -> list[int]:
    """``n`` whole-chunk allocations, each written by ``s``."""
    ptrs = [s.malloc(BLOCK, pool) for _ in range(n)]
    for p in ptrs:
        s.memset(p, 0, BLOCK)
    return ptrs


def executed(s: srt.Stream) -> None:
    """Return once ``s`` has executed everything enqueued so far, without a host synchronize."""
    ran = threading.Event()
    s.launch_host_func(ran.set)
    assert ran.wait(timeout=30)


def without(d: dict, *keys: str) -> dict:
    return {k: v for k, v in d.items() if k not in keys}


# -- release threshold: only at synchronize points ------------------------------------------------
@pytest.mark.parametrize("how", ["stream", "event", "device"])
def test_pool_release_threshold_applied_at_synchronize(dev, how):
    pool = srt.MemPool(dev)  # threshold 0
    s = stream(dev)
    (p,) = chunks(pool, s, 1)
    s.free(p)
    e = s.record()
    executed(s)  # the free has run...
    assert e.query()  # ...and a query says so, but a query is not a synchronize
    assert pool.reserved_mem_current == BLOCK
    assert pool.stats()["release_count"] == 0
    {"stream": s.synchronize, "event": e.synchronize, "device": dev.synchronize}[how]()
    assert pool.reserved_mem_current == 0
    assert pool.stats()["release_count"] == 1


def test_pool_threshold_releases_only_sync_proven_frees(dev):
    pool = srt.MemPool(dev)
    s, t = stream(dev), stream(dev)
    (p,) = chunks(pool, s, 1)
    s.free(p)
    executed(s)  # complete, but not proven by a host synchronize
    executed(t)
    t.synchronize()  # a synchronize point, but it proves nothing about s
    dev.default_stream.synchronize()  # neither does this one
    assert pool.reserved_mem_current == BLOCK
    s.synchronize()
    assert pool.reserved_mem_current == 0


def test_pool_release_threshold_keeps_reserved(dev):
    pool = srt.MemPool(dev, release_threshold=2 * BLOCK)
    s = stream(dev)
    for p in chunks(pool, s, 3):
        s.free(p)
    s.synchronize()
    assert pool.reserved_mem_current == 2 * BLOCK  # one of three chunks released
    assert pool.stats()["release_count"] == 1
    pool.release_threshold = 0
    assert pool.get_attr(srt.MemPoolAttr.RELEASE_THRESHOLD) == 0
    assert pool.reserved_mem_current == 2 * BLOCK  # a new threshold waits for a synchronize
    dev.synchronize()
    assert pool.reserved_mem_current == 0


def test_pool_release_keeps_chunks_with_live_allocations(dev):
    pool = srt.MemPool(dev)
    s = stream(dev)
    a, b = chunks(pool, s, 2)
    small = s.malloc(100, pool)
    s.free(a)
    s.synchronize()
    assert pool.reserved_mem_current == BLOCK + (2 << 20)  # b's chunk and the small chunk
    s.memset(b, 1, BLOCK)  # b is still valid memory
    s.memset(small, 1, 100)
    s.free(b)
    s.free(small)
    s.synchronize()
    assert pool.reserved_mem_current == 0



def test_pool_release_never_unmaps_a_granule_a_live_block_reaches_into(dev):
    # a 3 MiB block takes the low end of two granules; the free rest, [3 MiB, 4 MiB), lies in
    # the upper granule, which the live block still uses: a release must not unmap it
    pool = srt.MemPool(dev)  # threshold 0
    s = stream(dev)
    a = s.malloc(3 << 20, pool)
    s.synchronize()  # a synchronize point with a ready free block in a shared granule
    assert pool.reserved_mem_current == 2 * BLOCK
    assert pool.stats()["release_count"] == 0
    s.memset(a, 7, 3 << 20)  # all of a is still memory
    s.synchronize()
    assert (srt.read(a + (3 << 20) - 4096, (4096,), np.uint8) == 7).all()
    s.free(a)
    s.synchronize()
    assert pool.reserved_mem_current == 0


@pytest.mark.parametrize("blocking", [False, True])
def test_pool_threshold_not_applied_at_malloc_or_free(dev, blocking):
    # DESIGN.md §3: the threshold acts only at a synchronize; a lowered threshold must wait for
    # one, even when allocations and frees (the slow path of a blocking stream too) happen first
    pool = srt.MemPool(dev, release_threshold=BIG)
    s = stream(dev)
    a, b, c = chunks(pool, s, 3)
    s.free(a)
    s.free(c)  # b stays live between them: two ready blocks after the synchronize
    s.synchronize()
    assert pool.reserved_mem_current == 3 * BLOCK
    pool.release_threshold = 0
    t = srt.Stream(dev, non_blocking=not blocking)
    x = t.malloc(512, pool)  # from one ready block; its free leaves the other one ready
    t.memset(x, 1, 512)
    t.free(x)
    assert pool.reserved_mem_current == 3 * BLOCK
    assert pool.stats()["release_count"] == 0
    dev.synchronize()
    assert pool.reserved_mem_current == BLOCK  # b's
    s.free(b)
    s.synchronize()
    assert pool.reserved_mem_current == 0

# -- trim_to ---------------------------------------------------------------------------------
def test_pool_trim_to_keeps_at_least_its_argument_and_wins_over_threshold(dev):
    pool = srt.MemPool(dev, release_threshold=BIG)
    s = stream(dev)
    for p in chunks(pool, s, 3):
        s.free(p)
    s.synchronize()
    assert pool.reserved_mem_current == 3 * BLOCK  # the threshold kept everything
    pool.trim_to(3 << 20)  # 3 MiB: 6 -> 4 MiB; 4 -> 2 would drop below the argument
    assert pool.reserved_mem_current == 2 * BLOCK
    before = pool.stats()
    pool.trim_to(2 * BLOCK)  # reserved <= k: a no-op
    pool.trim_to(BIG)
    assert pool.stats() == before
    pool.trim_to(0)  # an explicit trim wins over the 1 GiB threshold
    assert pool.reserved_mem_current == 0
    assert pool.stats()["release_count"] == 3
    s.synchronize()
    assert pool.reserved_mem_current == 0


def test_pool_trim_to_skips_pending_and_live_memory(dev, gate):
    pool = srt.MemPool(dev, release_threshold=BIG)
    s = stream(dev)
    live, freed = chunks(pool, s, 2)
    g = gate(s)
    s.memset(freed, 1, BLOCK)
    s.free(freed)  # pending behind the gate
    before = pool.stats()
    pool.trim_to(0)
    assert pool.stats() == before  # nothing proven free: nothing released
    g.open()
    s.synchronize()
    pool.trim_to(0)
    assert pool.reserved_mem_current == BLOCK  # the live chunk stays
    s.memset(live, 2, BLOCK)
    s.free(live)
    s.synchronize()
    pool.trim_to(0)
    assert pool.reserved_mem_current == 0


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


# -- destroy -------------------------------------------------------------------------------------
def test_pool_destroy_deferred_until_last_allocation_freed(dev, gate):
    pool = srt.MemPool(dev, release_threshold=BIG)
    s = stream(dev)
    (p,) = chunks(pool, s, 1)
    q = s.malloc(BLOCK, pool)
    s.free(q)
    s.synchronize()  # q's chunk is free and proven; p's is live
    free_before = dev.memory_info()[0]
    pool.destroy()
    assert pool.reserved_mem_current == BLOCK  # the free chunk went back at once, not p's
    assert dev.memory_info()[0] == free_before + BLOCK
    with pytest.raises(srt.InvalidHandleError):
        s.malloc(512, pool)
    with pytest.raises(srt.InvalidHandleError):
        pool.destroy()
    g = gate(s)
    s.memset(p, 7, BLOCK)  # still valid memory
    s.free(p)  # pending behind the gate
    assert pool.reserved_mem_current == BLOCK
    g.open()
    s.synchronize()  # the last free is proven: the memory goes back
    assert pool.reserved_mem_current == 0
    assert dev.memory_info()[0] == free_before + 2 * BLOCK


def test_pool_device_synchronize_proves_frees_of_destroyed_stream(dev):
    pool = srt.MemPool(dev)
    s = stream(dev)
    (p,) = chunks(pool, s, 1)
    s.free(p)
    s.destroy()  # the free still completes...
    dev.synchronize()  # ...and the device synchronize proves it
    assert pool.reserved_mem_current == 0


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



def test_pool_dropped_pool_keeps_memory_until_its_frees_are_proven(dev, gate):
    import gc

    from .conftest import fill_kernel

    s = stream(dev)
    g = gate(s)
    pool = srt.MemPool(dev)
    x = s.malloc(4096, pool)
    s.launch(fill_kernel, x, 1024, 3.0)  # behind the gate: it has not run yet
    s.free(x)
    arena = pool._arena.base
    del pool
    gc.collect()
    assert arena in dev._impl._arenas  # the kernel still needs the pool's memory
    g.open()
    s.synchronize()  # a LaunchError here would mean the memory went away under the kernel
    gc.collect()
    assert arena not in dev._impl._arenas  # proven and unreferenced: given back


def test_pool_released_granules_are_mapped_again_on_reuse(dev):
    pool = srt.MemPool(dev)  # threshold 0
    s = stream(dev)
    a, b = chunks(pool, s, 2)  # two granules, a below b
    assert b == a + BLOCK
    s.free(a)
    s.synchronize()  # a's granule goes back to the device; its addresses stay free
    assert pool.reserved_mem_current == BLOCK
    free_dev = dev.memory_info()[0]
    s.free(b)  # absorbs a's free block: one free block over both granules, pending on s
    c = s.malloc(2 * BLOCK, pool)  # lands on both granules: a's is mapped again
    assert c == a
    st = pool.stats()
    assert st["reserved_mem_current"] == 2 * BLOCK >= st["used_mem_current"] == 2 * BLOCK
    assert dev.memory_info()[0] == free_dev - BLOCK  # the device counts the granule again
    s.memset(c, 5, 2 * BLOCK)
    s.synchronize()
    assert (srt.read(c, (2 * BLOCK,), np.uint8) == 5).all()
    s.free(c)
    s.synchronize()
    assert pool.reserved_mem_current == 0


def test_pool_collected_inside_a_locked_section_gives_its_arena_back_later(dev, monkeypatch):
    # the garbage collector may run a dropped pool's finalizer on a thread inside a section of the
    # address space: the release of the arena waits for the lock instead of taking it again
    import gc

    from streamrt.backends.cpu import SPACE

    from .conftest import reentry_lock

    s = stream(dev)
    pool = srt.MemPool(dev)
    s.free(s.malloc(4096, pool))
    s.synchronize()
    arena = pool._arena.base
    lock = reentry_lock(monkeypatch, SPACE)
    with lock:
        del pool
        gc.collect()  # the pool's finalizer runs here
        assert arena in dev._impl._arenas  # its release waits for the lock
    assert lock.reentered == []
    srt.free(srt.malloc(64, dev))  # the next update of the address space runs it
    assert arena not in dev._impl._arenas
