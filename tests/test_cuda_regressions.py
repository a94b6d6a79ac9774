"""cuda backend bugs found by running it on the fake CUDA runtime (``tests/cuda_fake``); each test
fails without its fix. They need a usable cuda device (a GPU, or ``STREAMRT_CUDA_FAKE=1``)."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest

import streamrt as srt

from .conftest import cuda_reason

pytestmark = pytest.mark.cuda


@pytest.fixture
def cuda0():
    reason = cuda_reason()
    if reason is not None:
        pytest.skip(f"no usable CUDA device here: {reason}")
    d = srt.Device("cuda:0")
    yield d
    d.synchronize()


@pytest.fixture
def cuda1(cuda0):
    if srt.device_count("cuda") < 2:
        pytest.skip("needs two CUDA devices")
    d = srt.Device("cuda:1")
    yield d
    d.synchronize()


def test_legacy_stream_of_a_device_that_is_not_current(cuda0, cuda1, gate):
    # the legacy stream handle names the *current* device's legacy stream: querying or
    # synchronizing cuda:0's default stream while cuda:1 is current must still mean cuda:0's
    leg0 = cuda0.default_stream
    g = gate(leg0)
    p = srt.malloc(16, cuda1)  # makes cuda:1 the thread's current CUDA device
    assert not leg0.query()
    threading.Timer(0.3, g.open).start()
    t0 = time.monotonic()
    leg0.synchronize()
    assert time.monotonic() - t0 > 0.2
    srt.free(p)


def test_synchronize_does_not_cover_work_enqueued_during_it(cuda0, gate):
    s = srt.Stream(cuda0, non_blocking=True)
    first = gate(s)
    later = []

    def enqueue_then_open():
        time.sleep(0.2)
        later.append(gate(s))  # enqueued by another thread while the main one synchronizes
        time.sleep(0.2)
        first.open()

    threading.Thread(target=enqueue_then_open).start()
    s.synchronize()
    assert not s.query() and not s.record().query()  # the second gate is still closed
    later[0].open()
    s.synchronize()
    assert s.query()


@pytest.mark.parametrize("what", ["malloc", "pool", "host"])
def test_sizes_past_size_t_are_out_of_memory(cuda0, what):
    s = srt.Stream(cuda0, non_blocking=True)
    call = {"malloc": lambda: srt.malloc(2**70, cuda0), "pool": lambda: s.malloc(2**70),
            "host": lambda: srt.malloc_host(2**70)}[what]
    with cuda0, pytest.raises(srt.OutOfMemoryError):
        call()
    pool = srt.MemPool(cuda0, max_size=2**70, release_threshold=2**70)  # no OverflowError
    pool.trim_to(2**70)
    pool.destroy()


def test_peer_copy_between_devices(cuda0, cuda1):
    a, b = srt.malloc(256, cuda0), srt.malloc(256, cuda1)
    srt.write(a, np.arange(256, dtype=np.uint8))
    srt.memcpy(b, a, 256)
    s = srt.Stream(cuda1, non_blocking=True)
    s.memcpy(a, b, 128)  # a stream of one device copying into the other's memory
    s.synchronize()
    assert srt.read(b, (256,), np.uint8).tolist() == list(range(256))
    srt.free(a)
    srt.free(b)


def test_graph_with_host_node_is_released_and_completes_in_flight(cuda0, gate):
    from streamrt.backends import cuda

    gc.collect()
    before = len(cuda._jobs)
    s = srt.Stream(cuda0, non_blocking=True)
    ran = []
    g = srt.Graph()
    g.add_host_node(ran.append, "in flight")
    ge = g.instantiate()
    hold = gate(s)
    ge.launch(s)
    ge.destroy()  # while its launch waits behind the gate: CUDA completes it
    del ge, g
    gc.collect()
    hold.open()
    s.synchronize()
    assert ran == ["in flight"]
    for i in range(3):
        g = srt.Graph()
        g.add_host_node(ran.append, i)
        ge = g.instantiate()
        ge.launch(s)
        s.synchronize()
        ge.destroy()
        del ge, g
    gc.collect()
    assert ran == ["in flight", 0, 1, 2]
    assert len(cuda._jobs) == before  # no host-node job (nor its graph exec) kept alive
