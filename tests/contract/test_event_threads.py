"""One event used from several host threads: a record is read whole, and a failure the worker reports
meanwhile is kept (interleavings forced by tests/contract/interleave.py)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import streamrt as srt
from tests.contract.interleave import Background, before_snapshot, blocked_on, fail_after_kernel, fail_kernel
from tests.contract.pools import BLOCK, executed, pool_with, served, stream, used_then_freed


# -- an event's record is read whole --------------------------------------------------------
def test_event_synchronize_reads_a_record_whole(dev, gate, monkeypatch):
    # Thread A re-records an event on y while thread B synchronizes it. Writing the stream and
    # position first and the clock after a call, A let B read y's position with the clock of
    # the old record on x: B waited for y and proved x's pending free complete.
    pool = pool_with(dev, False)
    x, y = stream(dev), stream(dev)
    g_x = gate(x)
    p = used_then_freed(pool, x)
    ev = x.record()
    executed(y)
    settled = threading.Event()
    blocked = blocked_on(x._q, settled, monkeypatch)
    threads: list[Background] = []

    def synchronize_meanwhile() -> None:
        threads.append(Background(ev.synchronize, settled))
        assert settled.wait(timeout=30)  # it blocked on the old record, or proved what it read

    before_snapshot(monkeypatch, y, synchronize_meanwhile)
    y.record(ev)
    d = stream(dev)
    d.synchronize()
    before = pool.stats()
    q = d.malloc(BLOCK, pool)
    assert q != p
    assert served(pool, before) == ["grow_count"]
    assert blocked.is_set()
    g_x.open()
    assert threads[0].join() is None
    d.free(q)


# -- failures: each reported once, none lost ------------------------------------------------
class NextFailure(list):
    """A queue's failure list that, each time the main thread has iterated it to the end (a
    snapshot just taken), releases the next failing operation and waits until the worker has
    appended its failure: the worst moment for it to land."""

    def __init__(self, gates: list[threading.Event]) -> None:
        super().__init__()
        self.gates = gates
        self.appended = threading.Semaphore(0)
        self.main = threading.current_thread()

    def __iter__(self):
        yield from list.__iter__(self)
        if self.gates and threading.current_thread() is self.main:
            self.gates.pop(0).set()
            assert self.appended.acquire(timeout=30)

    def append(self, item: Any) -> None:
        super().append(item)
        self.appended.release()


def test_event_synchronize_keeps_a_failure_the_worker_reports_meanwhile(dev):
    # A synchronize takes the failures up to its position while the worker runs later
    # operations: one that failed just after the list of remaining failures was built was lost.
    s = stream(dev)
    go2, go3 = threading.Event(), threading.Event()
    s._q.errors = NextFailure([go2, go3])
    s.launch(fail_kernel, "one")
    e1 = s.record()
    s.launch(fail_after_kernel, go2, "two")
    e2 = s.record()
    s.launch(fail_after_kernel, go3, "three")
    e3 = s.record()
    with pytest.raises(srt.LaunchError, match="one"):
        e1.synchronize()
    go2.set()
    go3.set()
    with pytest.raises(srt.LaunchError, match="two"):
        e2.synchronize()
    with pytest.raises(srt.LaunchError, match="three"):
        e3.synchronize()
    s.synchronize()
