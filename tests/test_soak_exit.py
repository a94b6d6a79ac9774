"""Long-running programs and process exit: what a stream leaves behind once it is gone, and
how a program ends with work, traces or failures still pending (cpu backend)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import weakref

import numpy as np

import streamrt as srt

from .conftest import no_sanitizer


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=20, env=dict(os.environ, **env))


@srt.kernel
def _touch(ctx, ptr):
    ctx.array(ptr, (4,), np.float32)[:] += 1


def test_stream_dropped_after_a_launch_is_collected_and_its_worker_ends():
    # before: the idle worker kept the last operation's arguments (the kernel context, which
    # names the stream) in its frame: the stream was never collected, its thread never ended
    no_sanitizer("its access history keeps the operations, and they name their stream")
    dev = srt.Device("cpu:0")
    ptr = srt.malloc(64)
    s = srt.Stream(dev, non_blocking=True)
    s.launch(_touch, ptr, grid=2)
    s.synchronize()
    ref, worker = weakref.ref(s), s._q._thread
    del s
    for _ in range(500):  # until the worker has gone idle (no time asserted)
        gc.collect()
        if ref() is None:
            break
        worker.join(0.01)
    assert ref() is None
    worker.join(10)
    assert not worker.is_alive()
    srt.free(ptr)


def test_destroyed_streams_do_not_pile_up_without_a_device_synchronize():
    # before: every destroyed stream's queue stayed in the device's retired list until a
    # device synchronize, which a service synchronizing only its streams never makes
    dev = srt.Device("cpu:1")
    ptr = srt.malloc(64, dev)
    for _ in range(40):
        s = srt.Stream(dev, non_blocking=True)
        s.memset(ptr, 0, 64)
        s.synchronize()
        s.destroy()
        s._q._thread.join(10)
    assert len(dev._retired) <= 2
    srt.free(ptr)


def test_stream_collected_on_a_thread_inside_its_queue_lock_does_not_deadlock():
    # the collector runs a stream's finalizer (which closes its queue) on whatever thread
    # allocates, maybe one inside that queue's lock (a worker waking waiters, a wait of another
    # stream): before, close() took the lock again and that thread hung for good
    r = _run("""
        import gc, streamrt as srt
        s = srt.Stream(non_blocking=True)
        q = s._q
        s._ctx1.stream = s  # a cycle: only the collector frees it
        with q._progress:
            del s
            gc.collect()
        q._thread.join(10)
        print("alive" if q._thread.is_alive() else "ended")
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ended"


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
