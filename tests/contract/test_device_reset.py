"""``Device.reset``: it waits, then destroys every stream, event, pool, capture and graph exec of the
device, discards pending failures and restores the default pool."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt
from tests.contract.devices import _held_failure


def test_device_reset_destroys_everything():
    d = srt.Device("cpu:1")
    s = srt.Stream(d)
    p = srt.malloc(4096, device=d)
    q = s.malloc(4096)
    pool = srt.MemPool(d)
    e = s.record()
    d.reset()
    assert d.memory_info()[0] == d.memory_info()[1]  # every byte back
    with pytest.raises(srt.InvalidHandleError):
        s.launch_host_func(print)
    with pytest.raises(srt.InvalidHandleError):
        pool.trim_to(0)
    with pytest.raises(srt.InvalidAddressError):
        srt.read(p, (1,), np.uint8)
    with pytest.raises(srt.InvalidAddressError):
        srt.free(q)
    with pytest.raises(srt.InvalidHandleError):  # destroyed too (it only lost its record)
        e.query()
    # the device stays usable
    s2 = srt.Stream(d)
    r = s2.malloc(64)
    s2.memset(r, 7, 64)
    s2.synchronize()
    assert srt.read(r, (64,), np.uint8).tolist() == [7] * 64
    s2.free(r)
    d.default_stream.synchronize()


def test_device_reset_ends_captures_of_its_streams():
    # a reset destroyed a capturing stream and left its capture active: srt.malloc (GLOBAL mode)
    # and device synchronizes were refused for good
    d, other = srt.Device("cpu:1"), srt.Device("cpu:0")
    s = srt.Stream(d, non_blocking=True)
    s.begin_capture()
    s.launch_host_func(print)
    o = srt.Stream(other, non_blocking=True)
    o.begin_capture(srt.CaptureMode.RELAXED)  # another device's capture is left alone
    d.reset()
    assert o.is_capturing()
    for call in (s.is_capturing, lambda: s.launch_host_func(print)):  # s: destroyed by the reset
        with pytest.raises(srt.InvalidHandleError):
            call()
    assert len(o.end_capture().nodes()) == 0
    p = srt.malloc(16, device=d)
    srt.free(p)
    d.synchronize()


def test_device_reset_destroys_graph_execs(any_dev):
    d = any_dev
    with d:
        g = srt.Graph()
        a = g.add_mem_alloc_node(4096)
        g.add_mem_free_node(a.ptr, deps=[a])
        ge = g.instantiate()
        plain = srt.Graph()
        plain.add_empty_node()
        ge2 = plain.instantiate()
        s = srt.Stream(d, non_blocking=True)
        ge.launch(s)
        ge2.launch(s)
        s.synchronize()
    assert d.graph_mem_info()["reserved"] >= 4096
    d.reset()
    assert d.graph_mem_info()["reserved"] == 0
    for e in (ge, ge2):
        with pytest.raises(srt.InvalidHandleError):
            e.launch(srt.Stream(d, non_blocking=True))


def test_device_reset_destroys_execs_made_there_never_launched(any_dev):
    # cudaGraphInstantiate makes the exec in the current context, which cudaDeviceReset destroys
    d = any_dev
    p = srt.malloc(4096, d)
    with d:
        g = srt.Graph()
        g.add_memset_node(p, 1, 4096)  # no node names a device
        ge = g.instantiate()
    d.reset()
    with pytest.raises(srt.InvalidHandleError, match="destroyed"):
        ge.launch(srt.Stream(d, non_blocking=True))


def test_device_reset_waits_then_discards_failures(gate):
    d, _, g, seen = _held_failure(gate)
    raised = []

    def reset():
        try:
            d.reset()
        except BaseException as exc:  # pragma: no cover - the failure this test looks for
            raised.append(exc)

    t = threading.Thread(target=reset)
    t.start()
    t.join(0.2)
    assert t.is_alive(), "reset returned before the device's work completed"
    g.open()
    t.join()
    assert seen == [1] and raised == []  # a reset discards pending failures
    d.synchronize()  # the failure went with the reset


def test_device_reset_destroys_events():
    d = srt.Device("cpu:1")
    s = srt.Stream(d, non_blocking=True)
    a, b = srt.Event(d, timing=True), srt.Event(d, timing=True)
    other = srt.Event("cpu:0")
    s.record(a)
    s.record(b)
    s.synchronize()
    assert a.elapsed_time(b) >= 0
    d.reset()
    for call in (lambda: a.elapsed_time(b), a.query, a.synchronize, a.destroy,
                 lambda: srt.Stream(d).record(a), lambda: srt.Stream(d).wait(b)):
        with pytest.raises(srt.InvalidHandleError, match="destroyed"):
            call()
    assert other.query()  # another device's event is left alone
    srt.Stream(d).record(srt.Event(d))  # new events work


def test_device_reset_restores_the_default_pool():
    d = srt.Device("cpu:1")
    pool = srt.MemPool(d)
    d.set_mem_pool(pool)
    assert d.mem_pool is pool
    d.reset()
    assert d.mem_pool is d.default_mem_pool
    s = srt.Stream(d, non_blocking=True)
    p = s.malloc(64)  # from the (new) default pool, not the destroyed one
    s.free(p)
    s.synchronize()
