"""API.md §7-8: sanitizer, trace, command line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import streamrt as srt

from .conftest import call_with_timeout, fill, scale, sync, two_streams

pytestmark = pytest.mark.timeout(120)
N = 256
CLI = [sys.executable, "-m", "streamrt.cli"]


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
            "from tests.blackbox.conftest import scale\n"
            "a=srt.Stream(non_blocking=True); b=srt.Stream(non_blocking=True); p=srt.malloc(1024)\n"
            "a.launch(scale,p,256,2.0); b.launch(scale,p,256,3.0)\n"
            "try:\n    srt.Device().synchronize()\n"
            "except srt.SanitizerError as e:\n    print('found', e.kind)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, STREAMRT_SANITIZE="1"), cwd=os.getcwd())
    assert "found" in r.stdout, r.stderr


def _events(path):
    data = json.loads(Path(path).read_text())
    return data["traceEvents"] if isinstance(data, dict) else data


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
    code = ("import streamrt as srt, numpy as np\nfrom tests.blackbox.conftest import fill\n"
            "s=srt.Stream(); p=srt.malloc(1024); s.launch(fill,p,256,1.0); s.synchronize(); srt.free(p)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, STREAMRT_TRACE=str(path)), cwd=os.getcwd())
    assert r.returncode == 0, r.stderr
    assert any(e.get("name") == "fill" for e in _events(path))


def _cli(*args, timeout=240):
    exe = os.path.join(os.path.dirname(sys.executable), "streamrt")
    cmd = [exe, *args] if os.path.exists(exe) else [sys.executable, "-m", "streamrt", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_cli_help():
    r = _cli("--help")
    assert r.returncode == 0
    for w in ("demo", "bench", "info"):
        assert w in r.stdout


def test_cli_demo_help_flags():
    r = _cli("demo", "--help")
    assert r.returncode == 0
    for w in ("--device", "--only", "--trace"):
        assert w in r.stdout
    r = _cli("bench", "--help")
    assert r.returncode == 0
    for w in ("--quick", "--json", "--markdown"):
        assert w in r.stdout


def test_cli_info():
    r = _cli("info")
    assert r.returncode == 0 and "cpu" in r.stdout


@pytest.mark.parametrize("only", ["streams", "pools", "ops", "graphs"])
def test_cli_demo_only(only):
    r = _cli("demo", "--only", only, "--device", "cpu:0")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.strip()


def test_cli_demo_trace(tmp_path):
    path = tmp_path / "d.json"
    r = _cli("demo", "--only", "streams", "--trace", str(path))
    assert r.returncode == 0, r.stderr
    assert len(_events(path)) > 0


def test_cli_bad_usage():
    assert _cli("nonsense").returncode != 0
    assert _cli("demo", "--only", "nope").returncode != 0
    assert _cli("demo", "--device", "cuda:99").returncode != 0


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
