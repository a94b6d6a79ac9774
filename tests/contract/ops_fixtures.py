"""The stream fixture ``s`` and helpers the operator and tensor contract tests share (they
import ``ops_stream``, the fixture's function); a module, not conftest, so that the other
contract tests keep the root conftest's ``s``."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from streamrt import ops

F32 = np.float32


@pytest.fixture(name="s")
def ops_stream(dev):
    """A non-blocking stream on the test's device, synchronized and destroyed afterwards."""
    st = srt.Stream(dev, non_blocking=True)
    yield st
    st.synchronize()
    st.destroy()


def live() -> int:
    """Executors created and not yet released."""
    return ops.stats()["live_executors"]


def T(s, a):
    """A float32 tensor of ``a`` on ``s``."""
    return srt.Tensor.from_numpy(np.asarray(a, F32), stream=s)
