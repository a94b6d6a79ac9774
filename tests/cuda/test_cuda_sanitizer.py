"""The sanitizer refuses cuda streams, clearly, and leaves them intact (it checks the cpu backend only)."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from tests.conftest import backend_device, cuda_reason


@pytest.mark.cuda
def test_sanitizer_refuses_cuda_streams_and_leaves_them_intact(san):
    # it sees kernel accesses as the views the cpu backend makes: on cuda it would see nothing
    dev = backend_device("cuda")
    s = srt.Stream(dev, non_blocking=True)
    p = srt.malloc(64, dev)
    pos = s._pos
    with pytest.raises(srt.NotSupportedError, match="sanitizer"):
        s.memset(p, 0, 64)
    assert s._pos == pos  # nothing half-enqueued
    san.disable()
    s.memset(p, 1, 64)
    s.synchronize()
    assert (srt.read(p, (64,), np.uint8) == 1).all()
    srt.free(p)


@pytest.mark.cuda
def test_cuda_sanitizer_refuses_cuda_streams_clearly():
    reason = cuda_reason()
    if reason is not None:
        pytest.skip(f"no usable CUDA device here: {reason}")
    s = srt.Stream(srt.Device("cuda:0"), non_blocking=True)
    srt.sanitizer.enable()
    try:
        with pytest.raises(srt.NotSupportedError, match="sanitizer"):
            s.launch_host_func(lambda: None)
    finally:
        srt.sanitizer.disable()
    s.launch_host_func(lambda: None)  # and nothing was left half-enqueued
    s.synchronize()
