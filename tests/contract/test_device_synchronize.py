"""``Device.synchronize``: it waits for every stream, covers destroyed ones and reports each failure
once, and forgets streams gone for good."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt
from tests.contract.devices import _held_failure


def test_device_synchronize_waits_for_every_stream(gate):
    d = srt.Device("cpu:0")
    s1, s2 = srt.Stream(d, non_blocking=True), srt.Stream(d, non_blocking=True)
    seen = []
    g = gate(s1)
    s1.launch_host_func(seen.append, 1)
    s2.launch_host_func(seen.append, 2)
    threading.Timer(0.01, g.open).start()  # opened from elsewhere; synchronize must wait for it
    d.synchronize()
    assert sorted(seen) == [1, 2]
    assert s1.query() and s2.query()


def test_device_synchronize_covers_destroyed_streams_and_reports_once(gate):
    d, s, g, seen = _held_failure(gate)
    s.destroy()  # pending work still completes; the device synchronize waits for it
    threading.Timer(0.01, g.open).start()  # opened from elsewhere; synchronize must wait for it
    with pytest.raises(srt.LaunchError, match="boom"):
        d.synchronize()
    assert seen == [1]
    d.synchronize()  # reported once


@pytest.mark.parametrize("sanitize", [False, True])
def test_device_synchronize_forgets_streams_gone_for_good_from_clocks(sanitize):
    # the legacy stream's clock named every blocking stream ever made, and every record copied
    # it: a program making streams for days slowed down for good. After a device synchronize a
    # host proof orders later work after theirs, for pools and the sanitizer alike
    dev = srt.Device("cpu:1")
    leg = dev.default_stream
    if sanitize:
        srt.sanitizer.clear()
        srt.sanitizer.enable("collect")
    try:
        p = srt.malloc(64, dev)
        gone = set()
        for i in range(20):
            s = srt.Stream(dev)  # blocking: the legacy stream orders after it
            s.memset(p, i, 64)
            leg.memset(p, 100, 64)
            s.destroy()
            gone.add(s.id)
        assert gone <= set(leg._clock)
        dev.synchronize()
        assert not gone & set(leg._clock)
        out = np.empty(64, np.uint8)
        s = srt.Stream(dev, non_blocking=True)
        s.memcpy(out, p, 64)  # ordered after the gone streams' memsets by the host proof alone
        assert (out == 100).all()
        if sanitize:
            assert srt.sanitizer.report() == []
        srt.free(p)
    finally:
        if sanitize:
            srt.sanitizer.disable()
            srt.sanitizer.clear()
