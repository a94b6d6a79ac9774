"""A device synchronized while other host threads destroy or create its streams (interleavings
forced by tests/contract/interleave.py)."""

from __future__ import annotations

import threading

import pytest

import streamrt as srt
from tests.contract.interleave import Background, fail_kernel, on_read
from tests.contract.pools import stream


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
