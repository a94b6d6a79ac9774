"""Where no cuda device can be used, the cuda backend says so clearly."""

from __future__ import annotations

import pytest

import streamrt as srt
from tests.conftest import cuda_reason


def test_cuda_unavailable_is_reported_clearly():
    reason = cuda_reason()
    if reason is None:
        pytest.skip("a CUDA device is usable here")
    assert srt.device_count("cuda") == 0
    with pytest.raises(srt.BackendUnavailableError) as info:
        srt.Device("cuda:0")
    assert "cuda" in str(info.value).lower()
