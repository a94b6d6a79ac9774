"""A Tensor is checked to fit its memory when it is made (issue 24 point 3): metadata reaching
past the allocation holding the pointer is refused there, not in a later synchronize."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt

F32 = np.float32


def test_tensor_larger_than_its_malloc_is_refused_when_made(dev):
    p = srt.malloc(64)
    try:
        with pytest.raises(srt.InvalidValueError) as ei:
            srt.Tensor(srt.TensorDesc((1000,), F32), p)
        assert "4000" in str(ei.value) and "64" in str(ei.value)
        with pytest.raises(srt.InvalidValueError):  # an interior pointer has what is left
            srt.Tensor(srt.TensorDesc((16,), F32), p + 4)
        with pytest.raises(srt.InvalidValueError):  # strides reach past it too
            srt.Tensor(srt.TensorDesc((2, 2), F32, (16, 1)), p)
        with pytest.raises(srt.InvalidValueError):  # the device given changes nothing
            srt.Tensor(srt.TensorDesc((17,), F32), p, device=dev)
        assert srt.Tensor(srt.TensorDesc((16,), F32), p).nbytes == 64  # exactly: fits
        assert srt.Tensor(srt.TensorDesc((15,), F32), p + 4).device is dev
        assert srt.Tensor(srt.TensorDesc((0,), F32), p + 64).numel == 0
    finally:
        srt.free(p)


def test_tensor_larger_than_its_pool_block_is_refused_when_made(dev):
    s = srt.Stream(dev, non_blocking=True)
    p = s.malloc(100)  # the block holds what was asked, whatever the pool rounded it to
    with pytest.raises(srt.InvalidValueError):
        srt.Tensor(srt.TensorDesc((26,), F32), p)
    with pytest.raises(srt.InvalidValueError):
        srt.Tensor(srt.TensorDesc((20,), F32), p + 24)
    t = srt.Tensor(srt.TensorDesc((25,), F32), p)
    assert srt.Tensor(srt.TensorDesc((19,), F32), p + 24).device is dev
    t.free(s)
    s.synchronize()


def test_tensor_of_foreign_memory_still_made(dev):
    # DLPack imports (memory mapped exactly as large as the producer's array) and as_strided
    # views keep working; an unknown pointer is not known to be short
    a = np.arange(12, dtype=F32)
    t = srt.from_dlpack(a)
    assert t.shape == (12,)
    v = t.as_strided((3,), (4,))
    assert v.numel == 3
    with pytest.raises(srt.InvalidValueError):
        srt.Tensor(srt.TensorDesc((13,), F32), t.ptr)
