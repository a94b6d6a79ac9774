"""Chrome/Perfetto traces: well-formed JSON, one track per stream, nesting, flows, counters."""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict

import numpy as np
import pytest

import streamrt as srt
from tests.conftest import add_one_kernel, fill_kernel, no_sanitizer


def load(path):
    data = json.loads(path.read_text())
    assert isinstance(data["traceEvents"], list)
    return data["traceEvents"]


def assert_tracks_well_formed(events):
    """Every pid and tid is an int, every (pid, tid) that carries an event is named by metadata,
    and the slices of a stream, in stream order (``args.position``), start in that order and do
    not overlap."""
    procs = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]) for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    for e in events:
        # integer ids: Perfetto gives a string tid a track but never shows its thread_name
        assert type(e["pid"]) is int and type(e.get("tid", 0)) is int, e
        if e["ph"] != "M":
            assert e["pid"] in procs, e
        if e["ph"] in "Xsfi":
            assert (e["pid"], e["tid"]) in threads, e
    by_stream = defaultdict(list)
    for e in events:
        if e["ph"] == "X" and isinstance(e["args"]["position"], int):  # not a graph node
            by_stream[(e["pid"], e["tid"])].append(e)
    for evs in by_stream.values():
        evs.sort(key=lambda e: e["args"]["position"])
        for prev, nxt in zip(evs, evs[1:]):
            assert prev["ts"] + prev["dur"] <= nxt["ts"] + 1e-3, (prev, nxt)


def slice_contains(e, ts):
    return e["ts"] <= ts <= e["ts"] + e["dur"]


def program(dev, gate):
    a = srt.Stream(dev, non_blocking=True)
    b = srt.Stream(dev, non_blocking=True)
    pool = srt.MemPool(dev)
    n = 1024
    p = a.malloc(n * 4, pool)
    g = gate(a)
    a.launch(fill_kernel, p, n, 1.0)
    b.wait(a.record())  # blocks until the gate opens: a flow arrow a -> b
    b.launch(add_one_kernel, p, n)
    g.open()
    a.wait(b.record())
    out = np.empty(n, np.float32)
    a.memcpy(out, p, n * 4)
    a.free(p)
    cap = srt.Stream(dev, non_blocking=True)
    cap.begin_capture()
    cap.launch(add_one_kernel, p, 1)
    graph = cap.end_capture()
    dev.synchronize()
    assert graph.nodes()
    return a, b, cap, out


def test_trace_file_is_valid_and_complete(tmp_path, any_dev, gate):
    # on cuda, operations are timed by timing events recorded around them on their stream
    dev = any_dev
    path = tmp_path / "t.json"
    with srt.trace(path):
        a, b, cap, out = program(dev, gate)
    assert out.tolist() == [2.0] * 1024
    events = load(path)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert len(names) == len(set(names))
    tracks = {tid for (_, tid) in names}
    assert a.id in tracks and b.id in tracks  # one named track per stream
    assert any(a.name in n for n in names.values())
    slices = [e for e in events if e["ph"] == "X"]
    kernels = {e["name"] for e in slices if e["cat"] == "kernel"}
    assert {"fill_kernel", "add_one_kernel"} <= kernels
    assert any(e["cat"] == "memcpy" and e["args"]["bytes"] == 4096 for e in slices)
    # slices on one track are nested or disjoint
    by_track = defaultdict(list)
    for e in slices:
        by_track[(e["pid"], e["tid"])].append(e)
    for evs in by_track.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[float] = []
        for e in evs:
            while stack and e["ts"] >= stack[-1]:
                stack.pop()
            end = e["ts"] + e["dur"]
            assert not stack or end <= stack[-1] + 1e-3, "overlapping slices on one track"
            stack.append(end)
    # a flow arrow for the wait that really blocked
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = [e for e in events if e["ph"] == "f"]
    assert finishes and all(f["id"] in starts for f in finishes)
    assert any(starts[f["id"]]["tid"] == a.id and f["tid"] == b.id for f in finishes)
    assert_tracks_well_formed(events)
    # pool counters, monotone in time
    counters = defaultdict(list)
    for e in events:
        if e["ph"] == "C":
            counters[e["name"]].append(e)
    assert counters
    for evs in counters.values():
        ts = [e["ts"] for e in evs]
        assert ts == sorted(ts)
        assert all({"reserved", "used"} <= set(e["args"]) for e in evs)
        assert all(e["args"]["used"] <= e["args"]["reserved"] for e in evs)
    assert max(e["args"]["used"] for evs in counters.values() for e in evs) >= 4096
    # capture markers
    marks = [(e["name"], e["tid"]) for e in events if e["ph"] == "i"]
    assert marks == [("capture begin", cap.id), ("capture end", cap.id)]  # on its stream's track


def test_trace_graph_launch_nests_nodes(tmp_path, dev):
    s = srt.Stream(dev, non_blocking=True)
    p = srt.malloc(4096)
    g = srt.Graph()
    a = g.add_kernel_node(fill_kernel, p, 16, 1.0)
    g.add_kernel_node(add_one_kernel, p, 16, deps=[a])
    ge = g.instantiate()
    path = tmp_path / "g.json"
    with srt.trace(path):
        ge.launch(s)
        s.synchronize()
    slices = [e for e in load(path) if e["ph"] == "X" and e["tid"] == s.id]
    launch = [e for e in slices if e["cat"] == "graph"]
    nodes = [e for e in slices if e["cat"] == "kernel"]
    assert len(launch) == 1 and len(nodes) == 2
    lo, hi = launch[0]["ts"], launch[0]["ts"] + launch[0]["dur"]
    assert all(lo <= e["ts"] and e["ts"] + e["dur"] <= hi + 1e-3 for e in nodes)
    srt.free(p)


@srt.kernel
def nap_kernel(ctx, seconds):
    """Runs for at least ``seconds``: a known duration to read the trace's time unit from."""
    time.sleep(seconds)


def test_trace_times_are_microseconds_and_pending_work_is_drained(tmp_path, dev):
    # Chrome's trace format counts ts/dur in microseconds from a common origin; leaving the
    # block waits for queued work, so a kernel still running then still gets its slice
    s = srt.Stream(dev, non_blocking=True)
    path = tmp_path / "units.json"
    t0 = time.perf_counter()
    with srt.trace(path):
        s.launch(nap_kernel, 0.05)
    wall_us = (time.perf_counter() - t0) * 1e6
    events = load(path)
    naps = [e for e in events if e["ph"] == "X" and e["name"] == "nap_kernel"]
    assert len(naps) == 1
    assert 50_000 - 1 <= naps[0]["dur"] <= wall_us
    for e in events:
        if "ts" in e:
            assert e["ts"] >= 0 and e["ts"] + e.get("dur", 0) <= wall_us, e
    assert_tracks_well_formed(events)


def test_trace_flow_binds_the_awaited_op_to_the_wait_across_devices(tmp_path, gate):
    # two devices: two processes; the arrow starts inside the slice of the operation the event
    # recorded (not the gate before it) and ends inside the wait on the other process's track
    a = srt.Stream("cpu:0", non_blocking=True)
    b = srt.Stream("cpu:1", non_blocking=True)
    p = a.malloc(64)
    path = tmp_path / "flow.json"
    with srt.trace(path):
        g = gate(a)
        a.launch(fill_kernel, p, 16, 1.0)
        b.wait(a.record())
        b.launch(nap_kernel, 0)
        g.open()
        b.synchronize()
    a.free(p)
    a.synchronize()
    events = load(path)
    assert_tracks_well_formed(events)
    procs = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    (fill,) = [e for e in events if e["ph"] == "X" and e["name"] == "fill_kernel"]
    (wait,) = [e for e in events if e["ph"] == "X" and e["cat"] == "wait"]
    assert (procs[fill["pid"]], fill["tid"]) == ("device cpu:0", a.id)
    assert (procs[wait["pid"]], wait["tid"]) == ("device cpu:1", b.id)
    (start,) = [e for e in events if e["ph"] == "s"]
    (finish,) = [e for e in events if e["ph"] == "f"]
    # a flow's two ends pair by id, name and category
    assert (start["id"], start["name"], start["cat"]) == (finish["id"], finish["name"],
                                                          finish["cat"])
    assert (start["pid"], start["tid"]) == (fill["pid"], fill["tid"])
    assert slice_contains(fill, start["ts"])
    # "bp": "e" binds the end to the slice enclosing ts (the wait), not to the next slice
    assert finish["bp"] == "e"
    assert (finish["pid"], finish["tid"]) == (wait["pid"], wait["tid"])
    assert slice_contains(wait, finish["ts"])
    assert finish["ts"] >= start["ts"]  # forward in time: the wait blocked until fill ended


def test_trace_parallel_graph_branches_get_tracks_of_their_own(tmp_path, dev):
    # two branches that must run at the same time (each waits for the other at a barrier)
    # cannot share one track: slices on one track nest or are disjoint
    meet = threading.Barrier(2, timeout=30)

    @srt.kernel
    def meet_kernel(ctx, barrier):
        barrier.wait()

    g = srt.Graph()
    g.add_kernel_node(meet_kernel, meet)
    g.add_kernel_node(meet_kernel, meet)
    ge = g.instantiate()
    s = srt.Stream(dev, non_blocking=True)
    path = tmp_path / "branches.json"
    with srt.trace(path):
        ge.launch(s)
        s.synchronize()
    events = load(path)
    assert_tracks_well_formed(events)
    nodes = [e for e in events if e["ph"] == "X" and e["name"] == "meet_kernel"]
    assert len(nodes) == 2
    assert len({(e["pid"], e["tid"]) for e in nodes}) == 2
    (launch,) = [e for e in events if e["ph"] == "X" and e["cat"] == "graph"]
    assert launch["tid"] == s.id


def test_trace_off_means_no_instrumentation(tmp_path, dev):
    no_sanitizer("the sanitizer is instrumentation of its own")
    with srt.trace(tmp_path / "x.json"):
        pass
    from streamrt import instrument, stream

    assert not instrument.listeners and not stream._global_slow


def test_trace_env_switch(tmp_path):
    import os
    import subprocess
    import sys

    path = tmp_path / "env.json"
    code = ("import streamrt as srt\ns = srt.Stream(non_blocking=True)\n"
            "s.launch_host_func(print, 'x')\ns.synchronize()\n")
    env = dict(os.environ, STREAMRT_TRACE=str(path))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    events = load(path)
    assert any(e["ph"] == "X" and e["cat"] == "host" for e in events)


def test_trace_to_a_path_it_cannot_write_is_refused_before_the_run(tmp_path):
    # before: the whole traced program ran, then writing the file failed
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(srt.InvalidValueError, match="cannot write a trace"):
        srt.trace(blocker / "t.json")  # its directory would be a file


def test_trace_pool_counters_follow_trim_and_destroy(tmp_path, dev):
    # the reserved counter kept saying 8 MiB after trim_to(0) until the next synchronize
    path = tmp_path / "t.json"
    with srt.trace(path) as tracer:
        s = srt.Stream(dev, non_blocking=True)
        pool = srt.MemPool(dev, release_threshold=64 << 20)
        s.free(s.malloc(8 << 20, pool))
        s.synchronize()
        assert pool.reserved_mem_current >= 8 << 20
        pool.trim_to(0)
        assert pool.reserved_mem_current == 0
        name = tracer.pool_name(pool)
        other = srt.MemPool(dev, release_threshold=64 << 20)
        s.free(s.malloc(8 << 20, other))
        s.synchronize()
        other.destroy()
        gone = tracer.pool_name(other)
        del pool  # collected: a later pool must not take its number (as id() could)
        import gc

        gc.collect()
        assert tracer.pool_name(srt.MemPool(dev)) not in (name, gone)
    last = {}
    for e in load(path):
        if e["ph"] == "C":
            last[e["name"]] = e["args"]["reserved"]
    assert last[name] == 0 and last[gone] == 0 and name != gone
    assert name.startswith("pool ") and name.endswith(f"({dev.name})")


def test_trace_flow_arrow_points_forward_when_the_wait_blocked(tmp_path, gate):
    # the wait starts before the awaited kernel ends: its arrow ended at the wait's start, back
    # in time; bound at the wait's end, it goes forward
    from streamrt import instrument

    started = threading.Event()

    class SeeWait:
        def op_start(self, op):
            if op.kind == "wait":
                started.set()

        def op_end(self, op):
            pass

    a, b = srt.Stream("cpu:0", non_blocking=True), srt.Stream("cpu:0", non_blocking=True)
    p = a.malloc(64)
    path = tmp_path / "flow.json"
    with srt.trace(path):
        g = gate(a)
        a.launch(fill_kernel, p, 16, 1.0)
        see = SeeWait()
        instrument.add(see)
        try:
            b.wait(a.record())
            assert started.wait(30)  # b's wait is running, blocked behind the gate
            g.open()
            b.synchronize()
        finally:
            instrument.remove(see)
    a.free(p)
    a.synchronize()
    events = load(path)
    (fill,) = [e for e in events if e["ph"] == "X" and e["name"] == "fill_kernel"]
    (wait,) = [e for e in events if e["ph"] == "X" and e["cat"] == "wait"]
    (start,) = [e for e in events if e["ph"] == "s"]
    (finish,) = [e for e in events if e["ph"] == "f"]
    assert wait["ts"] < fill["ts"] + fill["dur"]  # the wait blocked
    assert slice_contains(wait, finish["ts"]) and finish["ts"] >= start["ts"]


def test_trace_names_mallocs_and_tracks_first_seen_in_a_capture(tmp_path, dev):
    # with the sanitizer on, a stream-ordered malloc is an operation: it was a slice named "op";
    # a stream first seen at a capture marker lost "(non-blocking)" from its track name
    path = tmp_path / "t.json"
    srt.sanitizer.enable("collect")
    try:
        with srt.trace(path):
            c = srt.Stream(dev, non_blocking=True)
            c.begin_capture()
            c.end_capture()
            s = srt.Stream(dev, non_blocking=True)
            p = s.malloc(4096)
            s.free(p)
            c.launch(fill_kernel, 0, 0, 0.0)
            dev.synchronize()
    finally:
        srt.sanitizer.disable()
        srt.sanitizer.clear()
    events = load(path)
    names = {e["name"] for e in events if e["ph"] == "X"}
    assert "malloc 4096 B" in names and "op" not in names
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert tracks[c.id] == f"stream {c.name} (non-blocking)"
