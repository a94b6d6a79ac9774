"""Two cpu devices (STREAMRT_CPU_DEVICES defaults to 2): what CUDA's multi-GPU rules say holds
across devices: current device per thread, events, copies, pools, synchronize, reset, graphs."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt

pytestmark = pytest.mark.skipif(srt.device_count("cpu") < 2, reason="needs two cpu devices")


@pytest.fixture
def devs():
    d0, d1 = srt.Device("cpu:0"), srt.Device("cpu:1")
    yield d0, d1
    d0.synchronize()
    d1.synchronize()


@srt.kernel
def fill_k(ctx, p, n, v):
    ctx.array(p, (n,), np.float32)[:] = v


@srt.kernel
def read_k(ctx, p, n):
    ctx.array(p, (n,), np.float32, readonly=True).sum()


@srt.kernel
def device_k(ctx, out):
    out.append(ctx.device)


def test_current_device_is_per_thread(devs):
    d0, d1 = devs
    seen = []
    with d1:
        t = threading.Thread(target=lambda: seen.append(srt.current_device()))
        t.start()
        t.join()
        assert srt.current_device() is d1
        assert srt.Stream().device is d1 and srt.Event().device is d1
        assert srt.current_stream() is d1.default_stream
    assert seen == [d0]  # cudaSetDevice is per host thread; a new thread starts on device 0
    assert d0.default_stream is not d1.default_stream


def test_memcpy_sync_across_devices_orders_after_the_source_device(devs, san):
    # cudaMemcpyPeer / cudaMemcpy: serialized with the pending work of the current device and of
    # both ends' devices; the copy must not race with a blocking stream of the source's device
    d0, d1 = devs
    s0 = srt.Stream(d0)
    a = s0.malloc(64)
    b = srt.malloc(64, device=d1)
    s0.launch(fill_k, a, 16, 7.0)
    with d0:
        srt.memcpy(b, a, 64)
    assert np.all(srt.read(b, (16,), np.float32) == 7.0)
    assert [f.kind for f in san.report()] == []
    s0.free(a)
    srt.free(b)


def test_record_refuses_an_event_of_another_device_and_wait_accepts_it(devs):
    d0, d1 = devs
    s0, s1 = srt.Stream(d0), srt.Stream(d1)
    with pytest.raises(srt.InvalidHandleError):
        s0.record(srt.Event(d1))  # cudaEventRecord: event and stream on the same device
    gate = threading.Event()
    order = []
    s0.launch_host_func(gate.wait)
    s0.launch_host_func(order.append, "d0")
    s1.wait(s0.record())  # cudaStreamWaitEvent: the event may be of another device
    s1.launch_host_func(order.append, "d1")
    assert not s1.query()
    gate.set()
    s1.synchronize()
    assert order == ["d0", "d1"]


def test_device_synchronize_covers_only_its_device(devs):
    d0, d1 = devs
    s1 = srt.Stream(d1)
    gate = threading.Event()
    s1.launch_host_func(gate.wait)
    d0.synchronize()  # cudaDeviceSynchronize: the current device's work only
    assert not s1.query()
    gate.set()
    d1.synchronize()
    assert s1.query()


def test_pools_are_per_device(devs):
    d0, d1 = devs
    assert d0.default_mem_pool is not d1.default_mem_pool
    p0 = srt.MemPool(d0)
    with pytest.raises(srt.InvalidValueError):
        d1.set_mem_pool(p0)  # cudaDeviceSetMemPool: the pool must be local to the device
    assert d1.mem_pool is d1.default_mem_pool
    p0.destroy()


def test_reset_of_one_device_leaves_the_other_alone(devs):
    d0, d1 = devs
    s1 = srt.Stream(d1)
    p1 = srt.MemPool(d1)
    d1.set_mem_pool(p1)
    b = s1.malloc(64)
    m = srt.malloc(64, device=d1)
    s1.memcpy(b, np.full(16, 3.0, np.float32), 64)
    s0 = srt.Stream(d0)
    a = s0.malloc(64)
    d0.reset()
    with pytest.raises(srt.InvalidHandleError):
        s0.query()
    with pytest.raises(srt.InvalidAddressError):
        srt.read(a, (16,), np.float32)
    assert d1.mem_pool is p1
    assert np.all(srt.read(b, (16,), np.float32) == 3.0)
    s1.free(b)
    srt.free(m)
    s1.synchronize()
    p1.destroy()


def test_graph_kernel_node_runs_on_its_own_device(devs):
    # a kernel node runs on the device it was made on (captured or added, whatever device is
    # current at instantiate); a stream of another device may not launch it (cudaGraphLaunch:
    # tests/contract/test_peer_access.py)
    d0, d1 = devs
    seen: list = []
    c0 = srt.Stream(d0, non_blocking=True)
    c0.begin_capture()
    c0.launch(device_k, seen)
    captured = c0.end_capture()
    built = srt.Graph()
    with d0:
        built.add_kernel_node(device_k, seen)
    s0 = srt.Stream(d0)
    for g in (captured, built):
        with d1:
            ge = g.instantiate()
        with pytest.raises(srt.InvalidValueError):
            ge.launch(srt.Stream(d1))
        ge.launch(s0)
        s0.synchronize()
        ge.destroy()
    assert seen == [d0, d0]


def test_memcpy_sync_of_another_backends_memory_with_a_busy_current_device():
    # the current device (cpu:0, its legacy stream used) is of another backend than the memory
    # copied (cuda:0): its legacy stream was waited on by cuda's, a cross-backend stream wait
    # (AssertionError "streams of one backend only")
    from tests.conftest import backend_device

    cuda = backend_device("cuda")
    cpu = srt.Device("cpu:0")
    p = srt.malloc(64, device=cuda)
    with cpu:
        q = srt.malloc(64)
        cpu.default_stream.memset(q, 0, 64)  # work on cpu:0's legacy stream
        srt.memset(p, 3, 64)
        assert (srt.read(p, (64,), np.uint8) == 3).all()
        srt.free(q)
    srt.free(p)
