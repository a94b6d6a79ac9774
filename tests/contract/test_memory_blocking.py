"""Synchronous helpers: malloc/free/malloc_host/free_host/memcpy/memset/read/write (every
backend)."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from tests.contract.backend_kernels import _dev_f32


@pytest.fixture
def dev(any_dev):
    """Device 0 of each backend: the synchronous helpers are a contract of every backend."""
    return any_dev


def assert_nothing_allocated(dev, free_before: int) -> None:
    """Refused calls took no device memory. On cpu the free bytes are exact; on cuda they are the
    whole GPU's (cudaMemGetInfo), which the driver may grow meanwhile (a failed allocation may make
    it release cached pool memory), so only a decrease, an allocation left behind, is a failure."""
    free = dev.memory_info()[0]
    assert free == free_before if dev.backend == "cpu" else free >= free_before


def test_blocking_malloc_alignment_and_nonzero(dev):
    align = 512 if dev.backend == "cpu" else 256  # cudaMalloc guarantees 256 bytes
    ptrs = [srt.malloc(n) for n in (0, 1, 511, 512, 513, 100000)]
    assert all(p != 0 and p % align == 0 for p in ptrs)
    assert len(set(ptrs)) == len(ptrs)
    for p in ptrs:
        srt.free(p)


def test_blocking_roundtrip_and_pointer_arithmetic(dev):
    p = srt.malloc(4096)
    a = np.arange(1024, dtype=np.float32)
    srt.write(p, a)
    assert np.array_equal(srt.read(p, (1024,), np.float32), a)
    assert np.array_equal(srt.read(p + 40, (2,), np.float32), a[10:12])
    srt.write(p + 4, np.array([99.0], np.float32))
    assert srt.read(p, (3,), np.float32).tolist() == [0.0, 99.0, 2.0]
    out = srt.read(p, (4,), np.float32)
    out[0] = -1  # read returns a copy, not a view
    assert srt.read(p, (1,), np.float32)[0] == 0.0
    srt.memset(p, 0, 4096)
    assert not srt.read(p, (4096,), np.uint8).any()
    srt.free(p)


def test_blocking_memcpy_device_to_device_and_peer():
    a = srt.malloc(256, device="cpu:0")
    b = srt.malloc(256, device="cpu:1")
    srt.write(a, np.arange(256, dtype=np.uint8))
    srt.memcpy(b, a, 256)
    assert srt.read(b, (256,), np.uint8).tolist() == list(range(256))
    srt.free(a)
    srt.free(b)


def test_blocking_pinned_host(dev):
    h = srt.malloc_host(64)
    srt.write(h, np.full(16, 3, np.int32))
    assert srt.read(h, (16,), np.int32).tolist() == [3] * 16
    with pytest.raises(srt.InvalidAddressError):
        srt.free(h)  # pinned memory goes back with free_host
    srt.free_host(h)
    with pytest.raises(srt.InvalidAddressError):
        srt.free_host(h)


def test_blocking_free_errors_leave_state(dev):
    p = srt.malloc(1024)
    free_before = dev.memory_info()[0]
    with pytest.raises(srt.InvalidAddressError):
        srt.free(p + 512)  # interior pointer
    with pytest.raises(srt.InvalidAddressError):
        srt.free(987654321)
    with pytest.raises(srt.InvalidTypeError):
        srt.free("p")
    assert_nothing_allocated(dev, free_before)
    srt.write(p, np.ones(4, np.uint8))  # still alive
    srt.free(p)
    with pytest.raises(srt.InvalidAddressError):
        srt.free(p)  # double free
    srt.free(0)  # cudaFree(NULL) is a no-op


@pytest.mark.parametrize(("nbytes", "err"), [
    (-1, srt.InvalidValueError), (1.5, srt.InvalidTypeError), ("1", srt.InvalidTypeError),
    (True, srt.InvalidTypeError), (1 << 62, srt.OutOfMemoryError),
])
def test_blocking_malloc_bad_sizes(dev, nbytes, err):
    free_before = dev.memory_info()[0]
    with pytest.raises(err):
        srt.malloc(nbytes)
    with pytest.raises(err):
        srt.malloc_host(nbytes)
    assert_nothing_allocated(dev, free_before)


def test_blocking_oom_message(dev):
    with pytest.raises(srt.OutOfMemoryError, match=str(1 << 62)):
        srt.malloc(1 << 62)


def test_blocking_out_of_bounds_writes_nothing(dev):
    p = srt.malloc(512)
    srt.memset(p, 7, 512)
    with pytest.raises(srt.InvalidAddressError):
        srt.write(p + 256, np.zeros(512, np.uint8))
    with pytest.raises(srt.InvalidAddressError):
        srt.memset(p + 1, 0, 512)
    with pytest.raises(srt.InvalidAddressError):
        srt.read(p, (513,), np.uint8)
    assert srt.read(p, (512,), np.uint8).tolist() == [7] * 512
    srt.free(p)


def test_backend_memory_roundtrip_and_memset(bdev):
    p = _dev_f32(bdev, np.arange(64))
    assert np.array_equal(srt.read(p, (64,), np.float32), np.arange(64, dtype=np.float32))
    srt.memset(p, 0, 128)
    out = srt.read(p, (64,), np.float32)
    assert not out[:32].any() and np.array_equal(out[32:], np.arange(32, 64, dtype=np.float32))
    free, total = bdev.memory_info()
    assert 0 <= free <= total
    srt.free(p)
    with pytest.raises(srt.InvalidAddressError):
        srt.free(p)
