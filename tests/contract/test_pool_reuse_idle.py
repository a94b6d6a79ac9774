"""Opportunistic reuse (DESIGN.md §3 step 4) of frees made on idle cpu streams: a free whose
stream has run everything before it is reusable at once, without waiting for the stream's worker
to pass over operations that do nothing (a wait for work that has run, the marker a free right
after an event record gets). Delay injection holds every worker operation for up to 50 ms, so an
operation left for a worker has not run when the next allocation looks."""

from __future__ import annotations

import pytest

import streamrt as srt
from tests.conftest import delayed, no_sanitizer
from tests.contract.pools import BLOCK, executed, pool_with, served, stream

_OBSERVED = ("with the sanitizer on, every wait and marker is an operation it observes on the "
             "worker: such a free counts as run once the worker has passed")


def _written(pool: srt.MemPool, s: srt.Stream) -> int:
    """A block ``s`` has written, with everything ``s`` enqueued run."""
    p = s.malloc(BLOCK, pool)
    s.memset(p, 0x22, BLOCK)
    executed(s)
    return p


def test_pool_cross_stream_free_after_run_work_is_reusable_at_once(dev):
    no_sanitizer(_OBSERVED)
    pool = pool_with(dev, reuse_allow_opportunistic=True)
    a, b, c = stream(dev), stream(dev), stream(dev)
    p = _written(pool, a)
    with delayed(50_000):
        b.wait(a.record())  # a's work has run: nothing for b's worker to wait for
        b.free(p)
        before = pool.stats()
        q = c.malloc(BLOCK, pool)
    assert q == p
    assert served(pool, before) == ["reuse_opportunistic"]
    c.free(q)


def test_pool_cross_stream_free_after_pending_work_is_not_reusable(dev, gate):
    pool = pool_with(dev, reuse_allow_opportunistic=True)
    a, b, c = stream(dev), stream(dev), stream(dev)
    p = _written(pool, a)
    gate(a)  # a holds: b's wait is a real one
    b.wait(a.record())
    b.free(p)
    before = pool.stats()
    q = c.malloc(BLOCK, pool)
    assert q != p
    assert served(pool, before) == ["grow_count"]


@pytest.mark.parametrize("pending", [False, True])
def test_pool_free_right_after_a_record_is_reusable_once_prior_work_ran(dev, gate, pending):
    if not pending:
        no_sanitizer(_OBSERVED)
    pool = pool_with(dev, reuse_allow_opportunistic=True)
    a, c = stream(dev), stream(dev)
    p = _written(pool, a)
    if pending:
        gate(a)
    with delayed(50_000):
        a.record()  # the free right after it gets an operation of its own (a marker)
        a.free(p)
        a.record()
        q0 = a.malloc(512, pool)  # (a's own reuse: the marker run may grow)
        a.free(q0)
        before = pool.stats()
        q = c.malloc(BLOCK, pool)
    if pending:
        assert q != p
        assert served(pool, before) == ["grow_count"]
    else:
        assert q == p
        assert served(pool, before) == ["reuse_opportunistic"]
    c.free(q)


def test_pool_wait_for_run_work_still_orders_later_frees_by_event(dev):
    """The wait left out still counts as ordering: a stream waiting on an event recorded after
    the free reuses the block by event dependency (step 3, before opportunistic)."""
    pool = pool_with(dev, reuse_allow_opportunistic=True, reuse_follow_event_dependencies=True)
    a, b, c = stream(dev), stream(dev), stream(dev)
    p = _written(pool, a)
    b.wait(a.record())
    b.free(p)
    c.wait(b.record())
    before = pool.stats()
    q = c.malloc(BLOCK, pool)
    assert q == p
    assert served(pool, before) == ["reuse_event_dependency"]
    c.free(q)
