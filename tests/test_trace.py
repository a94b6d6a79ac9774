"""Chrome/Perfetto traces: well-formed JSON, one track per stream, nesting, flows, counters."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np

import streamrt as srt

from .conftest import add_one_kernel, fill_kernel


def load(path):
    data = json.loads(path.read_text())
    assert isinstance(data["traceEvents"], list)
    return data["traceEvents"]


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
    return a, b, graph, out


def test_trace_file_is_valid_and_complete(tmp_path, any_dev, gate):
    # on cuda, operations are timed by timing events recorded around them on their stream
    dev = any_dev
    path = tmp_path / "t.json"
    with srt.trace(path):
        a, b, _, out = program(dev, gate)
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
    assert max(e["args"]["used"] for evs in counters.values() for e in evs) >= 4096
    # capture markers
    marks = [e["name"] for e in events if e["ph"] == "i"]
    assert marks == ["capture begin", "capture end"]


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


def test_trace_off_means_no_instrumentation(tmp_path, dev):
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
