"""API.md §1: the synchronous memory helpers (malloc, free, memcpy, read/write, pinned host memory)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt

from .conftest import held_fill, sync

pytestmark = [pytest.mark.api, pytest.mark.timeout(60)]


# ---- sync helpers --------------------------------------------------------------------------

def test_sync_helpers_roundtrip(dev):
    p = srt.malloc(64)
    assert isinstance(p, int)
    srt.write(p, np.arange(16, dtype=np.float32))
    q = srt.malloc(64)
    srt.memcpy(q, p, 64)
    r = srt.read(q, (16,), np.float32)
    assert r.tolist() == list(range(16))
    r[0] = 99  # a copy, not a view
    assert srt.read(q, (1,), np.float32)[0] == 0
    srt.memset(q, 0, 64)
    assert srt.read(q, (16,), np.float32).sum() == 0
    host = np.zeros(16, np.float32)
    srt.memcpy(host, p, 64)
    assert host[5] == 5
    srt.free(p)
    srt.free(q)


def test_sync_memcpy_waits_for_stream_work(dev):
    # srt.memcpy is cudaMemcpy: legacy-default-stream semantics, ordered after blocking streams
    s = srt.Stream()
    g, p = held_fill(s, 4.0)
    out = np.zeros(4, np.float32)
    t = threading.Thread(target=srt.memcpy, args=(out, p, 16), daemon=True)
    t.start()
    g.open()
    t.join(20)
    assert not t.is_alive()
    assert out.tolist() == [4, 4, 4, 4]
    srt.free(p)


def test_malloc_host_as_copy_endpoint(dev):
    s = srt.Stream(non_blocking=True)
    hp = srt.malloc_host(64)
    assert isinstance(hp, int)
    d = s.malloc(64)
    d2 = s.malloc(64)
    s.memcpy(d, np.arange(16, dtype=np.float32), 64)
    s.memcpy(hp, d, 64)
    s.memcpy(d2, hp, 64)
    sync(s)
    assert srt.read(d2, (16,), np.float32).tolist() == list(range(16))
    s.free(d)
    s.free(d2)
    sync(s)
    srt.free_host(hp)


def test_free_invalid_pointer(dev):
    with pytest.raises(srt.StreamRTError):
        srt.free(0xDEAD00)
    p = srt.malloc(16)
    srt.free(p)
    with pytest.raises(srt.StreamRTError):
        srt.free(p)


def test_malloc_too_large_oom(dev):
    _, total = dev.memory_info()
    with pytest.raises(srt.OutOfMemoryError) as ei:
        srt.malloc(total * 4)
    assert isinstance(ei.value, MemoryError)


def test_memcpy_nbytes_beyond_host_buffer(dev):
    s = srt.Stream()
    p = s.malloc(1024)
    with pytest.raises(srt.InvalidValueError):
        s.memcpy(p, np.zeros(4, np.float32), 1024)
    s.free(p)
    sync(s)


def test_read_invalid_address(dev):
    with pytest.raises(srt.InvalidAddressError):
        srt.read(0x7777_0000_0000, (4,), np.uint8)
