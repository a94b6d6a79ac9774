"""Pool reuse rules (DESIGN.md §3 steps 1-6), best fit, split/coalesce, rounding, ownership.

"Not yet complete" is made certain with a closed gate; "already executed without a host
synchronize" with a host function that sets a ``threading.Event`` after the free.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt

BLOCK = 2 << 20  # a whole chunk: no fresh remainder competes with the block under test
BIG = 1 << 30  # a release threshold that keeps every chunk
RULES = (
    "reuse_same_stream", "reuse_after_sync", "reuse_event_dependency", "reuse_opportunistic",
    "grow_count", "reuse_internal_dependency",
)
FLAG_NAMES = (
    "reuse_follow_event_dependencies", "reuse_allow_opportunistic",
    "reuse_allow_internal_dependencies",
)


@srt.kernel
def snapshot_kernel(ctx, ptr, n, out):
    """Pending work of a block's owner: records the bytes it sees."""
    out.append(ctx.array(ptr, (n,), np.uint8, readonly=True).copy())


def served(pool: srt.MemPool, before: dict) -> list[str]:
    """The step counters that moved since ``before``."""
    after = pool.stats()
    return [r for r in RULES if after[r] != before[r]]


def stream(dev) -> srt.Stream:
    return srt.Stream(dev, non_blocking=True)


def pool_with(dev, flag: bool | None = None, **kw) -> srt.MemPool:
    """A pool that keeps its chunks at synchronize; ``flag`` sets all three reuse flags."""
    kw.setdefault("release_threshold", BIG)
    if flag is not None:
        kw.update(dict.fromkeys(FLAG_NAMES, flag))
    return srt.MemPool(dev, **kw)


def used_then_freed(pool: srt.MemPool, s: srt.Stream, size: int = BLOCK, value: int = 0x11) -> int:
    """A block that ``s`` writes and then frees (the free is not at stream position 0)."""
    p = s.malloc(size, pool)
    s.memset(p, value, size)
    s.free(p)
    return p


def executed(s: srt.Stream) -> None:
    """Return once ``s`` has executed everything enqueued so far, without a host synchronize."""
    ran = threading.Event()
    s.launch_host_func(ran.set)
    assert ran.wait(timeout=30)


# -- step 1: same stream ----------------------------------------------------------------------
@pytest.mark.parametrize("flags", [True, False])
def test_pool_reuse_same_stream_always(dev, gate, flags):
    pool = pool_with(dev, flags)
    s = stream(dev)
    gate(s)
    p = used_then_freed(pool, s)
    before = pool.stats()
    q = s.malloc(BLOCK, pool)  # the free is pending, but stream order protects the block
    assert q == p
    assert served(pool, before) == ["reuse_same_stream"]


def test_pool_no_reuse_across_unrelated_streams_while_pending(dev, gate):
    pool = pool_with(dev)
    a, b = stream(dev), stream(dev)
    gate(b)
    p = used_then_freed(pool, b)
    before = pool.stats()
    q = a.malloc(BLOCK, pool)
    assert q != p
    assert served(pool, before) == ["grow_count"]


# -- step 2: after a host synchronize ---------------------------------------------------------
@pytest.mark.parametrize("flags", [True, False])
def test_pool_reuse_after_sync_whatever_the_flags(dev, flags):
    pool = pool_with(dev, flags)
    a, b = stream(dev), stream(dev)
    p = used_then_freed(pool, b)
    b.synchronize()
    before = pool.stats()
    q = a.malloc(BLOCK, pool)
    assert q == p
    assert served(pool, before) == ["reuse_after_sync"]


def _entered(queue, monkeypatch) -> threading.Event:
    """Set once a thread blocks in ``queue.wait_done`` (its synchronize has read what it waits for)."""
    inside = threading.Event()
    real = queue.wait_done

    def wait_done(pos):
        inside.set()
        real(pos)

    monkeypatch.setattr(queue, "wait_done", wait_done)
    return inside


@pytest.mark.parametrize("how", ["stream", "device", "memcpy", "event"])
def test_pool_sync_does_not_prove_work_enqueued_while_it_waited(dev, gate, monkeypatch, how):
    # While a synchronize of s (of its device, a copy into pageable memory, an event of s)
    # blocks, another thread orders s after b's pending free (or records the event on b). The
    # synchronize never waited for b, so b's free is not "after sync" for a third stream. Each
    # once proved what it read after waiting: the stream's live clock, the event's new record.
    other = srt.Device("cpu:1")
    pool = pool_with(other, False)
    s = stream(other if how == "event" else dev)  # an event is recorded on its own device only
    b, c = stream(other), stream(other)
    g_s, g_b = gate(s), gate(b)
    p = used_then_freed(pool, b)
    src = srt.malloc(16, device=dev)
    ev = s.record()
    inside = _entered(s._q, monkeypatch)
    sync = {"stream": s.synchronize, "device": dev.synchronize, "event": ev.synchronize,
            "memcpy": lambda: s.memcpy(np.empty(16, np.uint8), src, 16)}[how]
    t = threading.Thread(target=sync)
    t.start()
    assert inside.wait(timeout=30)
    if how == "event":
        b.record(ev)
    else:
        s.wait(b.record())
    g_s.open()
    t.join(timeout=30)
    assert not t.is_alive()
    c.synchronize()  # an idle stream of b's device: the pool looks at what the host saw
    before = pool.stats()
    q = c.malloc(BLOCK, pool)
    assert q != p  # b is still held by its gate: its free cannot have run
    assert served(pool, before) == ["grow_count"]
    g_b.open()
    other.synchronize()
    srt.free(src)


def test_pool_event_sync_proves_only_the_clock_of_its_record(dev, gate):
    # An event synchronize proves the event's clock, not the one its stream has now: s waits on
    # b's pending free after e was recorded, so synchronizing e proves nothing about b.
    pool = pool_with(dev, False)
    s, b, c = stream(dev), stream(dev), stream(dev)
    g = gate(b)
    p = used_then_freed(pool, b)
    s.launch_host_func(lambda: None)
    e = s.record()
    s.wait(b.record())
    e.synchronize()
    before = pool.stats()
    q = c.malloc(BLOCK, pool)
    assert q != p  # b is still held by its gate: its free cannot have run
    assert served(pool, before) == ["grow_count"]
    g.open()


def test_pool_completed_but_unsynchronized_free_is_not_after_sync(dev):
    pool = pool_with(dev, False)
    a, b = stream(dev), stream(dev)
    p = used_then_freed(pool, b)
    e = b.record()
    executed(b)  # the free has run, but no host synchronize proved it
    assert e.query()  # a query that answers True is not a synchronize either
    before = pool.stats()
    q = a.malloc(BLOCK, pool)
    assert q != p
    assert served(pool, before) == ["grow_count"]


def test_pool_true_query_then_another_sync_is_not_after_sync(dev):
    # A query that answers True proves nothing (DESIGN.md §2), not even once a later synchronize
    # of an unrelated stream makes the pool look at what the host saw.
    pool = pool_with(dev, False)
    a, b, c = stream(dev), stream(dev), stream(dev)
    p = used_then_freed(pool, b)
    e = b.record()
    b._q._wait(b._pos)  # the worker's own count (cpu): not a host synchronize
    assert b.query() and e.query()
    c.synchronize()
    before = pool.stats()
    q = a.malloc(BLOCK, pool)
    assert q != p
    assert served(pool, before) == ["grow_count"]


@pytest.mark.parametrize("how", ["stream", "event"])
def test_pool_sync_proves_the_frees_the_synchronized_work_waited_for(dev, how):
    # A synchronize proves every position its stream's (or event's) clock covers: b's free, which
    # c waited for, is reusable by a third stream after a synchronize of c, whatever the flags.
    pool = pool_with(dev, False)
    a, b, c = stream(dev), stream(dev), stream(dev)
    p = used_then_freed(pool, b)
    c.wait(b.record())
    c.synchronize() if how == "stream" else c.record().synchronize()
    before = pool.stats()
    q = a.malloc(BLOCK, pool)
    assert q == p
    assert served(pool, before) == ["reuse_after_sync"]


def test_pool_event_sync_promotes_split_remainder(dev):
    # A split remainder keeps its block's free position; an event synchronize that proves that
    # position makes it reusable by any stream even when a later free on the same stream is
    # still unproven (regression: the promotion FIFO stopped at the later free).
    pool = pool_with(dev, False)
    s, a = stream(dev), stream(dev)
    x = s.malloc(BLOCK, pool)
    sep = s.malloc(BLOCK, pool)  # live between x and y: their frees must not merge
    y = s.malloc(2 * BLOCK, pool)
    s.memset(x, 1, BLOCK)
    s.free(x)  # x freed at position 1
    s.memset(y, 2, 2 * BLOCK)
    e = s.record()  # position 2
    s.memset(y, 3, 2 * BLOCK)
    s.free(y)  # y freed at position 3
    z = s.malloc(512, pool)  # best fit on s: x, split; the remainder keeps position 1
    assert x < z < x + BLOCK
    e.synchronize()  # proves position 2: the remainder of x, not y
    before = pool.stats()
    q = a.malloc(BLOCK // 2, pool)
    assert served(pool, before) == ["reuse_after_sync"]
    assert x < q < x + BLOCK
    s.free(z)
    a.free(q)
    s.free(sep)


# -- step 3: event dependencies ---------------------------------------------------------------
@pytest.mark.parametrize("on", [True, False])
def test_pool_reuse_event_dependency(dev, gate, on):
    pool = pool_with(dev, reuse_follow_event_dependencies=on)
    a, b = stream(dev), stream(dev)
    gate(b)
    p = used_then_freed(pool, b)
    a.wait(b.record())  # a's next work is ordered after b's free
    before = pool.stats()
    q = a.malloc(BLOCK, pool)
    if on:
        assert q == p
        assert served(pool, before) == ["reuse_event_dependency"]
    else:
        assert q != p
        assert served(pool, before) == ["grow_count"]


def test_pool_event_dependency_comes_before_opportunistic_reuse(dev, gate):
    # Step 3 before step 4: a block a is ordered after by an event wins over a closer-sized one
    # whose free has merely executed.
    pool = pool_with(dev)
    a, b, c = stream(dev), stream(dev), stream(dev)
    gate(b)
    p = used_then_freed(pool, b, 4 * BLOCK)
    used_then_freed(pool, c, BLOCK)  # the best fit, but only for step 4
    a.wait(b.record())
    executed(c)
    before = pool.stats()
    assert a.malloc(BLOCK, pool) == p  # p splits: a takes its low end
    assert served(pool, before) == ["reuse_event_dependency"]


@pytest.mark.parametrize("work_between", [True, False])
@pytest.mark.parametrize("non_blocking", [True, False])
def test_pool_event_recorded_before_free_is_no_dependency(dev, gate, non_blocking, work_between):
    # on a blocking stream too, whose free takes the slow path (tagged there with its position);
    # and with nothing between the record and the free, which adds no work but still comes after
    # the record (cudaFreeAsync is a stream operation)
    pool = pool_with(dev)
    a, b = stream(dev), srt.Stream(dev, non_blocking=non_blocking)
    gate(b)
    p = b.malloc(BLOCK, pool)
    b.memset(p, 1, BLOCK)
    a.wait(b.record())  # ordered after the memset, not after the free below
    if work_between:
        b.memset(p, 2, BLOCK)
    b.free(p)
    before = pool.stats()
    q = a.malloc(BLOCK, pool)
    assert q != p
    assert served(pool, before) == ["grow_count"]


def test_pool_legacy_default_stream_ordering_counts_as_event_dependency(dev, gate, delay):
    # A blocking stream and the legacy default stream are ordered both ways (CUDA legacy
    # semantics): that implicit order is an event dependency for reuse, with no user event.
    pool = pool_with(dev)
    b = srt.Stream(dev)  # blocking
    legacy = dev.default_stream
    p = b.malloc(BLOCK, pool)
    b.memset(p, 0x11, BLOCK)
    g = gate(b)
    seen: list[np.ndarray] = []
    b.launch(snapshot_kernel, p, BLOCK, seen)  # b's pending use of the block
    b.free(p)
    before = pool.stats()
    q = legacy.malloc(BLOCK, pool)
    assert q == p
    assert served(pool, before) == ["reuse_event_dependency"]
    legacy.memset(q, 0x22, BLOCK)  # the new owner writes; must not reach b's pending read
    g.open()
    legacy.synchronize()
    assert len(seen) == 1 and (seen[0] == 0x11).all()
    assert (srt.read(q, (BLOCK,), np.uint8) == 0x22).all()

    # and the other way: a block freed on the legacy stream, allocated on a blocking stream
    g2 = gate(legacy)
    try:
        seen.clear()
        legacy.launch(snapshot_kernel, q, BLOCK, seen)
        legacy.free(q)  # the legacy stream, the block's new owner, frees it
        c = srt.Stream(dev)
        before = pool.stats()
        r = c.malloc(BLOCK, pool)
        assert r == q
        assert served(pool, before) == ["reuse_event_dependency"]
        c.memset(r, 0x33, BLOCK)
    finally:
        g2.open()
    c.synchronize()
    assert len(seen) == 1 and (seen[0] == 0x22).all()
    c.free(r)


def test_pool_non_blocking_stream_has_no_legacy_dependency(dev, gate):
    pool = pool_with(dev)
    b = stream(dev)
    gate(b)
    p = used_then_freed(pool, b)
    before = pool.stats()
    q = dev.default_stream.malloc(BLOCK, pool)
    assert q != p
    assert served(pool, before) == ["grow_count"]
    dev.default_stream.free(q)


# -- step 4: opportunistic ----------------------------------------------------------------------
@pytest.mark.parametrize("on", [True, False])
def test_pool_reuse_opportunistic(dev, on):
    pool = pool_with(dev, reuse_allow_opportunistic=on)
    a, b = stream(dev), stream(dev)
    p = used_then_freed(pool, b)
    executed(b)  # b has executed its free; no synchronize, no event
    before = pool.stats()
    q = a.malloc(BLOCK, pool)
    if on:
        assert q == p
        assert served(pool, before) == ["reuse_opportunistic"]
    else:
        assert q != p
        assert served(pool, before) == ["grow_count"]


def test_pool_opportunistic_needs_the_free_to_have_run(dev, gate):
    pool = pool_with(dev, reuse_allow_opportunistic=True)
    a, b = stream(dev), stream(dev)
    gate(b)
    p = used_then_freed(pool, b)
    before = pool.stats()
    q = a.malloc(BLOCK, pool)
    assert q != p
    assert served(pool, before) == ["grow_count"]


# -- steps 5 and 6: grow, then internal dependencies ------------------------------------------
def test_pool_grow_preferred_over_internal_dependency(dev, gate):
    pool = pool_with(dev, reuse_allow_internal_dependencies=True)  # no max_size: growing works
    a, b = stream(dev), stream(dev)
    gate(b)
    p = used_then_freed(pool, b)
    before = pool.stats()
    q = a.malloc(BLOCK, pool)
    assert q != p
    assert served(pool, before) == ["grow_count"]


@pytest.mark.parametrize("on", [True, False])
def test_pool_reuse_internal_dependency(dev, gate, on):
    pool = pool_with(dev, max_size=BLOCK, reuse_allow_internal_dependencies=on)
    a, b = stream(dev), stream(dev)
    gate(b)
    p = used_then_freed(pool, b)
    before = pool.stats()
    pos = a._pos
    if on:
        q = a.malloc(BLOCK, pool)
        assert q == p
        assert served(pool, before) == ["reuse_internal_dependency"]
        markers = srt.sanitizer.enabled()  # the sanitizer gives each malloc a position too
        assert a._pos == pos + 1 + markers  # a real wait was enqueued on a
    else:
        with pytest.raises(srt.OutOfMemoryError):
            a.malloc(BLOCK, pool)
        after = pool.stats()
        assert after["oom_count"] == before["oom_count"] + 1
        assert {k: v for k, v in after.items() if k != "oom_count"} == {
            k: v for k, v in before.items() if k != "oom_count"
        }
        assert a._pos == pos  # no wait was enqueued


def test_pool_internal_dependency_orders_new_owner_after_old(dev, gate, delay):
    pool = pool_with(dev, max_size=BLOCK)  # growing is impossible: step 6 must serve
    a, b = stream(dev), stream(dev)
    p = b.malloc(BLOCK, pool)
    b.memset(p, 0x11, BLOCK)
    g = gate(b)
    seen: list[np.ndarray] = []
    b.launch(snapshot_kernel, p, BLOCK, seen)  # the old owner's pending work
    b.free(p)
    before = pool.stats()
    q = a.malloc(BLOCK, pool)
    assert q == p
    assert served(pool, before) == ["reuse_internal_dependency"]
    a.memset(q, 0x22, BLOCK)  # the new owner writes at once
    a_done = threading.Event()
    a.launch_host_func(a_done.set)
    # While b's gate is closed, a is held back by the wait the pool enqueued; without that wait
    # a would run its memset and this host function right away. (A negative check only.)
    assert not a_done.wait(timeout=0.2)
    assert not a.query()
    g.open()
    a.synchronize()  # covers b up to the free, through the internal dependency
    assert len(seen) == 1 and (seen[0] == 0x11).all()  # the old owner saw its own data
    assert (srt.read(q, (BLOCK,), np.uint8) == 0x22).all()
    a.free(q)


# -- best fit, split, coalesce, rounding --------------------------------------------------------
def test_pool_rounds_to_512_and_aligns(dev):
    pool = pool_with(dev)
    s = stream(dev)
    sizes = [1, 511, 512, 513, 1000, 1025]
    rounded = [512, 512, 512, 1024, 1024, 1536]
    ptrs = [s.malloc(n, pool) for n in sizes]
    assert all(p % 512 == 0 for p in ptrs)
    assert pool.used_mem_current == sum(rounded)
    # small requests are carved from the top of one fresh granule down: each block ends
    # where the previous one starts
    assert [a - b for a, b in zip(ptrs, ptrs[1:])] == rounded[1:]
    assert pool.reserved_mem_current == 2 << 20  # all small: one shared 2 MiB granule
    for p in ptrs:
        s.free(p)
    assert pool.used_mem_current == 0

    large = pool_with(dev)  # a fresh pool: no small-chunk remainder to carve from
    big = s.malloc((1 << 20) + 1, large)  # > 1 MiB: its own chunk, rounded to a 2 MiB granule
    assert big % 512 == 0
    assert large.reserved_mem_current == 2 << 20
    assert large.used_mem_current == (1 << 20) + 512
    huge = s.malloc((3 << 20) + 1, large)  # the remainder is too small: a 4 MiB chunk
    assert huge % 512 == 0
    assert large.reserved_mem_current == 6 << 20
    assert large.used_mem_current == (1 << 20) + 512 + (3 << 20) + 512
    s.free(big)
    s.free(huge)


def test_pool_best_fit_chooses_closest_size(dev):
    pool = pool_with(dev)
    s = stream(dev)
    a = s.malloc(4096, pool)
    s.malloc(512, pool)  # live separators: no two free blocks coalesce
    b = s.malloc(1024, pool)
    s.malloc(512, pool)
    c = s.malloc(2048, pool)
    s.malloc(512, pool)
    for p in (a, b, c):
        s.memset(p, 0, 512)
        s.free(p)
    # step 1 (pending on s): the closest size wins, not the latest freed or the largest;
    # a small request takes the high end of its block
    assert s.malloc(1000, pool) == b
    assert s.malloc(1536, pool) == c + 512
    assert s.malloc(3000, pool) == a + 1024
    for p in (a + 1024, b, c + 512):
        s.free(p)  # each merges back with the rest of its block
    s.synchronize()  # now all three are ready blocks (step 2): best fit again
    other = stream(dev)
    assert other.malloc(2000, pool) == c
    assert other.malloc(4000, pool) == a
    assert other.malloc(1, pool) == b + 512


def test_pool_best_fit_ties_go_to_the_oldest_free(dev):
    pool = pool_with(dev)
    s = stream(dev)
    a = s.malloc(4096, pool)
    s.malloc(512, pool)  # live separators: the two free blocks stay apart
    b = s.malloc(4096, pool)
    s.malloc(512, pool)
    s.free(b)  # freed first: the oldest of two equal sizes
    s.free(a)
    assert s.malloc(4096, pool) == b
    assert s.malloc(4096, pool) == a


def test_pool_best_fit_across_streams(dev):
    pool = pool_with(dev)
    a, b, c = stream(dev), stream(dev), stream(dev)
    p = used_then_freed(pool, b, 4 * BLOCK)
    q = used_then_freed(pool, c, BLOCK)
    a.wait(b.record())
    a.wait(c.record())
    before = pool.stats()
    assert a.malloc(BLOCK, pool) == q  # both allowed by events: the closer size wins
    assert served(pool, before) == ["reuse_event_dependency"]
    assert a.malloc(3 * BLOCK, pool) == p


def test_pool_split_remainder_keeps_pending_free(dev, gate):
    # A remainder split off a pending block is still pending on the same free: it must not
    # become reusable by an unrelated stream while the old owner's work is pending.
    pool = pool_with(dev)
    a, b, c = stream(dev), stream(dev), stream(dev)
    gate(b)
    p = used_then_freed(pool, b)
    a.wait(b.record())
    assert a.malloc(512, pool) == p + BLOCK - 512  # event dependency; the rest splits off
    before = pool.stats()
    q = c.malloc(BLOCK - 512, pool)  # fits the remainder, but c has no order with b
    assert not p <= q < p + BLOCK
    assert served(pool, before) == ["grow_count"]
    a.wait(b.record())  # with an order, the remainder is fair game
    before = pool.stats()
    r = a.malloc(BLOCK // 2, pool)
    assert p < r < p + BLOCK
    assert served(pool, before) == ["reuse_event_dependency"]


def test_pool_split_remainder_of_a_large_request_keeps_pending_free(dev, gate):
    # As above, for a request over 1 MiB, which takes the low end of its block (another split).
    pool = pool_with(dev)
    a, b, c = stream(dev), stream(dev), stream(dev)
    gate(b)
    p = used_then_freed(pool, b, 2 * BLOCK)
    a.wait(b.record())
    assert a.malloc(BLOCK, pool) == p  # event dependency; the upper half splits off
    before = pool.stats()
    q = c.malloc(BLOCK, pool)  # fits the remainder, but c has no order with b
    assert not p - BLOCK < q < p + 2 * BLOCK
    assert served(pool, before) == ["grow_count"]


def test_pool_coalesced_pending_free_keeps_the_later_position(dev, gate):
    # Two neighbours freed on b coalesce into one block pending at the later free: an event of
    # b between the two frees orders a after the first only, so a cannot reuse the whole.
    pool = pool_with(dev)
    a, b = stream(dev), stream(dev)
    gate(b)
    x = b.malloc(BLOCK, pool)
    y = b.malloc(BLOCK, pool)
    assert y == x + BLOCK  # neighbours
    b.memset(x, 1, BLOCK)
    b.free(x)
    a.wait(b.record())  # after x's free, before y's
    b.memset(y, 2, BLOCK)
    b.free(y)  # merges with x: the whole is freed at y's position
    before = pool.stats()
    q = a.malloc(2 * BLOCK, pool)
    assert not x - 2 * BLOCK < q < y + BLOCK
    assert served(pool, before) == ["grow_count"]


def test_pool_split_and_coalesce(dev):
    pool = pool_with(dev)
    s = stream(dev)
    x = s.malloc(512, pool)
    y = s.malloc(512, pool)
    z = s.malloc(512, pool)
    assert (x - y, y - z) == (512, 512)  # small blocks, from the top of the granule down
    st = pool.stats()
    assert st["chunks"] == 1 and st["largest_free_block"] == BLOCK - 3 * 512  # split remainder
    s.memset(x, 0, 512)
    s.free(x)
    s.memset(z, 0, 512)
    s.free(z)  # pending on s, and it absorbs the ready remainder below it
    st = pool.stats()
    assert st["largest_free_block"] == BLOCK - 2 * 512
    s.memset(y, 0, 512)
    s.free(y)  # the three and the remainder: one block, pending on s
    assert pool.stats()["largest_free_block"] == BLOCK
    assert s.malloc(3 * 512, pool) == z  # the high end of the merged block: z, y, x again
    s.free(z)
    s.synchronize()  # proven: the whole granule is one ready block (kept: high threshold)
    st = pool.stats()
    assert st["largest_free_block"] == BLOCK and st["chunks"] == 1
    base = z - (BLOCK - 3 * 512)
    assert stream(dev).malloc(BLOCK, pool) == base  # the whole granule, in one piece


def test_pool_statistics_do_not_change_where_a_block_goes(dev):
    # A fast free next to ready blocks defers merging with them; reading the statistics counts
    # the merge without making it, so a later exact-size request gets the same block either way.
    def run(observe: bool) -> tuple[int, ...]:
        pool = pool_with(dev)
        s = stream(dev)
        x = s.malloc(1024, pool)  # the top of the granule
        y = s.malloc(512, pool)  # below x; the rest of the granule below y is a ready block
        s.free(x)
        s.synchronize()  # x ready
        s.memset(y, 0, 512)
        s.free(y)  # between two ready blocks
        if observe:
            assert pool.stats()["largest_free_block"] == BLOCK  # y with both, once merged
        z = s.malloc(512, pool)
        w = s.malloc(1024, pool)
        s.synchronize()
        return y - x, z - x, w - x

    assert run(observe=False) == run(observe=True) == (-512, -512, 0)


def test_pool_free_coalesces_through_an_absorbed_ready_block(dev):
    # A free absorbs a ready neighbour, then what lies beyond it freed on the same stream: one
    # block, which another stream ordered after both frees reuses in one piece.
    pool = pool_with(dev, reuse_allow_opportunistic=False, reuse_allow_internal_dependencies=False)
    a, f = stream(dev), stream(dev)
    x = a.malloc(512, pool)  # the top of a first granule; the rest of it is a ready block
    f.wait(a.record())  # (f may use what a allocated)
    f.memset(x, 0, 512)
    f.free(x)  # the first granule: one block, pending on f
    y = a.malloc(512, pool)  # a may not reuse it: the top of a second granule
    f.wait(a.record())
    f.memset(y, 0, 512)
    f.free(y)  # absorbs the ready rest of the second granule, then the first granule
    assert pool.stats()["largest_free_block"] == 2 * BLOCK
    a.wait(f.record())
    before = pool.stats()
    assert a.malloc(BLOCK + BLOCK // 2, pool) == x + 512 - BLOCK  # the low end: the first granule
    assert served(pool, before) == ["reuse_event_dependency"]


# -- ownership, srt.free ------------------------------------------------------------------------
def test_pool_pointer_returns_to_owning_pool(dev):
    pa, pb = pool_with(dev), pool_with(dev)
    default = dev.default_mem_pool
    dev.set_mem_pool(pb)
    try:
        s = stream(dev)
        p = s.malloc(4096, pa)
        q = s.malloc(4096)  # the device's current pool: pb
        assert pa.stats()["live_allocations"] == 1 and pb.stats()["live_allocations"] == 1
        before_b = pb.stats()
        s.free(p)  # no pool argument: the pointer goes back to pa
        assert pa.stats()["free_count"] == 1 and pa.used_mem_current == 0
        assert pb.stats() == before_b
        assert s.malloc(4096, pa) == p  # and pa serves it again
        before_a = pa.stats()
        srt.free(q)  # the synchronous free also finds the owner
        assert pb.stats()["free_count"] == 1 and pa.stats() == before_a
        s.free(p)
    finally:
        dev.set_mem_pool(default)


def test_pool_srt_free_synchronizes_then_frees(dev, gate):
    pool = srt.MemPool(dev)  # threshold 0: srt.free is itself a synchronize point
    s = stream(dev)
    p = s.malloc(BLOCK, pool)
    s.memset(p, 7, BLOCK)
    g = gate(s)
    seen: list[np.ndarray] = []
    s.launch(snapshot_kernel, p, BLOCK, seen)
    opener = threading.Timer(0.05, g.open)  # srt.free must block until the gate opens
    opener.start()
    try:
        srt.free(p)
    finally:
        opener.cancel()
        g.open()
    assert len(seen) == 1 and (seen[0] == 7).all()  # the pending work ran before the free
    st = pool.stats()
    assert st["free_count"] == 1 and st["used_mem_current"] == 0
    assert st["reserved_mem_current"] == 0 and st["release_count"] == 1
    with pytest.raises(srt.InvalidAddressError):
        s.free(p)  # gone for good


def test_pool_srt_free_makes_block_ready_for_any_stream(dev):
    pool = pool_with(dev, False)
    s, other = stream(dev), stream(dev)
    p = s.malloc(BLOCK, pool)
    s.memset(p, 1, BLOCK)
    srt.free(p)
    before = pool.stats()
    assert other.malloc(BLOCK, pool) == p
    assert served(pool, before) == ["reuse_after_sync"]


def test_pool_refused_free_after_a_record_leaves_the_stream_as_it_was(dev):
    # the free's own position (see the test above) is taken only for a free that goes ahead: a
    # refused cudaFreeAsync enqueues nothing
    s = stream(dev)
    s.record()
    pos = s._pos
    with pytest.raises(srt.InvalidAddressError):
        s.free(12345)
    assert s._pos == pos
