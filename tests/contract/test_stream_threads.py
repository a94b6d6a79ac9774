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
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import streamrt as srt
from streamrt import instrument
from streamrt import stream as stream_module
from streamrt.graph import capture
from tests.contract.test_pool_reuse import BLOCK, executed, pool_with, served, stream, used_then_freed


@srt.kernel
def fail_kernel(ctx, why):
    """Fails at once."""
    raise RuntimeError(why)


@srt.kernel
def fail_after_kernel(ctx, go, why):
    """Fails once ``go`` is set."""
    if not go.wait(timeout=30):
        raise TimeoutError("never released")
    raise RuntimeError(why)


class Background:
    """``fn()`` on a thread; ``settled`` is set when it returns or raises."""

    def __init__(self, fn: Callable[[], Any], settled: threading.Event) -> None:
        self.exc: BaseException | None = None

        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # re-raised by join, or inspected
                self.exc = exc
            finally:
                settled.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self) -> BaseException | None:
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()
        return self.exc


def blocked_on(q: Any, settled: threading.Event, monkeypatch) -> threading.Event:
    """Set ``settled`` (and the event returned) when a thread asks ``q`` for a position it has
    not reached: that thread is blocked on q's pending work (a host thread's synchronize and a
    worker's wait op both wait in ``q._wait``; a wait op binds it when enqueued: patch before)."""
    blocked = threading.Event()
    real = q._wait

    def wait(pos: int) -> None:
        if q.done < pos:
            blocked.set()
            settled.set()
        real(pos)

    monkeypatch.setattr(q, "_wait", wait)
    return blocked


def before_snapshot(monkeypatch, s: srt.Stream, action: Callable[[], None]) -> list[bool]:
    """Run ``action`` once, at the next call of ``s._snapshot()``, before it reads anything: what
    another thread does while the caller switches out there. Returns ``[armed]``."""
    real = srt.Stream._snapshot
    armed = [True]

    def snapshot(self: srt.Stream) -> dict[int, int]:
        if armed[0] and self is s:
            armed[0] = False
            action()
        return real(self)

    monkeypatch.setattr(srt.Stream, "_snapshot", snapshot)
    return armed


def on_read(monkeypatch, name: str, s: Any, action: Callable[[], None], skip: int = 0) -> list[bool]:
    """Run ``action`` once, at the read of the slot ``s.<name>`` (a stream's or an event's) after
    the next ``skip`` ones, before the value is returned. Returns ``[armed]``."""
    cls = type(s)
    member = cls.__dict__[name]
    armed, left = [True], [skip]

    def get(self: Any) -> Any:
        if armed[0] and self is s:
            if left[0]:
                left[0] -= 1
            else:
                armed[0] = False
                action()
        return member.__get__(self, cls)

    monkeypatch.setattr(cls, name, property(get, member.__set__))
    return armed


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
    s._q._errors = NextFailure([go2, go3])
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
    errors = s._q._errors = PauseTaker(s._q._errors)

    def first() -> None:
        errors.thread = threading.current_thread()
        s.synchronize()

    t = Background(first, threading.Event())
    assert errors.inside.wait(timeout=30)  # it has read the failure, not yet taken it
    with pytest.raises(srt.LaunchError, match="once"):
        s.synchronize()
    errors.resume.set()
    assert t.join() is None  # the failure was reported once: to the main thread


def test_device_synchronize_keeps_failures_of_a_stream_destroyed_meanwhile(dev, gate, monkeypatch):
    # A device synchronize drains destroyed streams' queues, then kept only those with failures.
    # A stream destroyed meanwhile (its failure still to come) was dropped unreported.
    s1 = stream(dev)
    g1 = gate(s1)
    s1.destroy()
    inside = threading.Event()
    real = s1._q.drain

    def drain() -> None:
        inside.set()
        real()

    monkeypatch.setattr(s1._q, "drain", drain)
    settled = threading.Event()
    t = Background(dev.synchronize, settled)
    assert inside.wait(timeout=30)
    s2 = stream(dev)
    g2 = gate(s2)
    s2.launch(fail_kernel, "late")
    s2.destroy()
    g1.open()
    assert t.join() is None
    g2.open()
    with pytest.raises(srt.LaunchError, match="late"):
        dev.synchronize()


# -- a device's streams and pools, created and destroyed meanwhile ----------------------------
def test_device_synchronize_survives_a_stream_created_meanwhile(dev, monkeypatch):
    # A device synchronize iterated the device's set of streams while another thread created
    # one: "RuntimeError: Set changed size during iteration".
    s = stream(dev)
    created: list[srt.Stream] = []
    ptr = srt.malloc(16, device=dev)
    armed = on_read(monkeypatch, "_capture", s,
                    lambda: created.append(srt.Stream(dev, non_blocking=True)))
    srt.free(ptr)  # synchronizes the device, skipping capturing streams
    assert not armed[0] and created


# -- the sanitizer's labels: two threads enqueue on one stream --------------------------------
@srt.kernel
def write_noting_label(ctx, p, labels):
    """Writes 4 floats at ``p``; notes its operation's label (stream position) in run order."""
    labels.append(instrument.current().pos)
    ctx.array(p, (4,), np.float32)[:] = 1


class Contended:
    """A lock that sets ``waiting`` when a thread has to wait for it."""

    def __init__(self, lock: Any, waiting: threading.Event) -> None:
        self.lock, self.waiting = lock, waiting

    def __enter__(self) -> Contended:
        if not self.lock.acquire(blocking=False):
            self.waiting.set()
            self.lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


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


# -- capture while other threads use its streams ----------------------------------------------
@srt.kernel
def note_kernel(ctx, out, what):
    """Appends ``what`` to ``out`` where it runs."""
    out.append(what)


def test_stream_begin_capture_by_two_threads_one_captures(dev, monkeypatch):
    # Two threads begin a capture on one stream: both saw it idle, the second one's capture
    # replaced the first, which stayed active forever (every later srt.malloc refused, GLOBAL).
    s = stream(dev)
    real, armed = capture.Capture, [True]

    class Hooked(real):
        def __init__(self, *args: Any) -> None:
            if armed[0]:  # checked idle, about to capture: the other thread begins meanwhile
                armed[0] = False
                s.begin_capture()
            super().__init__(*args)

    monkeypatch.setattr(capture, "Capture", Hooked)
    with pytest.raises(srt.IllegalStateError, match="already capturing"):
        s.begin_capture()
    assert [c.origin for c in capture._active] == [s]
    assert len(s.end_capture()._nodes) == 0
    assert not capture._active
    p = srt.malloc(16, device=dev)  # no capture left to refuse it
    srt.free(p)


def test_stream_launch_while_its_capture_ends_runs_on_the_stream(dev, monkeypatch):
    # A launch read its stream's capture, then the capture ended (on another thread): the node
    # went into the graph end_capture had already returned, and the kernel never ran.
    s = stream(dev)
    out: list[str] = []
    graphs: list[srt.Graph] = []
    s.begin_capture()
    armed = on_read(monkeypatch, "device", s, lambda: graphs.append(s.end_capture()))
    s.launch(note_kernel, out, "after the end")
    assert not armed[0]
    s.synchronize()
    assert out == ["after the end"]
    assert len(graphs[0]._nodes) == 0


def test_stream_wait_while_the_capture_ends_does_not_join_it(dev, monkeypatch):
    # A stream waited on a captured event while the capture ended: it joined the ended capture
    # and stayed in it, every later call on it captured into a graph nobody would run.
    o, s2 = stream(dev), stream(dev)
    out: list[str] = []
    o.begin_capture()
    o.launch(note_kernel, out, "captured")
    ev = o.record()
    armed = on_read(monkeypatch, "_legacy", s2, o.end_capture)
    s2.wait(ev)
    assert not armed[0]
    assert not s2.is_capturing() and s2._capture is None
    s2.launch(note_kernel, out, "eager")
    s2.synchronize()
    assert out == ["eager"]


def test_stream_wait_on_an_event_rerecorded_meanwhile(dev, monkeypatch):
    # A stream waited on a captured event while another thread recorded it again outside the
    # capture: read twice, the event was captured at the first read and not at the second, and
    # the wait failed an internal assertion. It takes one of the two records.
    o, s2, x = stream(dev), stream(dev), stream(dev)
    out: list[str] = []
    o.begin_capture()
    o.launch(note_kernel, out, "captured")
    ev = o.record()
    armed = on_read(monkeypatch, "_capture", s2, lambda: x.record(ev), skip=1)
    s2.wait(ev)  # read the event while captured: forks into the capture
    assert not armed[0]
    assert s2.is_capturing()
    s2.launch(note_kernel, out, "forked")
    o.wait(s2.record())
    g = o.end_capture()
    assert len(g._nodes) == 2
    g.instantiate().launch(o)
    o.synchronize()
    assert out == ["captured", "forked"]


def test_capture_two_threads_launch_on_one_stream_in_order(dev, monkeypatch):
    # Two threads launch on one capturing stream. Each read the stream's dependencies, added its
    # node after them and replaced them: the second read before the first replaced, so the two
    # nodes were unordered (and one unjoined: end_capture failed).
    s = stream(dev)
    out: list[str] = []
    s.begin_capture()
    cap = s._capture
    settled = threading.Event()
    cap._lock = Contended(cap._lock, settled)
    real_add, armed, threads = cap.graph._add, [True], []

    def add(*args: Any) -> Any:
        if armed[0]:  # the first node's dependencies read: the other launch comes now
            armed[0] = False
            threads.append(Background(lambda: s.launch(note_kernel, out, "b"), settled))
            assert settled.wait(timeout=30)
        return real_add(*args)

    monkeypatch.setattr(cap.graph, "_add", add)
    s.launch(note_kernel, out, "a")
    assert threads[0].join() is None
    g = s.end_capture()
    first, second = g._nodes
    assert second._deps == [first]


def test_stream_legacy_use_while_a_capture_begins_is_refused(dev, monkeypatch):
    # The flag that enables the legacy-stream check was set after the capture had begun: a
    # legacy-stream call made meanwhile (another thread) was not refused, though it would
    # implicitly synchronize with the capturing blocking stream.
    monkeypatch.setattr(stream_module, "_capturing", False)  # as before any capture
    b = srt.Stream(dev)  # blocking
    errors: list[BaseException] = []

    def use_legacy() -> None:
        try:
            dev.default_stream.launch_host_func(lambda: None)
        except srt.CaptureImplicitError as exc:
            errors.append(exc)

    armed = on_read(monkeypatch, "non_blocking", b, use_legacy)
    b.begin_capture()
    assert not armed[0]
    assert len(errors) == 1
    with pytest.raises(srt.CaptureInvalidatedError):
        b.end_capture()


class _ExitHook:
    """A lock that runs ``action`` once, just after its next release: another thread's turn."""

    def __init__(self, real: Any, action: Callable[[], None]) -> None:
        self.real, self.action, self.armed = real, action, True

    def __enter__(self) -> None:
        self.real.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.real.release()
        if self.armed:
            self.armed = False
            self.action()


def test_unsafe_call_while_the_capture_ends_is_not_refused(dev, monkeypatch):
    # srt.malloc read the active captures, then the (GLOBAL) capture ended: the call, after the
    # end, was refused by a capture that no longer existed.
    s = stream(dev)
    graphs: list[srt.Graph] = []
    s.begin_capture()
    hook = _ExitHook(capture._lock, lambda: graphs.append(s.end_capture()))
    monkeypatch.setattr(capture, "_lock", hook)
    p = srt.malloc(16, device=dev)
    assert not hook.armed and len(graphs) == 1
    srt.free(p)


CHECKED_CALLS = ["stream synchronize", "stream query", "event synchronize", "event query",
                 "device synchronize", "legacy stream use"]


@pytest.mark.parametrize("call", CHECKED_CALLS)
def test_refused_call_while_the_capture_ends_proceeds(dev, monkeypatch, call):
    # A call refused during a capture read the capture, then another thread ended it before the
    # call invalidated it: the call, after the end, was refused (or, where the capture was read
    # again, failed with AttributeError on None).
    s = stream(dev) if call != "legacy stream use" else srt.Stream(dev)  # blocking: legacy rule
    p = srt.malloc(16, device=dev)
    s.begin_capture()
    ev = s.record()
    graphs: list[srt.Graph] = []
    real = capture.Capture.invalidate
    armed = [True]

    def invalidate(self: capture.Capture, reason: str) -> bool:
        if armed[0]:  # the call has read the capture: the capturing thread ends it now
            armed[0] = False
            graphs.append(s.end_capture())
        return real(self, reason)

    monkeypatch.setattr(capture.Capture, "invalidate", invalidate)
    if call == "stream synchronize":
        s.synchronize()
    elif call == "stream query":
        assert s.query()
    elif call == "event synchronize":
        ev.synchronize()
    elif call == "event query":
        assert ev.query()
    elif call == "device synchronize":
        dev.synchronize()
    else:
        dev.default_stream.memset(p, 0, 16)
        dev.default_stream.synchronize()
    assert not armed[0] and len(graphs) == 1
    assert not s.is_capturing()
    srt.free(p)


def test_capture_dependencies_updated_as_the_capture_ends_are_refused(dev, monkeypatch):
    # update_capture_dependencies read the capture, then it ended: the update went into the
    # ended capture silently, as if the stream still captured.
    s = stream(dev)
    s.begin_capture()
    s.launch(note_kernel, [], "captured")
    node = s.capture_info().dependencies[0]
    graphs: list[srt.Graph] = []
    real_as_nodes = srt.Graph._as_nodes
    armed = [True]

    def as_nodes(self: srt.Graph, nodes: Any, what: str) -> Any:
        if armed[0]:  # the capture was read: the capturing thread ends it now
            armed[0] = False
            graphs.append(s.end_capture())
        return real_as_nodes(self, nodes, what)

    monkeypatch.setattr(srt.Graph, "_as_nodes", as_nodes)
    with pytest.raises(srt.IllegalStateError, match="not capturing"):
        s.update_capture_dependencies([node], replace=True)
    assert not armed[0] and len(graphs) == 1 and len(graphs[0]._nodes) == 1
