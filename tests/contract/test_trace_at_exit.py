"""How a program ends with a trace still pending: it is written at exit, without waiting for blocked work
(cpu backend, in a subprocess)."""

from __future__ import annotations

import json

from tests.conftest import _run


def test_trace_never_exited_is_written_at_exit(tmp_path):
    # before: the file was created empty and never written
    path = tmp_path / "t.json"
    r = _run(f"""
        import streamrt as srt
        srt.trace({str(path)!r}).__enter__()
        s = srt.Stream()
        p = s.malloc(1000); s.memset(p, 0, 1000); s.free(p); s.synchronize()
    """)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert any(e.get("ph") == "X" for e in json.loads(path.read_text())["traceEvents"])


def test_env_trace_exit_does_not_wait_for_blocked_work(tmp_path):
    # before: the exit hook drained every stream, and a host function waiting on an event that
    # is never set hung the process (CUDA's exit does not wait for streams); work that ends
    # soon is still traced
    path = tmp_path / "t.json"
    r = _run("""
        import threading, streamrt as srt
        s = srt.Stream(non_blocking=True)
        s.launch_host_func(threading.Event().wait)
        s.memset(srt.malloc(64), 0, 64)
        srt.Stream(non_blocking=True).launch_host_func(print, "end")
    """, STREAMRT_TRACE=str(path))
    assert r.returncode == 0 and r.stdout.strip() == "end", r.stderr
    assert "Exception ignored" not in r.stderr and "Traceback" not in r.stderr
    names = [e["name"] for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    assert any("print" in n for n in names)  # queued at exit, run then, and traced
