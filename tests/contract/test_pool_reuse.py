"""Pool reuse rules (DESIGN.md §3 steps 1-6): same stream, after a host synchronize, event dependencies,
opportunistic, grow, internal dependencies. "Not yet complete" is made certain with a closed gate;
"already executed without a host synchronize" with a host function that sets a ``threading.Event``
after the free."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt
from tests.contract.pools import BLOCK, executed, pool_with, served, snapshot_kernel, stream, used_then_freed


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
