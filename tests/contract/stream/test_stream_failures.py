"""Failures inside queued work and interruptions of host waits: each is reported once, as a
chained LaunchError, by a synchronize that covers it, and leaves the runtime usable."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import streamrt as srt
from tests.conftest import PY_KERNELS, cpu_only


@srt.kernel
def _raise(ctx, exc):
    raise exc


def _settles(s: srt.Stream, seconds: float = 5.0) -> bool:
    """Whether ``s`` finishes its work (a stopped worker never does): polled, never hangs."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if s.query():
            return True
        time.sleep(0.005)
    return False


class _BreaksItsRepr:
    """A host function whose repr fails once it has run (a label made then must not stop the
    stream's worker)."""

    __qualname__ = "BreaksItsRepr"

    def __init__(self) -> None:
        self.ran = False

    def __call__(self) -> None:
        self.ran = True
        raise ValueError("host function failed")

    def __repr__(self) -> str:
        if self.ran:
            raise RuntimeError("repr failed")
        return "BreaksItsRepr()"


class _NoRepr:
    def __call__(self) -> None:
        pass

    def __repr__(self) -> str:
        raise RuntimeError("repr failed")


def test_stream_failure_label_failing_is_still_reported():
    s = srt.Stream(non_blocking=True)
    s.launch_host_func(_BreaksItsRepr())
    assert _settles(s), "the worker stopped: every later synchronize would hang"
    with pytest.raises(srt.LaunchError, match="host function failed") as info:
        s.synchronize()
    assert isinstance(info.value.__cause__, ValueError)
    s.launch(_raise, KeyError("later"))  # the stream still runs work
    with pytest.raises(srt.LaunchError, match="later"):
        s.synchronize()
    s.synchronize()


def test_stream_failure_with_non_str_notes_is_reported():
    exc = ValueError("odd notes")
    exc.__notes__ = [1]  # what add_note never makes, but any code may set
    s = srt.Stream(non_blocking=True)
    s.launch(_raise, exc)
    assert _settles(s), "the worker stopped: every later synchronize would hang"
    with pytest.raises(srt.LaunchError, match="odd notes") as info:
        s.synchronize()
    assert info.value.__cause__ is exc
    s.synchronize()


def test_graph_parallel_node_failure_label_failing_does_not_hang():
    ran = []

    @srt.kernel
    def mark(ctx, tag):
        ran.append(tag)

    g = srt.Graph()
    a = g.add_kernel_node(mark, "a")
    x = g.add_kernel_node(mark, "x", deps=[a])
    b = g.add_host_node(_BreaksItsRepr(), deps=[a])  # runs on a replay pool thread
    g.add_kernel_node(mark, "c", deps=[b, x])
    s = srt.Stream(non_blocking=True)
    g.instantiate().launch(s)
    assert _settles(s), "the graph launch never finished"
    with pytest.raises(srt.LaunchError, match="host function failed") as info:
        s.synchronize()
    assert isinstance(info.value.__cause__, ValueError)
    assert "c" not in ran  # a failed node's dependents do not run
    s.synchronize()


def test_stream_failure_whose_str_raises_is_a_chained_launch_error():
    class BadStr(Exception):
        def __str__(self) -> str:
            raise RuntimeError("str failed")

    s = srt.Stream(non_blocking=True)
    exc = BadStr()
    s.launch(_raise, exc)
    with pytest.raises(srt.LaunchError, match="BadStr") as info:
        s.synchronize()
    assert info.value.__cause__ is exc
    s.synchronize()


def test_stream_failure_huge_message_is_cut():
    s = srt.Stream(non_blocking=True)
    s.launch(_raise, ValueError("x" * 1_000_000))
    with pytest.raises(srt.LaunchError) as info:
        s.synchronize()
    assert len(str(info.value)) < 10_000
    assert len(str(info.value.__cause__)) == 1_000_000  # the cause keeps it whole


def test_host_func_whose_repr_raises_is_enqueued():
    s = srt.Stream(non_blocking=True)
    s.launch_host_func(_NoRepr())
    s.synchronize()
    g = srt.Graph()
    g.add_host_node(_NoRepr())
    g.instantiate().launch(s)
    s.synchronize()


def test_stream_failure_not_lost_behind_sanitizer_finding():
    @srt.kernel
    def write(ctx, p):
        ctx.array(p, (4,), np.float32)[:] = 1

    srt.sanitizer.enable()
    try:
        s1, s2 = srt.Stream(non_blocking=True), srt.Stream(non_blocking=True)
        p = s1.malloc(1024)
        s1.launch(_raise, ValueError("kernel failed"))
        s1.launch(write, p)
        s2.launch(write, p)  # unordered with the malloc on s1: a finding
        dev = s1.device
        raised = []
        for _ in range(3):
            try:
                dev.synchronize()
            except srt.StreamRTError as e:
                raised.append(e)
        assert sorted(type(e).__name__ for e in raised) == ["LaunchError", "SanitizerError"]
        launch = next(e for e in raised if isinstance(e, srt.LaunchError))
        assert str(launch.__cause__) == "kernel failed"
        s1.free(p)
        s1.synchronize()
    finally:
        srt.sanitizer.disable()


_INTERRUPTED = textwrap.dedent("""
    import os, signal, threading, time
    import streamrt as srt

    # a shell starting the suite in the background leaves SIGINT ignored, and children inherit
    # that: Python then installs no KeyboardInterrupt handler of its own
    signal.signal(signal.SIGINT, signal.default_int_handler)

    @srt.kernel
    def slow(ctx, t):
        time.sleep(t)

    s = srt.Stream(non_blocking=True)
    s.launch(slow, 1.5)
    ev = s.record()
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    try:
        {wait}
    except KeyboardInterrupt:
        print("interrupted", time.monotonic() - t0 < 1.2)
    {wait}
    q = s._q
    print("state", q._targets == [], not q._progress._lock.locked())
    s.launch(slow, 0.0)
    s.synchronize()
    print("usable")
""")


@pytest.mark.parametrize("wait", ["s.synchronize()", "ev.synchronize()",
                                  "s.device.synchronize()"])
def test_synchronize_interrupted_surfaces_and_stays_usable(wait):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(os.path.dirname(srt.__file__)), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _INTERRUPTED.format(wait=wait)], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["interrupted True", "state True True", "usable"]


def test_stream_failures_are_reported_once_and_runtime_stays_usable(s):
    cpu_only(s.device, PY_KERNELS)
    @srt.kernel
    def boom(ctx):
        raise RuntimeError("kaboom")

    ran = []
    s.launch(boom)
    s.launch_host_func(ran.append, 1)  # later work still runs
    with pytest.raises(srt.LaunchError, match="kaboom") as info:
        s.synchronize()
    assert isinstance(info.value.__cause__, RuntimeError)
    assert "boom" in str(info.value)
    assert ran == [1]
    s.synchronize()  # reported once
    s.launch_host_func(ran.append, 2)
    s.synchronize()
    assert ran == [1, 2]


def test_stream_host_func_failure_reported_by_event_and_device(dev):
    s = srt.Stream(dev, non_blocking=True)

    def bad():
        raise KeyError("host")

    s.launch_host_func(bad)
    e = s.record()
    with pytest.raises(srt.LaunchError, match="bad"):
        e.synchronize()
    s.launch_host_func(bad)
    with pytest.raises(srt.LaunchError):
        dev.synchronize()


@pytest.mark.parametrize("wait", ["its stream", "its device", "an event behind it",
                                  "a stream waiting behind it", "the legacy stream"])
def test_stream_host_func_waiting_behind_itself_is_refused(dev, wait):
    # a host function synchronizing its own stream waited for itself: the process hung for good
    s = srt.Stream(dev, non_blocking=wait != "the legacy stream")  # blocking: legacy-ordered
    later = srt.Event(dev)
    other = srt.Stream(dev, non_blocking=True)
    ran: list[int] = []
    call = {"its stream": s.synchronize, "its device": dev.synchronize,
            "an event behind it": later.synchronize, "a stream waiting behind it":
            other.synchronize, "the legacy stream": dev.default_stream.synchronize}[wait]
    go = threading.Event()
    s.launch_host_func(go.wait, 30)  # the waiting host function runs once all is enqueued
    s.launch_host_func(lambda: (s.record(later), call()) if wait == "an event behind it"
                       else call())
    if wait == "a stream waiting behind it":
        other.wait(s.record())  # other waits for the host function
    elif wait == "the legacy stream":
        dev.default_stream.launch_host_func(ran.append, 0)  # behind blocking s: legacy order
    s.launch_host_func(ran.append, 1)
    go.set()
    with pytest.raises(srt.LaunchError) as info:
        s.synchronize()
    assert isinstance(info.value.__cause__, srt.NotPermittedError)
    assert info.value.__cause__.code == 800 and 1 in ran
    s.launch_host_func(ran.append, 2)  # the stream goes on
    s.synchronize()
    dev.synchronize()
    assert sorted(ran) == ([0, 1, 2] if wait == "the legacy stream" else [1, 2])


def test_stream_graph_host_node_waiting_is_refused(dev):
    # a graph's host node synchronizing (on cpu it may run on a replay worker thread) hung too
    s = srt.Stream(dev, non_blocking=True)
    g = srt.Graph()
    a = g.add_empty_node()
    g.add_host_node(s.synchronize, deps=[a])
    g.add_host_node(lambda: None, deps=[a])  # a second branch: a parallel replay on cpu
    ge = g.instantiate()
    ge.launch(s)
    with pytest.raises(srt.LaunchError) as info:
        s.synchronize()
    assert isinstance(info.value.__cause__, srt.NotPermittedError)
    ge.destroy()


def test_stream_host_func_waiting_for_finished_work_is_allowed(dev):
    # on cuda, a host function synchronizing an event whose work had finished raised
    # NotPermittedError when no one had queried its stream since (a stale completion count)
    a, b = srt.Stream(dev, non_blocking=True), srt.Stream(dev, non_blocking=True)
    p = b.malloc(16)
    b.memset(p, 0, 16)
    ev = b.record()
    a.wait(ev)  # b's work is complete when the host function runs; nothing asked b since
    ran: list[int] = []
    a.launch_host_func(lambda: (ev.synchronize(), ran.append(1)))
    a.synchronize()
    assert ran == [1]
    b.free(p)
    b.synchronize()


def test_stream_failure_seen_through_wait(dev):
    cpu_only(dev, PY_KERNELS)
    a, b = srt.Stream(dev, non_blocking=True), srt.Stream(dev, non_blocking=True)

    @srt.kernel
    def boom(ctx):
        raise RuntimeError("upstream")

    a.launch(boom)
    b.wait(a.record())
    with pytest.raises(srt.LaunchError, match="upstream"):
        b.synchronize()  # b's synchronize covers a's failed kernel


def test_stream_failure_is_reported_only_by_a_synchronize_covering_it(dev):
    s = srt.Stream(dev, non_blocking=True)
    s.launch_host_func(list)
    before = s.record()

    def bad():
        raise KeyError("later")

    s.launch_host_func(bad)
    ran = threading.Event()
    s.launch_host_func(ran.set)
    assert ran.wait(timeout=60)  # in stream order: the failure has happened
    # the event marks work before the failure, and the failure is s's, not another stream's
    before.synchronize()
    other = srt.Stream(dev, non_blocking=True)
    other.launch_host_func(list)
    other.synchronize()
    with pytest.raises(srt.LaunchError, match="later"):
        s.synchronize()


def test_backend_host_function_error_reported_at_synchronize(bdev):
    s = srt.Stream(bdev, non_blocking=True)

    def boom():
        raise RuntimeError("boom")

    s.launch_host_func(boom)
    with pytest.raises(srt.LaunchError) as info:
        s.synchronize()
    assert isinstance(info.value.__cause__, RuntimeError)
