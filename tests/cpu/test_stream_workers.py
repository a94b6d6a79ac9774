"""The cpu backend's stream workers over a long run and at process exit: a stream gone for good is
collected and its worker thread ends, destroyed streams do not pile up, no deadlock in its queue lock."""

from __future__ import annotations

import gc
import weakref

import numpy as np

import streamrt as srt
from tests.conftest import _run, no_sanitizer


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
