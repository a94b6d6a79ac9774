"""API.md §7: the sanitizer (races, use after free, bounds, invalid pointers, modes, environment)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import streamrt as srt

from .conftest import call_with_timeout, fill, scale, two_streams

pytestmark = [pytest.mark.api, pytest.mark.timeout(120)]


N = 256


def _kind(e):
    return str(e.kind).lower().replace("_", "-")


def _race(mode=None, kernel=fill, values=(1.0, 2.0)):
    """Sanitizer on (in its default mode when mode is None); streams a and b each launch kernel on
    one buffer with no ordering between them (no b.wait(a.record())); returns (a, b, buffer)."""
    if mode is None:
        srt.sanitizer.enable()
    else:
        srt.sanitizer.enable(mode=mode)
    a, b = two_streams()
    p = srt.malloc(N * 4)
    a.launch(kernel, p, N, values[0])
    b.launch(kernel, p, N, values[1])
    return a, b, p


def test_sanitizer_race_raises_at_sync(dev):
    a, b, p = _race(kernel=scale, values=(2.0, 3.0))
    with pytest.raises(srt.SanitizerError) as ei:
        call_with_timeout(dev.synchronize)
    e = ei.value
    assert "race" in _kind(e)
    assert p <= e.ptr < p + N * 4
    assert len(e.streams) == 2 and set(e.streams) == {a, b} or len(e.streams) == 2
    assert isinstance(e, srt.StreamRTError)
    srt.sanitizer.disable()
    srt.free(p)


def test_sanitizer_correct_program_no_finding(dev):
    srt.sanitizer.enable()
    a, b = two_streams()
    p = a.malloc(N * 4)
    a.launch(fill, p, N, 1.0)
    b.wait(a.record())
    b.launch(scale, p, N, 3.0)
    out = np.zeros(N, np.float32)
    b.memcpy(out, p, N * 4)
    b.free(p)
    call_with_timeout(dev.synchronize)
    assert (out == 3).all()
    srt.sanitizer.disable()


def test_sanitizer_collect_mode(dev):
    _, _, p = _race(mode="collect")
    call_with_timeout(dev.synchronize)   # collects, does not raise
    rep = srt.sanitizer.report()
    assert len(rep) >= 1
    assert any("race" in str(getattr(f, "kind", f)).lower() for f in rep)
    srt.sanitizer.disable()
    srt.free(p)


def test_sanitizer_use_after_free(dev):
    srt.sanitizer.enable(mode="collect")
    s = srt.Stream(non_blocking=True)
    p = s.malloc(N * 4)
    s.free(p)
    s.launch(fill, p, N, 1.0)
    call_with_timeout(s.synchronize)
    kinds = [str(getattr(f, "kind", f)).lower().replace("_", "-") for f in srt.sanitizer.report()]
    assert any("free" in k for k in kinds), kinds
    srt.sanitizer.disable()


def test_sanitizer_out_of_bounds_stopped_before_write(dev):
    srt.sanitizer.enable()
    s = srt.Stream(non_blocking=True)
    p = srt.malloc(4096)
    q = srt.malloc(4096)
    srt.memset(q, 0, 4096)
    srt.memset(p, 0, 4096)
    s.launch(fill, p, 4096, 1.0)    # 16 KiB view of a 4 KiB allocation
    with pytest.raises((srt.SanitizerError, srt.LaunchError)) as ei:
        call_with_timeout(s.synchronize)
    if isinstance(ei.value, srt.SanitizerError):
        assert "bound" in _kind(ei.value)
    srt.sanitizer.disable()
    assert (srt.read(p, (4096,), np.uint8) == 0).all()
    srt.free(p)
    srt.free(q)


def test_sanitizer_invalid_pointer(dev):
    srt.sanitizer.enable(mode="collect")
    s = srt.Stream(non_blocking=True)
    s.launch(fill, 0x5000_0000_0000, 4, 1.0)
    try:
        call_with_timeout(s.synchronize)
    except srt.LaunchError:
        pass
    rep = srt.sanitizer.report()
    srt.sanitizer.disable()
    assert len(rep) >= 1


def test_sanitizer_env():
    code = ("import numpy as np, streamrt as srt\n"
            "from tests.api.conftest import scale\n"
            "a=srt.Stream(non_blocking=True); b=srt.Stream(non_blocking=True); p=srt.malloc(1024)\n"
            "a.launch(scale,p,256,2.0); b.launch(scale,p,256,3.0)\n"
            "try:\n    srt.Device().synchronize()\n"
            "except srt.SanitizerError as e:\n    print('found', e.kind)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, STREAMRT_SANITIZE="1"), cwd=os.getcwd())
    assert "found" in r.stdout, r.stderr


def test_sanitizer_collected_findings_not_raised_later(dev):
    # a finding collected (and reported) in collect mode must not surface as an unrelated
    # SanitizerError at a later synchronize once raise mode is turned on
    _, _, p = _race(mode="collect")
    call_with_timeout(dev.synchronize)
    assert srt.sanitizer.report()
    srt.sanitizer.disable()
    srt.sanitizer.enable()
    s = srt.Stream(non_blocking=True)
    s.launch(fill, p, N, 3.0)
    call_with_timeout(s.synchronize)      # correct program: no finding
    srt.sanitizer.disable()
    srt.free(p)
