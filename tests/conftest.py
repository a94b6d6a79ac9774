"""Shared fixtures: devices, gate kernels, delay injection."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt
from streamrt.backends import cpu
from streamrt.graph import capture

BUF_N = 16  # float32 elements of the ``buf``/``out`` fixtures


@pytest.fixture
def dev():
    """cpu:0, synchronized and checked clean after the test."""
    d = srt.Device("cpu:0")
    yield d
    d.synchronize()


@pytest.fixture
def delay():
    """Delay injection on (random 0-200 us before each worker op): missing waits show up."""
    prev = cpu.set_delay_us(200)
    yield 200
    cpu.set_delay_us(prev)


@srt.kernel
def gate_kernel(ctx, event):
    """Blocks its stream until ``event`` is set: makes "not yet complete" certain."""
    if not event.wait(timeout=60):
        raise TimeoutError("gate never opened")


class Gate:
    """A host-controlled gate enqueued on a stream."""

    def __init__(self, stream: srt.Stream) -> None:
        self.event = threading.Event()
        stream.launch(gate_kernel, self.event)

    def open(self) -> None:
        self.event.set()


@pytest.fixture
def gate():
    """``gate(stream)`` blocks ``stream`` until the returned gate is opened (auto-opened at teardown)."""
    gates: list[Gate] = []

    def make(stream: srt.Stream) -> Gate:
        g = Gate(stream)
        gates.append(g)
        return g

    yield make
    for g in gates:
        g.open()


@srt.kernel
def fill_kernel(ctx, ptr, n, value):
    ctx.array(ptr, (n,), np.float32)[:] = value


@srt.kernel
def add_one_kernel(ctx, ptr, n):
    x = ctx.array(ptr, (n,), np.float32)
    x += 1


@srt.kernel
def copy_kernel(ctx, dst, src, n):
    ctx.array(dst, (n,), np.float32)[:] = ctx.array(src, (n,), np.float32, readonly=True)


@pytest.fixture(autouse=True)
def _no_capture_leak():
    """A failed test must not leave a capture active (it would break every later test)."""
    yield
    srt.exchange_capture_mode(srt.CaptureMode.GLOBAL)
    leaked = list(capture._active)
    for cap in leaked:
        cap.finish()
    assert not leaked, f"captures left active: {leaked}"


@pytest.fixture
def s(dev):
    """A non-blocking stream on cpu:0."""
    return srt.Stream(dev, non_blocking=True)


@pytest.fixture
def s2(dev):
    """A second non-blocking stream on cpu:0."""
    return srt.Stream(dev, non_blocking=True)


@pytest.fixture
def buf(dev):
    """``BUF_N`` zeroed float32 of device memory."""
    p = srt.malloc(BUF_N * 4, dev)
    srt.memset(p, 0, BUF_N * 4)
    yield p
    srt.free(p)


@pytest.fixture
def out(buf):
    """The same as ``buf``, under another name."""
    return buf


def read_f32(p, n=BUF_N):
    """A synchronous copy of ``n`` float32 at ``p``."""
    return srt.read(p, (n,), np.float32)
