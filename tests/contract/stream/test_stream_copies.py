"""Stream copies and memsets on every backend: every direction, pageable and pinned host memory, bad
input that writes nothing."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt


def test_stream_memcpy_every_direction(dev):
    s = srt.Stream(dev, non_blocking=True)
    if srt.device_count(dev.backend) < 2:
        pytest.skip(f"needs two {dev.backend} devices")
    d0 = srt.Device(f"{dev.backend}:0")
    d1 = srt.Device(f"{dev.backend}:1")
    src = np.arange(64, dtype=np.uint8)
    a = srt.malloc(64, device=d0)
    b = srt.malloc(64, device=d1)
    h = srt.malloc_host(64)
    s.memcpy(a, src, 64)  # host -> device
    d0.enable_peer_access(d1)  # a stream copy touching another device's memory needs it
    try:
        s.memcpy(b, a, 64)  # peer copy
        s.memcpy(h, b, 64)  # device -> pinned host
    finally:
        d0.disable_peer_access(d1)
    out = bytearray(64)
    s.memcpy(out, h, 64)  # pinned -> pageable (synchronous)
    assert bytes(out) == src.tobytes()
    mv = memoryview(bytearray(32))
    s.memcpy(mv, a + 32, 32)  # interior pointer, memoryview destination
    assert bytes(mv) == bytes(range(32, 64))
    s.memcpy(a, b"\x09" * 8, 8)  # bytes source
    s.synchronize()  # s is non-blocking: srt.read (legacy stream) is not ordered after it
    assert srt.read(a, (8,), np.uint8).tolist() == [9] * 8
    for p in (a, b):
        srt.free(p)
    srt.free_host(h)


def test_stream_memcpy_pageable_source_taken_at_call_time(s, gate):
    p = s.malloc(16)
    g = gate(s)
    host = np.full(4, 1.0, np.float32)
    s.memcpy(p, host, 16)
    host[:] = 2.0  # after the call: must not affect the queued copy (CUDA stages pageable H2D)
    g.open()
    s.synchronize()
    assert srt.read(p, (4,), np.float32).tolist() == [1.0] * 4
    s.free(p)


def test_stream_memcpy_pinned_is_asynchronous(s, gate):
    p = s.malloc(16)
    h = srt.malloc_host(16)
    srt.write(h, np.full(4, 1.0, np.float32))
    g = gate(s)
    s.memcpy(p, h, 16)
    srt.write(h, np.full(4, 2.0, np.float32))  # pinned: the copy reads it when it runs
    g.open()
    s.synchronize()
    assert srt.read(p, (4,), np.float32).tolist() == [2.0] * 4
    s.free(p)
    srt.free_host(h)


@pytest.mark.parametrize("bad", ["oob_dst", "oob_src", "unknown", "negative", "short_host",
                                 "readonly_host", "float_ptr", "noncontig", "freed"])
def test_stream_memcpy_bad_input_writes_nothing(s, bad):
    p = s.malloc(512)
    s.memset(p, 0xAB, 512)
    s.synchronize()
    q = srt.malloc(512)
    srt.free(q)
    host = np.zeros(1024, np.uint8)
    cases = {
        "oob_dst": (srt.InvalidAddressError, lambda: s.memcpy(p + 256, host, 512)),
        "oob_src": (srt.InvalidAddressError, lambda: s.memcpy(host, p + 1, 512)),
        "unknown": (srt.InvalidAddressError, lambda: s.memcpy(12345, host, 4)),
        "negative": (srt.InvalidValueError, lambda: s.memcpy(p, host, -1)),
        "short_host": (srt.InvalidValueError, lambda: s.memcpy(p, host[:10], 512)),
        "readonly_host": (srt.InvalidValueError, lambda: s.memcpy(b"x" * 512, p, 512)),
        "float_ptr": (srt.InvalidTypeError, lambda: s.memcpy(p, 3.5, 4)),
        "noncontig": (srt.InvalidValueError, lambda: s.memcpy(p, host[::2], 4)),
        "freed": (srt.InvalidAddressError, lambda: s.memcpy(q, host, 4)),
    }
    err, call = cases[bad]
    pos = s._pos
    with pytest.raises(err):
        call()
    assert s._pos == pos  # nothing enqueued
    s.synchronize()
    assert srt.read(p, (512,), np.uint8).tolist() == [0xAB] * 512
    s.free(p)


def test_stream_memset(s):
    p = s.malloc(1024)
    s.memset(p, 255, 1024)
    s.memset(p + 512, 1, 16)
    s.synchronize()  # s is non-blocking: the legacy stream (srt.read) is not ordered after it
    out = srt.read(p, (1024,), np.uint8)
    assert out[:512].tolist() == [255] * 512 and out[512:528].tolist() == [1] * 16
    for value, err in ((256, srt.InvalidValueError), (-1, srt.InvalidValueError),
                       (1.0, srt.InvalidTypeError)):
        with pytest.raises(err):
            s.memset(p, value, 4)
    with pytest.raises(srt.InvalidAddressError):
        s.memset(p + 1000, 0, 100)
    assert srt.read(p + 1000, (24,), np.uint8).tolist() == [255] * 24
    s.free(p)


def test_backend_async_copies_every_direction(bdev):
    s = srt.Stream(bdev, non_blocking=True)
    n = 1000
    host = np.arange(n, dtype=np.float32)
    a, b = srt.malloc(4 * n, bdev), srt.malloc(4 * n, bdev)
    s.memcpy(a, host, 4 * n)  # pageable source: staged, so changing it now is harmless
    host[:] = -1
    s.memcpy(b, a, 4 * n)
    back = np.zeros(n, np.float32)
    s.memcpy(back, b, 4 * n)  # pageable destination: returns once the data is there
    assert np.array_equal(back, np.arange(n, dtype=np.float32))
    s.synchronize()
    for p in (a, b):
        srt.free(p)
