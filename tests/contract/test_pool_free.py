"""Frees of pool memory: a pointer goes back to the pool that owns it; ``srt.free`` synchronizes, then
frees; a refused free leaves its stream as it was."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt
from tests.contract.pools import BLOCK, pool_with, served, snapshot_kernel, stream


# -- ownership, srt.free ------------------------------------------------------------------------
def test_pool_pointer_returns_to_owning_pool(dev):
    pa, pb = pool_with(dev), pool_with(dev)
    default = dev.default_mem_pool
    dev.set_mem_pool(pb)
    try:
        s = stream(dev)
        p = s.malloc(4096, pa)
        q = s.malloc(4096)  # the device's current pool: pb
        assert pa.stats()["live_allocations"] == 1 and pb.stats()["live_allocations"] == 1
        before_b = pb.stats()
        s.free(p)  # no pool argument: the pointer goes back to pa
        assert pa.stats()["free_count"] == 1 and pa.used_mem_current == 0
        assert pb.stats() == before_b
        assert s.malloc(4096, pa) == p  # and pa serves it again
        before_a = pa.stats()
        srt.free(q)  # the synchronous free also finds the owner
        assert pb.stats()["free_count"] == 1 and pa.stats() == before_a
        s.free(p)
    finally:
        dev.set_mem_pool(default)


def test_pool_srt_free_synchronizes_then_frees(dev, gate):
    pool = srt.MemPool(dev)  # threshold 0: srt.free is itself a synchronize point
    s = stream(dev)
    p = s.malloc(BLOCK, pool)
    s.memset(p, 7, BLOCK)
    g = gate(s)
    seen: list[np.ndarray] = []
    s.launch(snapshot_kernel, p, BLOCK, seen)
    opener = threading.Timer(0.05, g.open)  # srt.free must block until the gate opens
    opener.start()
    try:
        srt.free(p)
    finally:
        opener.cancel()
        g.open()
    assert len(seen) == 1 and (seen[0] == 7).all()  # the pending work ran before the free
    st = pool.stats()
    assert st["free_count"] == 1 and st["used_mem_current"] == 0
    assert st["reserved_mem_current"] == 0 and st["release_count"] == 1
    with pytest.raises(srt.InvalidAddressError):
        s.free(p)  # gone for good


def test_pool_srt_free_makes_block_ready_for_any_stream(dev):
    pool = pool_with(dev, False)
    s, other = stream(dev), stream(dev)
    p = s.malloc(BLOCK, pool)
    s.memset(p, 1, BLOCK)
    srt.free(p)
    before = pool.stats()
    assert other.malloc(BLOCK, pool) == p
    assert served(pool, before) == ["reuse_after_sync"]


def test_pool_refused_free_after_a_record_leaves_the_stream_as_it_was(dev):
    # the free's own position (see the test above) is taken only for a free that goes ahead: a
    # refused cudaFreeAsync enqueues nothing
    s = stream(dev)
    s.record()
    pos = s._pos
    with pytest.raises(srt.InvalidAddressError):
        s.free(12345)
    assert s._pos == pos
