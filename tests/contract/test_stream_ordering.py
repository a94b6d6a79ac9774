"""Stream order on every backend: streams, events, the legacy default stream, host functions."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from tests.conftest import (
    add_one_kernel,
    copy_kernel,
    delayed,
    fill_kernel,
)


@pytest.fixture
def dev(any_dev):
    """Each backend's device 0."""
    return any_dev


def test_ordering_producer_consumer_chain_with_delays(dev):
    # three streams pass a buffer along; with random delays, a missing wait corrupts the result
    n = 256
    streams = [srt.Stream(dev, non_blocking=True) for _ in range(3)]
    bufs = [srt.malloc(n * 4) for _ in range(3)]
    with delayed(300):
        streams[0].launch(fill_kernel, bufs[0], n, 1.0)
        for step in range(12):
            src, dst = step % 3, (step + 1) % 3
            e = streams[src].record()
            streams[dst].wait(e)
            streams[dst].launch(copy_kernel, bufs[dst], bufs[src], n)
            streams[dst].launch(add_one_kernel, bufs[dst], n)
        last = streams[12 % 3]
        out = np.empty(n, np.float32)
        last.memcpy(out, bufs[12 % 3], n * 4)
    assert out.tolist() == [13.0] * n
    dev.synchronize()
    for b in bufs:
        srt.free(b)
