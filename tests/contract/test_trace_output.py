"""What traces and findings say (issue 24, point 8): user ranges, stream names, runtime work
labelled as such, waits named by their event and stream, findings' operations printed readably."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

import streamrt as srt
from streamrt import ops
from tests.conftest import BAD_ACCESS, add_one_kernel, fill_kernel, no_sanitizer
from tests.contract.sanitizer_helpers import write_k

F32 = np.float32


def load(path):
    return json.loads(path.read_text())["traceEvents"]


def track_names(events):
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in events
            if e["ph"] == "M" and e["name"] == "thread_name"}


def slices(events, cat=None):
    return [e for e in events if e["ph"] == "X" and (cat is None or e["cat"] == cat)]


def test_trace_names_ranges_streams_operators_waits_and_runtime_work(tmp_path, any_dev):
    dev = any_dev
    path = tmp_path / "t.json"
    with srt.trace(path):
        compute = srt.Stream(dev, non_blocking=True, name="compute")
        copy = srt.Stream(dev, non_blocking=True, name="copy")
        with srt.range("step"):
            x = srt.Tensor.from_numpy(np.ones((4, 600), F32), stream=compute)
            total = srt.Tensor.empty((4,), F32, stream=compute)
            with srt.range("reduce"):
                ops.run(ops.reduce_sum, x, total, stream=compute, axis=1)
            copy.wait(compute.record())  # not yet ordered: a real wait (blocking or not)
            copy.launch(add_one_kernel, total.ptr, 4)
            p = copy.malloc(64)
            copy.record()
            copy.free(p)  # right after a record: a stream operation of its own
        dev.synchronize()
        got = srt.read(total.ptr, (4,), F32)
    assert got.tolist() == [601.0] * 4
    events = load(path)
    names = track_names(events)
    # the streams' tracks carry their names (and which stream they are)
    assert names[(1 if dev.backend == "cpu" else 1001, compute.id)] == (
        f"stream 'compute' ({dev.name}/{compute.id}, non-blocking)")
    assert any(n.startswith("stream 'copy' (") for n in names.values())
    # the ranges: nested slices on the host thread's track of the host process
    procs = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    ranges = {e["name"]: e for e in slices(events, "range")}
    assert set(ranges) == {"step", "reduce"}
    step, reduce = ranges["step"], ranges["reduce"]
    assert procs[step["pid"]] == "host"
    assert names[(step["pid"], step["tid"])] == "host thread MainThread"
    assert (reduce["pid"], reduce["tid"]) == (step["pid"], step["tid"])
    assert step["ts"] <= reduce["ts"] and reduce["ts"] + reduce["dur"] <= step["ts"] + step["dur"]
    assert (step["args"]["depth"], reduce["args"]["depth"]) == (0, 1)
    # the operator's kernels by their public name; the executor's release labelled as such
    xs = slices(events)
    kernels = [e["name"] for e in xs if e["cat"] == "kernel"]
    assert kernels[-1] == "add_one_kernel" and len(kernels) >= 2, kernels
    if dev.backend == "cpu":  # (cuda's operator kernels are still named by their C symbol)
        assert all(k.startswith("ops.reduce_sum (") for k in kernels[:-1]), kernels
        assert {"ops.reduce_sum (_sum_level)", "ops.reduce_sum (_sum_final)"} <= set(kernels)
    host = [e["name"] for e in xs if e["cat"] == "host"]
    assert host == ["executor release"]
    # the wait: by its event and the stream that recorded it, on the waiting stream's track
    waits = [e for e in xs if e["cat"] == "wait"]
    assert [w["name"] for w in waits] == ["wait event 1 (recorded on stream 'compute')"]
    assert waits[0]["tid"] == copy.id
    assert waits[0]["args"]["on"].startswith("compute@")
    frees = [e["name"] for e in xs if e["cat"] == "free"]  # (cuda: the driver's free too)
    assert frees[0] == "pool free" and all(n.startswith("pool free") for n in frees), frees
    # no Python internals anywhere: reprs, qualified method names, closures
    text = json.dumps(events)
    for internal in ("<Stream", "object at", "Executor._release", "<locals>", "_marker"):
        assert internal not in text, internal


def test_waits_name_why_they_wait(tmp_path, dev):
    """A wait with no event says what ordered it: legacy stream ordering, pool reuse."""
    path = tmp_path / "t.json"
    with srt.trace(path):
        blocking = srt.Stream(dev)  # blocking: ordered with the legacy stream
        p = srt.malloc(16)
        dev.default_stream.launch(fill_kernel, p, 4, 1.0)
        blocking.launch(fill_kernel, p, 4, 2.0)
        dev.synchronize()
    srt.free(p)
    waits = [e["name"] for e in slices(load(path), "wait")]
    assert waits == [f"wait for stream '{dev.default_stream.name}' (legacy stream ordering)"]


def test_ranges_per_host_thread_and_as_decorator(tmp_path, dev):
    @srt.range("work")
    def work(n):
        """Doc kept."""
        with srt.range(f"inner {n}"):
            return n * 2

    path = tmp_path / "t.json"
    out = []
    with srt.trace(path):
        out.append(work(1))
        t = threading.Thread(target=lambda: out.append(work(2)), name="helper")
        t.start()
        t.join()
    assert out == [2, 4]
    assert work.__name__ == "work" and work.__doc__ == "Doc kept."
    events = load(path)
    names = track_names(events)
    by_name = {}
    for e in slices(events, "range"):
        by_name.setdefault(e["name"], []).append(e)
    assert sorted(by_name) == ["inner 1", "inner 2", "work"]
    w1, w2 = sorted(by_name["work"], key=lambda e: e["ts"])
    assert names[(w1["pid"], w1["tid"])] == "host thread MainThread"
    assert names[(w2["pid"], w2["tid"])] == "host thread helper"
    assert (by_name["inner 2"][0]["tid"], by_name["inner 1"][0]["tid"]) == (w2["tid"], w1["tid"])
    assert {e["args"]["depth"] for e in by_name["work"]} == {0}


def test_ranges_outside_a_trace_and_bad_names():
    with srt.range("untraced") as r:  # nothing listens: runs, records nothing
        assert r.name == "untraced"

    @srt.range("f")
    def f():
        raise KeyError("x")

    with pytest.raises(KeyError):  # an exception leaves the range (and passes through)
        f()
    with pytest.raises(srt.InvalidTypeError):
        srt.range(3)
    with pytest.raises(srt.InvalidValueError):
        srt.range("")
    with pytest.raises(srt.InvalidTypeError):
        srt.range("x")(5)
    assert "range" not in srt.__all__  # ``from streamrt import *`` keeps the builtin
    assert range(2) == range(0, 2)


def test_stream_name_in_repr_messages_and_default(dev):
    s = srt.Stream(dev, non_blocking=True, name="copy")
    assert s.name == "copy"
    assert repr(s) == f"<Stream {dev.name}#{s.id} non-blocking 'copy'>"
    plain = srt.Stream(dev)
    assert plain.name == f"{dev.name}/{plain.id}"  # the default is unchanged
    assert repr(plain) == f"<Stream {dev.name}#{plain.id} blocking>"
    assert "copy@" in repr(s.record())
    with pytest.raises(srt.InvalidTypeError):
        srt.Stream(dev, name=7)
    with pytest.raises(srt.InvalidValueError):
        srt.Stream(dev, name="")
    no_sanitizer(BAD_ACCESS)

    @srt.kernel
    def boom(ctx):
        raise RuntimeError("boom")

    s.launch(boom)
    with pytest.raises(srt.LaunchError, match="on stream copy"):
        s.synchronize()


def test_runtime_host_functions_and_closures_are_labelled(tmp_path, dev):
    def outer():
        def note():
            pass
        return note

    path = tmp_path / "t.json"
    s = srt.Stream(dev, non_blocking=True)
    with srt.trace(path):
        s.launch_host_func(outer())
        x = srt.Tensor.from_numpy(np.ones(8, F32), stream=s)
        ops.run(ops.add, x, x, x, stream=s)
        s.synchronize()
    labels = [e["name"] for e in slices(load(path), "host")]
    assert len(labels) == 2 and labels[0].endswith(".outer.note") and "<" not in labels[0], labels
    assert labels[1] == "executor release"


def test_sanitizer_findings_print_the_other_operation_readably(dev, san):
    a, b = srt.Stream(dev, non_blocking=True), srt.Stream(dev, non_blocking=True)
    x = srt.Tensor.from_numpy(np.ones((4, 600), F32), stream=a)
    total = srt.Tensor.empty((4,), F32, stream=a)
    a.synchronize()
    ops.run(ops.reduce_sum, x, total, stream=a, axis=1)
    b.launch(write_k, total.ptr, 4, 0.0)  # BUG: no wait on a's operator, which writes total
    dev.synchronize()
    race = next(f for f in san.report() if f.kind == "race")
    here = __file__.rsplit("/", 1)[-1]
    # which access is ``op`` (found second) and which ``other`` depends on which ran first
    texts = sorted([str(race.op), str(race.other)], key=lambda t: "write_k" in t)
    mine, theirs = texts  # each names the kernel, its stream and where it was enqueued
    assert mine.startswith("kernel 'ops.reduce_sum (_sum_") and f" on {a.name}@" in mine, texts
    assert theirs.startswith(f"kernel 'write_k' on {b.name}@"), texts
    assert f"{here}:" in mine and f"{here}:" in theirs
    san.clear()
    p = a.malloc(64)
    b.launch(write_k, p, 4, 0.0)  # BUG: the allocation on a is not ordered before b's use
    dev.synchronize()
    f = next(f for f in san.report() if f.kind == "use-before-alloc")
    assert str(f.other).startswith(f"malloc of {hex(p)} (64 B) on {a.name}@"), str(f.other)
    assert f"{here}:" in str(f.other) and "object at" not in repr(f.other)
    san.clear()
    for t in (x, total):
        t.free(a)
    a.free(p)
    dev.synchronize()
