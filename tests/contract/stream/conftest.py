"""The stream contract on every backend (launch, copies, ordering, lifecycle, failures).

Each test here gets ``dev``, device 0 of each backend, and ``s``, a non-blocking stream on it
that is synchronized after the test (unless destroyed)."""

from __future__ import annotations

import pytest

import streamrt as srt


@pytest.fixture
def dev(any_dev):
    """Each backend's device 0: streams are a contract of every backend."""
    return any_dev


@pytest.fixture
def s(dev):
    st = srt.Stream(dev, non_blocking=True)
    yield st
    if not st._destroyed:
        st.synchronize()
