"""Fixtures of the cuda tests: cuda:0 and cuda:1, skipping (saying why) where they cannot be used."""

from __future__ import annotations

import pytest

import streamrt as srt
from tests.conftest import cuda_reason


@pytest.fixture
def cuda0():
    reason = cuda_reason()
    if reason is not None:
        pytest.skip(f"no usable CUDA device here: {reason}")
    d = srt.Device("cuda:0")
    yield d
    d.synchronize()


@pytest.fixture
def cuda1(cuda0):
    if srt.device_count("cuda") < 2:
        pytest.skip("needs two CUDA devices")
    d = srt.Device("cuda:1")
    yield d
    d.synchronize()
