"""Streams: construction, destroy, the legacy default stream, the current stream and its device."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt
from tests.contract.backend_kernels import _dev_f32, add_one


def test_stream_destroy_completes_pending_work(dev, gate):
    s = srt.Stream(dev, non_blocking=True)
    done = threading.Event()
    g = gate(s)
    s.launch_host_func(done.set)
    s.destroy()
    with pytest.raises(srt.InvalidHandleError):
        s.launch_host_func(done.set)
    with pytest.raises(srt.InvalidHandleError):
        s.destroy()
    with pytest.raises(srt.InvalidHandleError):
        s.synchronize()
    g.open()
    dev.synchronize()  # the device still waits for the destroyed stream's work
    assert done.is_set()


def test_stream_legacy_default_stream_cannot_be_destroyed(dev):
    with pytest.raises(srt.InvalidHandleError):
        dev.default_stream.destroy()


def test_stream_current_stream_context(dev):
    s1 = srt.Stream(dev)
    assert srt.current_stream() is srt.current_device().default_stream
    with s1:
        assert srt.current_stream() is s1
        p = srt.malloc(16)
        srt.memset(p, 3, 16)  # the synchronous helpers use the current stream
        assert s1._pos > 0
    assert srt.current_stream() is srt.current_device().default_stream
    srt.free(p)


def test_stream_context_is_per_device_and_makes_its_device_current():
    # as torch.cuda.stream: entering a stream of another device switched neither the current
    # device (srt.malloc went to the old one) nor, inside `with other_device:`, the stream
    d0, d1 = srt.Device("cpu:0"), srt.Device("cpu:1")
    with d0:
        s1 = srt.Stream(d1, non_blocking=True)
        with s1:
            assert srt.current_device() is d1 and srt.current_stream() is s1
            p = srt.malloc(16)
            assert srt.pool.device_of(p) is d1
            with d0:  # another device: its own current stream
                assert srt.current_stream() is d0.default_stream
                s0 = srt.Stream(d0, non_blocking=True)
                with s0, d1:  # and back: s1 is still d1's current stream
                    assert srt.current_stream() is s1
                assert srt.current_stream() is d0.default_stream
            assert srt.current_stream() is s1
        assert srt.current_device() is d0 and srt.current_stream() is d0.default_stream
        srt.free(p)


def test_stream_constructor_validation(dev):
    with pytest.raises(srt.InvalidTypeError):
        srt.Stream(dev, priority="high")
    with pytest.raises(srt.InvalidTypeError):
        srt.Stream(dev, non_blocking=1)
    assert srt.Stream(dev, priority=-100).priority == -5  # clamped, as CUDA does
    assert srt.Stream(dev, priority=7).priority == 0


def test_backend_stream_priorities_and_destroy(bdev):
    s = srt.Stream(bdev, priority=-1, non_blocking=True)
    p = _dev_f32(bdev, np.zeros(256))
    s.launch(add_one, p, 256, grid=1, block=256)
    s.destroy()  # pending work still completes
    bdev.synchronize()
    assert np.array_equal(srt.read(p, (256,), np.float32), np.ones(256, np.float32))
    srt.free(p)
    with pytest.raises(srt.InvalidHandleError):
        s.launch(add_one, p, 256)
