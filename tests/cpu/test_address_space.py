"""The cpu backend's address space: addresses are reused once its window is used up."""

from __future__ import annotations

import numpy as np

import streamrt as srt


def test_device_addresses_are_reused_once_its_window_is_used_up(monkeypatch):
    # each pool reserves a whole device of addresses: a long-running process that made and
    # destroyed a few thousand pools ran past cpu:0's 256 TiB window into cpu:1's addresses
    from streamrt.backends import cpu

    start = 1 << 48  # cpu:0's window
    end = start + (1 << 48)  # and where cpu:1's begins
    monkeypatch.setitem(cpu.SPACE._next, 0, end - 4096)  # as if every address had been used
    n = 1 << 20
    ptrs = [srt.malloc(n, "cpu:0") for _ in range(3)]
    try:
        spans = sorted((p, p + n) for p in ptrs)
        assert all(start <= lo and hi <= end for lo, hi in spans)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
        for i, p in enumerate(ptrs):  # each is usable, and none overlaps another allocation
            srt.memset(p, i + 1, n)
        assert [int(srt.read(p, (n,), np.uint8).min()) for p in ptrs] == [1, 2, 3]
        assert {srt.pool.device_of(p) for p in ptrs} == {srt.Device("cpu:0")}
    finally:
        for p in ptrs:
            srt.free(p)
