"""Peer access between the cpu devices (API.md §9.2, ``cudaDeviceCanAccessPeer`` /
``cudaDeviceEnablePeerAccess`` / ``cudaDeviceDisablePeerAccess``): without it a kernel, copy or
memset of one device touching another device's memory is refused (``InvalidAddressError``), as
a GPU faults; a graph exec is launched only from a stream of the device it was made for."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import streamrt as srt
from tests.conftest import fill_kernel

pytestmark = pytest.mark.skipif(srt.device_count("cpu") < 2, reason="needs two cpu devices")

N = 16


@pytest.fixture
def devs():
    d0, d1 = srt.Device("cpu:0"), srt.Device("cpu:1")
    yield d0, d1
    for a, b in ((d0, d1), (d1, d0)):
        if a.can_access_peer(b) and b.index in a._peers:
            a.disable_peer_access(b)
    d0.synchronize()
    d1.synchronize()


@pytest.fixture
def mem(devs):
    """``N`` float32 of cpu:0 memory (``a``, ones) and of cpu:1 memory (``b``, twos)."""
    d0, d1 = devs
    a, b = srt.malloc(N * 4, d0), srt.malloc(N * 4, d1)
    srt.write(a, np.ones(N, np.float32))
    srt.write(b, np.full(N, 2.0, np.float32))
    yield a, b
    srt.free(a)
    srt.free(b)


def _read(p: int) -> np.ndarray:
    return srt.read(p, (N,), np.float32)


def _refused_at_sync(s: srt.Stream, line: int) -> srt.LaunchError:
    """The failure a synchronize raises for a kernel refused where it touched memory."""
    with pytest.raises(srt.LaunchError) as ei:
        s.synchronize()
    cause = ei.value.__cause__
    assert isinstance(cause, srt.InvalidAddressError)  # what the kernel's view raised
    assert "without peer access" in str(cause) and "cpu:0" in str(cause)
    assert f"test_peer_access.py:{line}" in str(ei.value)  # the launch's line
    assert "InvalidAddressError" in str(ei.value)
    return ei.value


def _line() -> int:
    """The caller's line, minus one (the launch just above it)."""
    return inspect.currentframe().f_back.f_lineno - 1  # type: ignore[union-attr]


# -- the calls and their errors -------------------------------------------------------------------
def test_peer_can_access_and_the_errors_of_enable_and_disable(devs):
    d0, d1 = devs
    assert d0.can_access_peer(d1) is True and d1.can_access_peer("cpu:0") is True
    assert d0.can_access_peer(d0) is False  # cudaDeviceCanAccessPeer answers 0 for itself
    with pytest.raises(srt.InvalidTypeError):
        d0.can_access_peer(None)
    with pytest.raises(srt.InvalidTypeError):
        d0.enable_peer_access(1.0)
    for call in (d0.enable_peer_access, d0.disable_peer_access):
        with pytest.raises(srt.InvalidDeviceError):
            call(d0)  # a device with itself: cudaErrorInvalidDevice
        with pytest.raises(srt.InvalidDeviceError):
            call("cpu:99")
    with pytest.raises(srt.PeerAccessNotEnabledError) as ei:
        d1.disable_peer_access(d0)
    assert isinstance(ei.value, srt.IllegalStateError)
    assert (ei.value.code, ei.value.name) == (705, "cudaErrorPeerAccessNotEnabled")
    assert "cpu:1" in str(ei.value) and "cpu:0" in str(ei.value)
    d1.enable_peer_access(0)  # an index names a device of the same backend
    with pytest.raises(srt.PeerAccessAlreadyEnabledError) as ei2:
        d1.enable_peer_access("cpu:0")
    assert isinstance(ei2.value, srt.IllegalStateError)
    assert (ei2.value.code, ei2.value.name) == (704, "cudaErrorPeerAccessAlreadyEnabled")
    d0.enable_peer_access(d1)  # one way each: cpu:1 -> cpu:0 did not enable cpu:0 -> cpu:1
    d1.disable_peer_access(d0)
    d0.disable_peer_access(d1)
    with pytest.raises(srt.PeerAccessNotEnabledError):
        d0.disable_peer_access(d1)


# -- kernels -------------------------------------------------------------------------------------
def test_peer_kernel_writing_another_devices_memory_refused_allowed_refused_again(devs, mem):
    d0, d1 = devs
    a, _ = mem
    s1 = srt.Stream(d1, non_blocking=True)
    s1.launch(fill_kernel, a, N, 5.0)
    _refused_at_sync(s1, _line())
    assert (_read(a) == 1.0).all()  # nothing written
    d1.enable_peer_access(d0)
    s1.launch(fill_kernel, a, N, 6.0)
    s1.synchronize()
    assert (_read(a) == 6.0).all()
    d1.disable_peer_access(d0)  # the view cpu:1 made under the access must not be handed out
    s1.launch(fill_kernel, a, N, 7.0)
    _refused_at_sync(s1, _line())
    assert (_read(a) == 6.0).all()
    s1.launch(fill_kernel, a, N, 8.0)  # the stream still works, and the refusal is kept
    _refused_at_sync(s1, _line())


def test_peer_view_the_owner_made_is_not_handed_to_another_device(devs, mem):
    # the owner's kernel views the memory first (the view is cached for the fast path): a
    # kernel of the other device asking the same view is refused all the same
    d0, d1 = devs
    a, _ = mem
    s0, s1 = srt.Stream(d0, non_blocking=True), srt.Stream(d1, non_blocking=True)
    s0.launch(fill_kernel, a, N, 3.0)
    s0.synchronize()
    s1.launch(fill_kernel, a, N, 4.0)
    _refused_at_sync(s1, _line())
    assert (_read(a) == 3.0).all()


def test_peer_access_is_checked_when_the_kernel_runs(devs, mem, gate, delay):
    # as a GPU faults on memory it does not map when the kernel touches it: a kernel enqueued
    # while access was enabled, held back by a gate, runs after the access was disabled
    d0, d1 = devs
    a, _ = mem
    s1 = srt.Stream(d1, non_blocking=True)
    d1.enable_peer_access(d0)
    g = gate(s1)
    s1.launch(fill_kernel, a, N, 9.0)
    line = _line()
    d1.disable_peer_access(d0)
    g.open()
    _refused_at_sync(s1, line)
    assert (_read(a) == 1.0).all()


def test_peer_graph_kernel_node_writing_another_devices_memory_refused(devs, mem):
    d0, d1 = devs
    a, _ = mem
    g = srt.Graph()
    with d1:
        g.add_kernel_node(fill_kernel, a, N, 5.0)
        ge = g.instantiate()
    s1 = srt.Stream(d1, non_blocking=True)
    ge.launch(s1)
    with pytest.raises(srt.LaunchError) as ei:
        s1.synchronize()
    assert isinstance(ei.value.__cause__, srt.InvalidAddressError)
    assert (_read(a) == 1.0).all()
    d1.enable_peer_access(d0)
    ge.launch(s1)
    s1.synchronize()
    assert (_read(a) == 5.0).all()


# -- copies and memsets: refused at enqueue --------------------------------------------------------
def test_peer_copies_and_memsets_both_directions(devs, mem):
    d0, d1 = devs
    a, b = mem
    s0, s1 = srt.Stream(d0, non_blocking=True), srt.Stream(d1, non_blocking=True)
    host = np.zeros(N, np.float32)
    for s, call in ((s1, lambda: s1.memcpy(b, a, N * 4)),  # read cpu:0 memory on cpu:1
                    (s1, lambda: s1.memcpy(a, b, N * 4)),  # write it
                    (s1, lambda: s1.memcpy(host, a, N * 4)),
                    (s1, lambda: s1.memset(a, 0, N * 4)),
                    (s0, lambda: s0.memcpy(a, b, N * 4)),  # and the other way round
                    (s0, lambda: s0.memset(b, 0, N * 4))):
        pos = s._pos
        with pytest.raises(srt.InvalidAddressError) as ei:
            call()
        assert "without peer access" in str(ei.value)
        assert s._pos == pos  # nothing enqueued
    assert (_read(a) == 1.0).all() and (_read(b) == 2.0).all()
    d1.enable_peer_access(d0)  # cpu:1 reaches cpu:0's memory; cpu:0 still not cpu:1's
    s1.memcpy(b, a, 8)
    s1.memset(a + 8, 0, 8)
    s1.memcpy(host, a, N * 4)
    s1.synchronize()
    assert host[:4].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert _read(b)[:3].tolist() == [1.0, 1.0, 2.0]
    with pytest.raises(srt.InvalidAddressError):
        s0.memcpy(a, b, N * 4)
    d1.disable_peer_access(d0)
    with pytest.raises(srt.InvalidAddressError):
        s1.memcpy(b, a, N * 4)
    # srt.memcpy is cudaMemcpy: with unified addressing it copies between devices (as
    # cudaMemcpyPeer does) whether or not peer access is enabled
    srt.memcpy(b, a, N * 4)
    assert _read(b)[:3].tolist() == [1.0, 1.0, 0.0]


def test_peer_capture_of_a_copy_of_another_devices_memory_refused(devs, mem):
    d0, d1 = devs
    a, b = mem
    s1 = srt.Stream(d1, non_blocking=True)
    s1.begin_capture()
    with pytest.raises(srt.InvalidAddressError):
        s1.memset(a, 0, N * 4)
    with pytest.raises(srt.InvalidAddressError):
        s1.memcpy(b, a, N * 4)
    s1.end_capture()


# -- graphs ---------------------------------------------------------------------------------------
def test_peer_graph_launched_on_another_devices_stream_refused(devs, mem):
    d0, d1 = devs
    a, _ = mem
    s0 = srt.Stream(d0, non_blocking=True)
    s0.begin_capture()
    s0.launch(fill_kernel, a, N, 4.0)
    g = s0.end_capture()
    with d1:  # made while cpu:1 is current: the exec is of its kernel's device all the same
        ge = g.instantiate()
    s1 = srt.Stream(d1, non_blocking=True)
    for _ in range(2):
        pos = s1._pos
        with pytest.raises(srt.InvalidValueError) as ei:
            ge.launch(s1)
        assert "cpu:0" in str(ei.value) and "cpu:1" in str(ei.value)
        assert s1._pos == pos
        with pytest.raises(srt.InvalidValueError):
            ge.upload(s1)
    d1.enable_peer_access(d0)  # peer access does not move an exec to another device
    with pytest.raises(srt.InvalidValueError):
        ge.launch(s1)
    ge.launch(s0)  # its own device's streams launch it, the record path included
    ge.launch(s0)
    s0.synchronize()
    assert (_read(a) == 4.0).all()


def test_peer_graph_memset_and_memcpy_nodes_of_another_devices_memory_refused(devs, mem):
    d0, d1 = devs
    a, b = mem
    g = srt.Graph()  # no kernel nodes: any device's stream may launch it, if it reaches the memory
    ms = g.add_memset_node(a, 0, N * 4)
    g.add_memcpy_node(b, a, 8, deps=ms)
    ge = g.instantiate()
    s0, s1 = srt.Stream(d0, non_blocking=True), srt.Stream(d1, non_blocking=True)
    for s in (s0, s1):  # cpu:0 reaches a, not b; cpu:1 b, not a
        pos = s._pos
        with pytest.raises(srt.InvalidAddressError) as ei:
            ge.launch(s)
        assert "without peer access" in str(ei.value) and s._pos == pos
    d1.enable_peer_access(d0)
    ge.launch(s1)
    ge.launch(s1)  # (the launch record's path)
    s1.synchronize()
    assert (_read(a) == 0.0).all() and _read(b)[:3].tolist() == [0.0, 0.0, 2.0]
    d1.disable_peer_access(d0)  # the launch record is dropped: the next launch is checked again
    with pytest.raises(srt.InvalidAddressError):
        ge.launch(s1)
    # with a kernel node the exec is of that node's device: refused when instantiated
    gk = srt.Graph()
    with d1:
        k = gk.add_kernel_node(fill_kernel, b, N, 1.0)
    gk.add_memset_node(a, 0, N * 4, deps=k)
    with pytest.raises(srt.InvalidAddressError) as ei:
        gk.instantiate()
    assert "instantiate" in str(ei.value)
