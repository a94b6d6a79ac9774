"""Black-box helpers: gates (host functions that hold a stream), timeouts, kernels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import streamrt as srt

_OPEN_GATES: list[threading.Event] = []


class Gate:
    """Holds a stream (a host function blocking on an Event) until opened."""

    def __init__(self):
        self.ev = threading.Event()
        _OPEN_GATES.append(self.ev)

    def hold(self, stream):
        stream.launch_host_func(self._wait)

    def _wait(self):
        if not self.ev.wait(20):
            raise RuntimeError("gate never opened")

    def open(self):
        self.ev.set()


def other_thread(fn, *args, timeout=20.0) -> dict:
    """Run fn(*args) in another thread; fail (not hang) if it does not return in time.
    Returns {"r": its result} or {"e": the exception it raised}."""
    box: dict = {}

    def run():
        try:
            box["r"] = fn(*args)
        except BaseException as e:  # noqa: BLE001
            box["e"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{fn} did not return within {timeout}s"
    return box


def call_with_timeout(fn, *args, timeout=20.0):
    """Run fn in a thread; fail (not hang) if it does not return in time."""
    box = other_thread(fn, *args, timeout=timeout)
    if "e" in box:
        raise box["e"]
    return box.get("r")


def finishes_within(fn, *args, timeout=2.0) -> bool:
    """True if fn(*args) returns within timeout (thread left running otherwise)."""
    done = threading.Event()

    def run():
        try:
            fn(*args)
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    return done.wait(timeout)


def sync(obj, timeout=20.0):
    return call_with_timeout(obj.synchronize, timeout=timeout)


@srt.kernel
def scale(ctx, ptr, n, factor):
    x = ctx.array(ptr, (n,), np.float32)
    x *= factor


@srt.kernel
def add_one(ctx, ptr, n):
    x = ctx.array(ptr, (n,), np.float32)
    x += 1


@srt.kernel
def fill(ctx, ptr, n, value):
    ctx.array(ptr, (n,), np.float32)[:] = value


@srt.kernel
def copy_k(ctx, dst, src, n):
    ctx.array(dst, (n,), np.float32)[:] = ctx.array(src, (n,), np.float32, readonly=True)


@pytest.fixture(autouse=True)
def _bb_cleanup():
    from streamrt.backends import cpu

    yield
    for ev in _OPEN_GATES:
        ev.set()
    _OPEN_GATES.clear()
    try:
        srt.sanitizer.disable()
    except Exception:
        pass
    cpu.set_delay_us(0)
    for name in ("cpu:0", "cpu:1"):
        try:
            call_with_timeout(srt.Device(name).synchronize, timeout=30)
        except srt.StreamRTError:
            pass


@pytest.fixture
def dev():
    d = srt.Device("cpu:0")
    with d:
        yield d


@pytest.fixture
def delay():
    from streamrt.backends import cpu

    cpu.set_delay_us(300)
    yield
    cpu.set_delay_us(0)


def two_streams():
    """Two non-blocking streams (not ordered with each other nor with the default stream)."""
    return srt.Stream(non_blocking=True), srt.Stream(non_blocking=True)


def alloc_then_free(pool, *sizes, stream=None):
    """Allocate blocks of these sizes from pool on stream (a new blocking one by default), then
    free them all without synchronizing; returns (stream, reserved bytes once all were allocated)."""
    s = stream if stream is not None else srt.Stream()
    ptrs = [s.malloc(n, pool) for n in sizes]
    reserved = pool.reserved_mem_current
    for q in ptrs:
        s.free(q)
    return s, reserved


def assert_ordered(first, second, link=None, pending=None):
    """With first held by a gate, host work enqueued on second after first's (and after link(),
    e.g. second.wait(first.record())) does not run before first's: pending(second) holds while
    the gate is closed (default: second.query() is False), and the log reads first, second."""
    g = Gate()
    log = []
    g.hold(first)
    first.launch_host_func(log.append, "first")
    if link is not None:
        link()
    second.launch_host_func(log.append, "second")
    assert pending(second) if pending is not None else not second.query()
    g.open()
    sync(second)
    assert log == ["first", "second"]


def assert_not_ordered(held, other):
    """With held held by a gate, other's work completes and other.synchronize returns."""
    g = Gate()
    g.hold(held)
    log = []
    other.launch_host_func(log.append, "other")
    assert finishes_within(other.synchronize, timeout=10)
    assert log == ["other"]
    g.open()
    sync(held)


def held_fill(stream, value, **launch):
    """A zeroed 16-byte buffer, then stream held by a gate and a fill of 4 floats with value
    enqueued behind it; returns (gate, buffer)."""
    g = Gate()
    p = srt.malloc(16)
    srt.memset(p, 0, 16)
    g.hold(stream)
    stream.launch(fill, p, 4, value, **launch)
    return g, p


def download(stream, ptr, shape, dtype=np.float32):
    """Copy ptr to a new host array on stream and synchronize it."""
    out = np.zeros(shape, dtype)
    stream.memcpy(out, ptr, out.nbytes)
    sync(stream)
    return out


def free_and_sync(stream, *ptrs):
    for p in ptrs:
        stream.free(p)
    sync(stream)


def sync_error(obj, error=None):
    """obj.synchronize raises error (LaunchError by default); returns the exception."""
    with pytest.raises(error or srt.LaunchError) as ei:
        sync(obj)
    return ei.value


def sync_after_race(obj):
    """Synchronize obj after a race made on purpose (an access left unordered to show what it
    reads): under the sanitizer (a STREAMRT_SANITIZE run) that synchronize reports the race."""
    if not srt.sanitizer.enabled():
        return sync(obj)
    with pytest.raises(srt.SanitizerError) as ei:
        sync(obj)
    assert "race" in str(ei.value.kind).lower()


PY = sys.executable


def _sub(code, **env):
    e = dict(os.environ, **env)
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=e, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _events(path):
    data = json.loads(Path(path).read_text())
    return data["traceEvents"] if isinstance(data, dict) else data
