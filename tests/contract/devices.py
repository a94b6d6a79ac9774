"""Helpers of the device tests: a kernel that fails, and a failure held pending behind a gate."""

from __future__ import annotations

import streamrt as srt


def _held_failure(gate):
    """A stream of cpu:1 held by a gate, with a failing kernel and then a host function queued
    behind it; returns (device, stream, gate, what the host function saw)."""
    d = srt.Device("cpu:1")
    s = srt.Stream(d, non_blocking=True)
    seen: list = []
    g = gate(s)
    s.launch(boom_kernel)
    s.launch_host_func(seen.append, 1)
    return d, s, g, seen


@srt.kernel
def boom_kernel(ctx):
    raise RuntimeError("boom")
