"""Switching the sanitizer: enabled mid-program, turned back on, raise mode, validation, the environment
switch, and the name of a failing operation."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt
from tests.contract.sanitizer_helpers import kinds, streams, write_k


@pytest.fixture
def san_off():
    """The sanitizer off and its findings cleared, for a test that turns it on mid-program (the
    conftest puts it back as the run had it)."""
    srt.sanitizer.disable()
    srt.sanitizer.clear()
    yield srt.sanitizer
    srt.sanitizer.disable()
    srt.sanitizer.clear()


def test_sanitizer_enabled_mid_program_knows_the_live_allocations(dev, san_off):
    # pool memory allocated before enable() was "pool memory that no allocation ever covered"
    # (a false invalid-address); and after an off/on cycle, operations enqueued while it was on
    # whose end it never saw stopped it forgetting any access for the rest of the process
    import streamrt.sanitizer as sanitizer

    a, b = streams(dev)
    p = a.malloc(1024)
    q = srt.malloc(256)
    a.launch(write_k, p, 256, 1.0)
    dev.synchronize()
    srt.sanitizer.enable("collect")
    a.launch(write_k, p, 256, 2.0)
    a.launch(write_k, q, 64, 2.0)
    b.launch(write_k, p, 256, 3.0)  # BUG: unordered with a's write: still found
    dev.synchronize()
    assert kinds(srt.sanitizer.report()) == ["race"]  # and no invalid address
    a.launch(write_k, p, 256, 4.0)  # enqueued while on, run after the sanitizer is off
    srt.sanitizer.disable()
    dev.synchronize()
    srt.sanitizer.enable("collect")
    assert sanitizer._SAN._oldest_inflight() == 1 << 62  # nothing left in flight
    a.free(p)
    srt.free(q)
    dev.synchronize()


def test_sanitizer_turned_back_on_does_not_judge_work_enqueued_before(dev, san_off):
    # an operation enqueued in an earlier on period that runs after enable() was checked
    # against the new history, where its memory was allocated after it: a false use-before-alloc
    (a,) = streams(dev, 1)
    p = a.malloc(1024)
    dev.synchronize()
    srt.sanitizer.enable("collect")
    gate = threading.Event()
    a.launch_host_func(gate.wait)
    a.launch(write_k, p, 256, 4.0)  # enqueued while on, runs once on again
    srt.sanitizer.disable()
    srt.sanitizer.enable("collect")
    gate.set()
    a.launch(write_k, p, 256, 5.0)  # checked: ordered after the allocation
    dev.synchronize()
    assert kinds(srt.sanitizer.report()) == []
    assert srt.read(p, (1,), np.float32)[0] == 5.0
    a.free(p)
    dev.synchronize()


def test_sanitizer_raise_mode_raises_at_synchronize(dev, san):
    srt.sanitizer.enable("raise")
    a, b = streams(dev)
    p = srt.malloc(1024)
    a.launch(write_k, p, 256, 1.0)
    b.launch(write_k, p, 256, 2.0)
    with pytest.raises(srt.SanitizerError) as info:
        dev.synchronize()
    assert info.value.kind == "race" and info.value.ptr == p
    assert isinstance(info.value.finding, srt.sanitizer.Finding)
    assert len(info.value.streams) == 2 and info.value.op is not None and info.value.other
    assert {info.value.op.stream, info.value.other.stream} == {a, b}
    dev.synchronize()  # raised once
    srt.free(p)


def test_sanitizer_keeps_the_name_of_a_failing_operation(dev, san):
    # the sanitizer wraps each operation; a failure still names the function that raised
    s, = streams(dev, 1)

    def failing_host_fn():
        raise KeyError("x")

    s.launch_host_func(failing_host_fn)
    with pytest.raises(srt.LaunchError, match="failing_host_fn"):
        s.synchronize()


def test_sanitizer_enable_validation():
    with pytest.raises(srt.InvalidValueError):
        srt.sanitizer.enable("loud")


def test_sanitizer_env_switch():
    import os
    import subprocess
    import sys

    code = (
        "import numpy as np, streamrt as srt\n"
        "@srt.kernel\ndef w(ctx, p):\n    ctx.array(p, (4,), np.float32)[:] = 1\n"
        "a = srt.Stream(non_blocking=True); b = srt.Stream(non_blocking=True)\n"
        "p = srt.malloc(16); a.launch(w, p); b.launch(w, p)\n"
        "try:\n    srt.Device().synchronize()\nexcept srt.SanitizerError as e:\n    print(e.kind)\n"
    )
    env = dict(os.environ, STREAMRT_SANITIZE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "race"
