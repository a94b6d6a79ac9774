"""The cpu backend's delay injection (``set_delay_us``): its argument is checked."""

from __future__ import annotations

import pytest

import streamrt as srt


def test_errors_negative_delay_injection_is_refused():
    # a negative delay killed every cpu worker (time.sleep raised), and synchronize then hung
    from streamrt.backends import cpu

    before = cpu.delay_us()
    with pytest.raises(srt.InvalidValueError):
        cpu.set_delay_us(-5)
    with pytest.raises(srt.InvalidTypeError):
        cpu.set_delay_us(1.5)
    assert cpu.delay_us() == before
    s = srt.Stream(non_blocking=True)
    p = srt.malloc(64)
    s.memset(p, 1, 64)
    s.synchronize()
    srt.free(p)
