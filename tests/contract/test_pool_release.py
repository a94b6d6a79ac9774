"""Pool memory going back to the device: release threshold (at synchronize points only), trim_to,
destroy, dropped and collected pools, granules mapped again."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from tests.contract.pools import BIG, BLOCK, chunks, executed, stream


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


def test_pool_dropped_pool_keeps_memory_until_its_frees_are_proven(dev, gate):
    import gc

    from tests.conftest import fill_kernel

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
    from tests.conftest import reentry_lock

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


def test_backend_pool_trim_to_keeps_its_argument(bdev):
    # cudaMemPoolTrimTo: "the pool will be guaranteed to have at least minBytesToKeep bytes
    # reserved after the operation"
    pool = srt.MemPool(bdev, release_threshold=1 << 30)  # synchronize releases nothing
    s = srt.Stream(bdev, non_blocking=True)
    for p in [s.malloc(2 << 20, pool) for _ in range(3)]:
        s.free(p)
    s.synchronize()
    assert pool.reserved_mem_current >= 6 << 20
    pool.trim_to(3 << 20)
    assert pool.reserved_mem_current >= 3 << 20
    pool.trim_to(0)
    assert pool.reserved_mem_current == 0
    pool.destroy()


def test_backend_free_of_pool_memory_is_a_synchronize_of_the_pool(bdev):
    # srt.free returns once the memory is freed: a synchronize point, where a pool releases
    # what it holds above its threshold (0 here)
    pool = srt.MemPool(bdev)
    s = srt.Stream(bdev, non_blocking=True)
    p = s.malloc(2 << 20, pool)
    s.memset(p, 0, 2 << 20)
    s.synchronize()
    assert pool.reserved_mem_current >= 2 << 20
    srt.free(p)
    assert pool.reserved_mem_current == 0 and pool.used_mem_current == 0
    pool.destroy()


def test_backend_synchronize_of_a_stream_that_only_allocated_and_freed(bdev):
    # pool allocations and frees are work of their stream: its synchronize is a synchronize
    # point even when it did nothing else (on cuda it returned at once, so the driver never
    # released the memory down to the threshold, 0 here)
    pool = srt.MemPool(bdev)
    s = srt.Stream(bdev, non_blocking=True)
    s.free(s.malloc(2 << 20, pool))
    s.synchronize()
    assert pool.reserved_mem_current == 0
    pool.destroy()
