"""One stream, event, pool or device used from several host threads (the CUDA runtime is
thread-safe): what one thread publishes while another reads it must be one consistent state.

Each interleaving is forced, never waited for by time: a hook at the point where the runtime
can switch threads (a call into ``Stream._snapshot``, a read of a stream attribute, the end of an
iteration over a queue's failures) runs the other thread's action there, inline when that action
does not block, else in a thread that the main one follows until it has finished or blocked.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import numpy as np
import pytest

import streamrt as srt
from streamrt import instrument
from tests.contract.interleave import Background, Contended, before_snapshot, blocked_on, fail_kernel, on_read
from tests.contract.pools import BLOCK, executed, pool_with, served, stream, used_then_freed

# -- a published position covers the clock published with it ---------------------------------
PUBLISHERS = ["record", "graph launch", "legacy ordering", "free (instrumented)"]


@pytest.mark.parametrize("publisher", PUBLISHERS)
def test_stream_published_position_covers_its_clock(dev, gate, monkeypatch, tmp_path, publisher):
    # A stream a's position and clock are published together: by an event record, by a graph
    # launch (the next launch, on another stream, follows it), by the legacy stream's implicit
    # ordering after a blocking stream, by a free (an instrumented run keeps the clock, which a
    # stream taking the block by an internal dependency merges). If the position is read before
    # the clock, a wait that another thread enqueues on a in between (on x's free, still pending
    # behind a gate) is in the clock but not waited for: whoever follows the publication claims
    # x's free, and a synchronize of it made the pool hand that block to a third stream.
    with contextlib.ExitStack() as cleanup:
        if publisher == "free (instrumented)":
            cleanup.enter_context(srt.trace(tmp_path / "trace.json"))
        pool = pool_with(dev, False)  # reuse only on the same stream or after a host synchronize
        x = stream(dev)
        g_x = gate(x)
        cleanup.callback(g_x.open)  # before the trace ends, which waits for every stream
        p = used_then_freed(pool, x)
        x_event = x.record()
        a = srt.Stream(dev) if publisher == "legacy ordering" else stream(dev)
        executed(a)
        settled = threading.Event()
        blocked = blocked_on(a._q, settled, monkeypatch)
        if publisher == "graph launch":
            g = srt.Graph()
            g.add_empty_node()
            ge = g.instantiate()
        elif publisher == "free (instrumented)":
            one = srt.MemPool(dev, max_size=BLOCK, reuse_follow_event_dependencies=False,
                              reuse_allow_opportunistic=False)  # then internal dependencies
            m = a.malloc(BLOCK, one)

        def other_thread() -> None:  # a's position so far complete, then a waits on x's free
            executed(a)
            a.wait(x_event)

        armed = before_snapshot(monkeypatch, a, other_thread)
        c = stream(dev)
        if publisher == "record":
            follower = a.record().synchronize
        elif publisher == "graph launch":
            ge.launch(a)
            ge.launch(c)  # c follows a's launch
            follower = c.synchronize
        elif publisher == "legacy ordering":
            legacy = dev.default_stream
            legacy.launch_host_func(lambda: None)  # ordered after the blocking stream a
            follower = legacy.synchronize
        else:
            a.free(m)
            m = c.malloc(BLOCK, one)  # the pool is full: c waits for a's free
            follower = c.synchronize
        assert not armed[0]
        t = Background(follower, settled)  # blocks on a's wait (fixed), or proves x's free (bug)
        assert settled.wait(timeout=30)
        d = stream(dev)
        d.synchronize()
        before = pool.stats()
        q = d.malloc(BLOCK, pool)
        assert q != p  # x's free is still behind its gate
        assert served(pool, before) == ["grow_count"]
        assert blocked.is_set()
        g_x.open()
        assert t.join() is None
        d.free(q)
        if publisher == "free (instrumented)":
            c.free(m)


def test_stream_wait_reads_an_event_record_whole(dev, gate, monkeypatch):
    # Thread B waits on an event recorded on x while thread A re-records it on y. B read the
    # stream (x), then, after a call, the position and clock: those of y's record. It waited on
    # x and claimed y's clock, so the pool gave B a block whose free y had not yet run.
    pool = pool_with(dev, reuse_follow_event_dependencies=True, reuse_allow_opportunistic=False,
                     reuse_allow_internal_dependencies=False)  # reuse by the clock, not by luck
    x, y, c = stream(dev), stream(dev), stream(dev)
    executed(x)
    executed(x)  # x at 2: a wait for x@2 completes
    ev = x.record()
    g_y = gate(y)
    p = used_then_freed(pool, y)  # freed on y at 2, behind y's gate
    armed = on_read(monkeypatch, "id", x, lambda: y.record(ev))
    c.wait(ev)
    assert not armed[0]
    before = pool.stats()
    q = c.malloc(BLOCK, pool)
    assert q != p  # c follows x's record, not y's
    assert served(pool, before) == ["grow_count"]
    g_y.open()
    c.free(q)


class PauseTaker(list):
    """A queue's failure list whose first iteration by ``thread`` pauses at its end."""

    def __init__(self, items: list) -> None:
        super().__init__(items)
        self.thread: threading.Thread | None = None
        self.inside, self.resume = threading.Event(), threading.Event()

    def __iter__(self):
        yield from list.__iter__(self)
        if threading.current_thread() is self.thread and not self.inside.is_set():
            self.inside.set()
            assert self.resume.wait(timeout=30)


def test_stream_synchronize_reports_a_failure_once_to_concurrent_callers(dev):
    # Two threads synchronize one stream: each built its list of failures to report from the
    # shared list before either removed them, so both raised the same failure.
    s = stream(dev)
    s.launch(fail_kernel, "once")
    executed(s)
    errors = s._q.errors = PauseTaker(s._q.errors)

    def first() -> None:
        errors.thread = threading.current_thread()
        s.synchronize()

    t = Background(first, threading.Event())
    assert errors.inside.wait(timeout=30)  # it has read the failure, not yet taken it
    with pytest.raises(srt.LaunchError, match="once"):
        s.synchronize()
    errors.resume.set()
    assert t.join() is None  # the failure was reported once: to the main thread


# -- the sanitizer's labels: two threads enqueue on one stream --------------------------------
@srt.kernel
def write_noting_label(ctx, p, labels):
    """Writes 4 floats at ``p``; notes its operation's label (stream position) in run order."""
    labels.append(instrument.current().pos)
    ctx.array(p, (4,), np.float32)[:] = 1


def test_stream_labels_operations_of_two_threads_in_queue_order(dev, monkeypatch):
    # Two threads launch on one stream under the sanitizer. The operation's label (its
    # position) was counted, then read again after a call (instrument.wrap): the other thread's
    # launch counted itself there, so both operations got one label, each one's clock claimed
    # neither before the other, and the sanitizer reported a race within one stream.
    srt.sanitizer.enable("collect")  # the autouse fixture restores the previous setting
    seen = len(srt.sanitizer.report())
    s = stream(dev)
    p = srt.malloc(16, device=dev)
    labels: list[int] = []
    settled = threading.Event()
    s._lock = Contended(s._lock, settled)  # a thread that has to wait for it has settled
    real = instrument.wrap
    armed, threads = [True], []

    def wrap(stream: srt.Stream, *args: Any, **kwargs: Any) -> Any:
        if armed[0] and stream is s:  # the first launch, counted, about to be labelled
            armed[0] = False
            threads.append(Background(lambda: s.launch(write_noting_label, p, labels), settled))
            assert settled.wait(timeout=30)  # the other launch enqueued, or waits for this one
        return real(stream, *args, **kwargs)

    monkeypatch.setattr(instrument, "wrap", wrap)
    s.launch(write_noting_label, p, labels)
    assert threads[0].join() is None
    s.synchronize()
    srt.free(p)
    assert srt.sanitizer.report()[seen:] == []
    assert labels == [1, 2]  # one label each, in queue order
