"""Black-box helpers: gates (host functions that hold a stream), timeouts, kernels."""
from __future__ import annotations

import threading

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


def call_with_timeout(fn, *args, timeout=20.0):
    """Run fn in a thread; fail (not hang) if it does not return in time."""
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
