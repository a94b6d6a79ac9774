"""DLPack and numpy interop on the cpu backend (API.md §9.2): zero-copy both ways, the array
API's stream handshake, refusals as BufferError, pinned host views, copies of DLPack objects."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import streamrt as srt


@srt.kernel
def _double(ctx, p, n):
    v = ctx.array(p, (n,), np.float64)
    v *= 2


def test_numpy_from_dlpack_is_zero_copy_both_ways():
    t = srt.Tensor.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    a = np.from_dlpack(t)
    assert a.shape == (2, 3) and a.dtype == np.float32
    a[1, 2] = 42.0  # a write through numpy is the tensor's memory
    assert t.numpy()[1, 2] == 42.0
    s = srt.Stream()
    s.memset(t.ptr, 0, 4)  # and a write of the device is numpy's
    s.synchronize()
    assert a[0, 0] == 0.0


def test_export_waits_for_pending_writers():
    x = np.zeros(1 << 16)
    t = srt.from_dlpack(x)
    s = srt.Stream(non_blocking=True)
    s.memset(t.ptr, 0xFF, t.nbytes)  # pending (or done): the export must see its bytes
    a = np.from_dlpack(t)
    assert (a.view(np.uint8) == 0xFF).all()


def test_versioned_capsule_and_device():
    t = srt.Tensor.from_numpy(np.ones(3))
    assert t.__dlpack_device__() == (1, 0)
    cap = t.__dlpack__(max_version=(1, 0))
    assert "dltensor_versioned" in repr(cap)
    assert "dltensor" in repr(t.__dlpack__())


def test_stream_handshake_and_refusals():
    t = srt.Tensor.from_numpy(np.ones(3))
    with pytest.raises(srt.InvalidValueError):
        t.__dlpack__(stream=1)  # kDLCPU takes stream=None only
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(2, 0))
    with pytest.raises(srt.InvalidTypeError):
        srt.from_dlpack(object())


def test_from_dlpack_shares_memory_with_kernels():
    x = np.arange(10, dtype=np.float64)
    tx = srt.from_dlpack(x)
    assert tx.shape == (10,) and tx.device.backend == "cpu"
    s = srt.Stream()
    s.launch(_double, tx.ptr, 10)
    s.synchronize()
    np.testing.assert_array_equal(x, np.arange(10) * 2.0)
    with pytest.raises(srt.InvalidValueError):
        tx.free()  # the producer's memory


def test_from_dlpack_strides_and_copies():
    x = np.arange(10, dtype=np.float64)
    ty = srt.from_dlpack(x[::2])
    assert ty.strides == (2,)
    np.testing.assert_array_equal(ty.numpy(), x[::2])
    tz = srt.from_dlpack(x[::-1])  # negative strides: copied
    np.testing.assert_array_equal(tz.numpy(), x[::-1])
    with pytest.raises(BufferError):
        srt.from_dlpack(x[::-1], copy=False)


def test_import_keeps_producer_alive():
    x = np.arange(4, dtype=np.float64)
    t = srt.from_dlpack(x)
    del x
    gc.collect()
    np.testing.assert_array_equal(t.numpy(), np.arange(4.0))


def test_mapping_goes_with_the_tensor():
    t = srt.from_dlpack(np.zeros(4))
    ptr = t.ptr
    del t
    gc.collect()
    with pytest.raises(srt.InvalidAddressError):
        srt.memset(ptr, 0, 8)


def test_asarray_is_the_data_never_an_object_array():
    t = srt.Tensor.from_numpy(np.arange(4, dtype=np.int32))
    a = np.asarray(t)
    assert a.dtype == np.int32 and a.shape == (4,)
    np.testing.assert_array_equal(a, np.arange(4))
    assert np.asarray(t, dtype=np.float64).dtype == np.float64


def test_host_array_views_pinned_memory():
    h = srt.malloc_host(64)
    try:
        v = srt.host_array(h, (8,), np.float64)
        v[:] = 3.0
        out = np.zeros(8)
        srt.memcpy(out, h, 64)
        np.testing.assert_array_equal(out, 3.0)
        with pytest.raises(srt.InvalidAddressError):
            srt.host_array(srt.malloc(64), (8,), np.float64)
    finally:
        srt.free_host(h)


class _Producer:
    """A DLPack producer of host memory without the buffer protocol (as a PyTorch CPU tensor)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_copies_accept_dlpack_producers():
    src = _Producer(np.arange(4, dtype=np.float32))
    d = srt.malloc(16)
    srt.memcpy(d, src, 16)
    out = _Producer(np.zeros(4, dtype=np.float32))
    srt.memcpy(out, d, 16)
    np.testing.assert_array_equal(out.a, np.arange(4))
    np.testing.assert_array_equal(srt.from_dlpack(src).numpy(), np.arange(4))


def test_torch_round_trip():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (optional interop test)")
    tt = torch.arange(6, dtype=torch.float64)
    t = srt.from_dlpack(tt)
    s = srt.Stream()
    s.launch(_double, t.ptr, 6)  # a stream-ordered kernel writing the torch tensor's memory
    s.synchronize()
    assert tt.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    back = torch.from_dlpack(srt.Tensor.from_numpy(np.ones(3)))
    assert back.tolist() == [1.0, 1.0, 1.0]


def test_cuda_protocols_absent_on_cpu():
    t = srt.Tensor.from_numpy(np.ones(2), stream=srt.Device("cpu:0").default_stream)
    assert not hasattr(t, "__cuda_array_interface__")  # CuPy and numba test with hasattr
    assert not hasattr(srt.Stream("cpu:0"), "__cuda_stream__")
    with pytest.raises(srt.NotSupportedError):
        srt.Stream.from_external(0x1000, device="cpu:0")  # a CUDA stream is a cuda device's
    for bad in ("7", 1.5, True, None):
        with pytest.raises(srt.InvalidTypeError):
            srt.Stream.from_external(bad)
    with pytest.raises(srt.InvalidValueError):
        srt.Stream.from_external(-1)


def test_device_reset_unmaps_a_live_import_and_its_tensor_dies_quietly():
    """cudaDeviceReset with a from_dlpack import alive: the mapping goes (the producer's memory
    is not freed: numpy still owns it), the reset succeeds, and the Tensor's later release
    finds nothing to unmap."""
    import gc

    dev = srt.Device("cpu:0")
    a = np.arange(4.0)
    t = srt.from_dlpack(a)
    ptr = t.ptr
    dev.reset()
    assert srt.backends.cpu.SPACE.get(ptr) is None
    del t
    gc.collect()
    a += 1  # the producer's memory is untouched and still numpy's
    assert a.tolist() == [1.0, 2.0, 3.0, 4.0]
    t2 = srt.from_dlpack(a)  # the device is usable again
    assert np.from_dlpack(t2).tolist() == [1.0, 2.0, 3.0, 4.0]
