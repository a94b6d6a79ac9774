"""API.md §8: traces (file format, environment switch)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import streamrt as srt

from .conftest import _events, fill, scale, sync, two_streams

pytestmark = [pytest.mark.api, pytest.mark.timeout(120)]


N = 256


def test_trace_file_format(tmp_path, dev):
    path = tmp_path / "t.json"
    with srt.trace(str(path)):
        a, b = two_streams()
        pool = srt.MemPool()
        p = a.malloc(N * 4, pool)
        a.launch(fill, p, N, 1.0)
        b.wait(a.record())
        b.launch(scale, p, N, 2.0)
        b.memset(p, 0, 64)
        b.free(p)
        sync(b)
        sync(a)
    ev = _events(path)
    names = {e.get("name") for e in ev if e.get("ph") in ("X", "B")}
    assert "fill" in names and "scale" in names
    assert any(e.get("ph") in ("s", "f", "t") for e in ev), "flow arrows for event waits"
    assert any(e.get("ph") == "C" for e in ev), "pool counters"
    tracks = {(e.get("pid"), e.get("tid")) for e in ev if e.get("ph") == "X"}
    assert len(tracks) >= 2, "one track per stream"
    assert any(e.get("ph") == "M" for e in ev)


def test_trace_env(tmp_path):
    path = tmp_path / "e.json"
    code = ("import streamrt as srt, numpy as np\nfrom tests.api.conftest import fill\n"
            "s=srt.Stream(); p=srt.malloc(1024); s.launch(fill,p,256,1.0); s.synchronize(); srt.free(p)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, STREAMRT_TRACE=str(path)), cwd=os.getcwd())
    assert r.returncode == 0, r.stderr
    assert any(e.get("name") == "fill" for e in _events(path))
