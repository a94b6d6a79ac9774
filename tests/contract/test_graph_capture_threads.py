"""Stream capture while other host threads use its streams: one of two begins captures, work and waits
as the capture ends, legacy use as it begins, checked and unsafe calls as it ends (interleavings
forced by tests/contract/interleave.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import streamrt as srt
from streamrt import legacy as legacy_module
from streamrt.graph import capture, refusals
from tests.contract.interleave import Background, Contended, note_kernel, on_read
from tests.contract.pools import stream


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
    # at the stream's first capture read, after the event's capture was read once
    armed = on_read(monkeypatch, "_capture", s2, lambda: x.record(ev))
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
    """A legacy-stream call made by another thread while a capture begins is refused.

    The story: the flag that enables the legacy-stream check was set after the capture had
    begun, so such a call was not refused, though it would implicitly synchronize with the
    capturing blocking stream.
    """
    monkeypatch.setattr(legacy_module, "capturing", False)  # as before any capture
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
    hook = _ExitHook(refusals._lock, lambda: graphs.append(s.end_capture()))
    monkeypatch.setattr(refusals, "_lock", hook)  # the lock check_unsafe reads the captures under
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
