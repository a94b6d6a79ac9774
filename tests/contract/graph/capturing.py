"""Helpers of the capture tests: a no-op, and checks that streams left capture or were invalidated."""

from __future__ import annotations

import pytest

import streamrt as srt


def noop():
    pass


def assert_left_capture(*streams):
    for st in streams:
        assert not st.is_capturing()
        info = st.capture_info()
        assert info.status is srt.CaptureStatus.NONE and info.graph is None


def assert_invalidated_then_ended(origin, *joined):
    """end_capture of an invalidated capture raises 901, returns no graph, and all streams leave."""
    for st in (origin, *joined):
        assert st.capture_info().status is srt.CaptureStatus.INVALIDATED
        assert st.is_capturing()  # until end_capture, as CUDA's status and PyTorch's test
    with pytest.raises(srt.CaptureInvalidatedError) as ei:
        origin.end_capture()
    assert ei.value.code == 901
    assert_left_capture(origin, *joined)
