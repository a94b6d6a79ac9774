"""Failures inside queued work and interruptions of host waits: each is reported once, as a
chained LaunchError, by a synchronize that covers it, and leaves the runtime usable."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import streamrt as srt


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
