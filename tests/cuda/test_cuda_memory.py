"""cuda backend memory and pools, bugs found on the fake CUDA runtime (``tests/cuda/fake``): sizes, peer
copies, pool memory at reset and synchronize, a destroyed pool's attributes, out-of-memory messages."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt

pytestmark = pytest.mark.cuda


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
    cuda1.enable_peer_access(cuda0)  # a stream copy touching another GPU's memory needs it
    try:
        s.memcpy(a, b, 128)  # a stream of one device copying into the other's memory
        s.synchronize()
    finally:
        cuda1.disable_peer_access(cuda0)
    assert srt.read(b, (256,), np.uint8).tolist() == list(range(256))
    srt.free(a)
    srt.free(b)


def test_device_reset_frees_pool_memory(cuda0):
    s = srt.Stream(cuda0, non_blocking=True)
    free_before, _ = cuda0.memory_info()
    pool = srt.MemPool(cuda0)
    ptrs = [s.malloc(4 << 20, pool) for _ in range(4)] + [s.malloc(4 << 20)]  # and the default's
    s.synchronize()
    assert cuda0.memory_info()[0] <= free_before - 20 * (1 << 20)
    cuda0.reset()  # live pool allocations and the created pool go with the reset
    # cudaMemGetInfo counts the whole GPU: the driver may keep a little for itself meanwhile (page
    # tables of the mappings it made), never a whole granule (2 MiB) of the 20 MiB freed here
    assert cuda0.memory_info()[0] > free_before - (2 << 20)
    assert ptrs and pool.reserved_mem_current == 0


def test_destroyed_pool_keeps_its_attributes_readable(cuda0):
    pool = srt.MemPool(cuda0, release_threshold=1 << 20)
    pool.destroy()
    assert pool.release_threshold == 1 << 20 and pool.stats()["used_mem_current"] == 0
    with pytest.raises(srt.InvalidHandleError):
        pool.release_threshold = 0


def test_pool_out_of_memory_says_how_much(cuda0):
    s = srt.Stream(cuda0, non_blocking=True)
    pool = srt.MemPool(cuda0, max_size=4 << 20)
    # far past the limit: a driver may round maxSize up to its own allocation granularity
    with pytest.raises(srt.OutOfMemoryError, match=r"of 67108864 bytes failed: the pool reserves"):
        s.malloc(64 << 20, pool)
    pool.destroy()


def test_synchronize_with_a_host_function_pending_releases_pool_memory(cuda0, monkeypatch):
    # With a host function pending, synchronize polls (the driver's thread running it needs the
    # GIL); it must still end in a synchronize call, where the driver releases pool memory
    # down to the threshold. It used to end in a query: the memory stayed reserved.
    from streamrt.backends import cuda as backend

    pool = srt.MemPool(cuda0, release_threshold=0)
    s = srt.Stream(cuda0, non_blocking=True)
    opened = threading.Event()
    s.launch_host_func(opened.wait, 30)
    p = s.malloc(1 << 20, pool)
    s.free(p)
    def polled(name: str) -> None:
        real = getattr(backend.rt, name)

        def query(handle):
            opened.set()  # the first poll lets the host function finish
            return real(handle)

        monkeypatch.setattr(backend.rt, name, query)

    polled("cudaEventQuery")
    polled("cudaStreamQuery")
    s.synchronize()
    monkeypatch.undo()
    assert opened.is_set()  # the synchronize polled
    assert pool.get_attr(srt.MemPoolAttr.RESERVED_MEM_CURRENT) == 0
    pool.destroy()
