"""Tensor: pool-backed data round trips, views, strides, construction checks."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from tests.contract.ops_fixtures import ops_stream  # noqa: F401 (the fixture s)


# -- Tensor -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32, np.uint8,
                                   np.bool_])
def test_tensor_round_trip(s, dtype):
    a = (np.arange(24).reshape(2, 3, 4) % 7).astype(dtype)
    t = srt.Tensor.from_numpy(a, stream=s)
    assert t.shape == a.shape and t.dtype == a.dtype and t.nbytes == a.nbytes
    assert t.device is s.device and t.stream is s
    np.testing.assert_array_equal(t.numpy(s), a)
    t.free()


def test_tensor_from_numpy_takes_data_at_call_time(s, gate):
    g = gate(s)  # the copy cannot run before the gate opens
    a = np.arange(6, dtype=np.float32)
    t = srt.Tensor.from_numpy(a, stream=s)
    a[:] = -1  # too late to matter: the pageable source was staged
    g.open()
    np.testing.assert_array_equal(t.numpy(s), np.arange(6, dtype=np.float32))


def test_tensor_from_non_contiguous_numpy(s):
    a = np.arange(20, dtype=np.float64).reshape(4, 5)[:, ::2]
    t = srt.Tensor.from_numpy(a, stream=s)
    assert t.desc.is_contiguous
    np.testing.assert_array_equal(t.numpy(s), a)


def test_tensor_strided_view_reads_back(s):
    base = np.arange(60, dtype=np.float32).reshape(6, 10)
    t = srt.Tensor.from_numpy(base, stream=s)
    v = t.as_strided((3, 4), (20, 2), offset=11)  # base[1::2, 1:9:2]
    np.testing.assert_array_equal(v.numpy(s), base[1::2, 1:9:2])
    tv = t.as_strided((10, 6), (1, 10))
    np.testing.assert_array_equal(tv.numpy(), base.T)  # stream None: synchronizes the device


def test_tensor_strided_view_stays_inside_the_memory(s):
    # as torch's as_strided: a view reaching past the tensor's memory is refused, and a view of
    # a view is checked against the first tensor's memory, not the smaller view's reach
    t = srt.Tensor.from_numpy(np.arange(8, dtype=np.float32), stream=s)
    with pytest.raises(srt.InvalidValueError):
        t.as_strided((4,), (2,), offset=2)  # elements 2, 4, 6, 8: one past the end
    with pytest.raises(srt.InvalidValueError):
        t.as_strided((9,), (1,))
    last = t.as_strided((1,), (1,), offset=7)  # the last element: fits exactly
    head = t.as_strided((2,), (1,))
    tail = head.as_strided((4,), (2,), offset=1)  # elements 1, 3, 5, 7 of t
    np.testing.assert_array_equal(tail.numpy(s), [1, 3, 5, 7])
    np.testing.assert_array_equal(last.numpy(s), [7])
    with pytest.raises(srt.InvalidValueError):
        head.as_strided((2,), (1,), offset=7)
    t.free()


def test_tensor_empty_and_zero_size(s):
    t = srt.Tensor.empty((0, 3), np.float32, stream=s)
    assert t.numpy(s).shape == (0, 3)
    t.free()
    e = srt.Tensor.empty((4,), np.float64, stream=s)
    assert e.numpy(s).shape == (4,)


def test_tensor_memory_comes_from_the_pool(dev, s):
    pool = srt.MemPool(dev)
    try:
        t = srt.Tensor.empty((1024,), np.float32, stream=s, pool=pool)
        assert pool.used_mem_current >= 4096
        t.free()
        assert pool.used_mem_current == 0
    finally:
        s.synchronize()
        pool.destroy()


def test_tensor_free_is_final(s):
    t = srt.Tensor.from_numpy(np.ones(4, np.float32), stream=s)
    t.free()
    with pytest.raises(srt.InvalidHandleError):
        _ = t.ptr
    with pytest.raises(srt.InvalidHandleError):
        t.free()
    with pytest.raises(srt.InvalidHandleError):
        t.numpy(s)
    assert "freed" in repr(t)


def test_tensor_view_owns_nothing(s):
    t = srt.Tensor.from_numpy(np.ones((2, 2), np.float32), stream=s)
    v = t.as_strided((2,), (1,))
    with pytest.raises(srt.InvalidValueError):
        v.free()
    np.testing.assert_array_equal(t.numpy(s), np.ones((2, 2)))  # base still intact
    t.free()


def test_tensor_wraps_a_pool_pointer_and_infers_its_device(s):
    d1 = srt.Device("cpu:1")
    s1 = srt.Stream(d1, non_blocking=True)
    ptr = s1.malloc(64)
    t = srt.Tensor(srt.TensorDesc((16,), np.float32), ptr)
    assert t.device is d1
    # srt.malloc memory and interior pointers too (they were taken for the current device, so
    # an op on cpu:1 refused them, and one on cpu:0 read cpu:1 memory unordered)
    raw = srt.malloc(256, d1)
    for p in (raw, raw + 64, ptr + 32):
        assert srt.Tensor(srt.TensorDesc((4,), np.float32), p).device is d1
    from streamrt import ops

    srt.write(raw, np.arange(4, dtype=np.float32))
    x = srt.Tensor(srt.TensorDesc((4,), np.float32), raw)
    out = srt.Tensor(srt.TensorDesc((4,), np.float32), raw + 128)
    ops.run(ops.cumsum, x, out, stream=s1, sync=True)
    assert (srt.read(raw + 128, (4,), np.float32) == [0, 1, 3, 6]).all()
    srt.free(raw)
    t.free(s1)
    s1.synchronize()
    s1.destroy()


@pytest.mark.parametrize("desc, ptr, exc", [
    ("not a desc", 4096, srt.InvalidTypeError),
    (None, 1.5, srt.InvalidTypeError),
    (None, True, srt.InvalidTypeError),
    (None, 0, srt.InvalidValueError),
    (None, -8, srt.InvalidValueError),
])
def test_tensor_rejects_bad_construction(desc, ptr, exc):
    with pytest.raises(exc):
        srt.Tensor(srt.TensorDesc((2,), np.float32) if desc is None else desc, ptr)


def test_tensor_rejects_a_non_stream():
    with pytest.raises(srt.InvalidTypeError):
        srt.Tensor.empty((2,), np.float32, stream="s0")
