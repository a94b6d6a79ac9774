"""Executable graphs: launch, failures, one exec never overlapping itself, branch concurrency,
captured launches of execs, upload and destroy."""

from __future__ import annotations

import threading

import pytest

import streamrt as srt
from tests.conftest import HOST_CONCURRENCY, PY_KERNELS, add_one_kernel, cpu_only, fill_kernel
from tests.conftest import read_f32 as _read
from tests.contract.graph.exec_kernels import scale_kernel, wait_kernel

N = 16


R = srt.GraphExecUpdateResult


WINDOW = 0.25  # seconds a correct runtime keeps something blocked; only a failing one is faster


# -- launch -------------------------------------------------------------------------------------
def test_graph_exec_launch_repeats_and_orders_with_stream_work(s, bufs, gate):
    a, _, _ = bufs
    g = srt.Graph()
    k = g.add_kernel_node(add_one_kernel, a, N)
    g.add_kernel_node(scale_kernel, a, N, 2.0, deps=k)
    ge = g.instantiate()
    assert isinstance(ge, srt.GraphExec)
    hold = gate(s)  # the launches queue behind stream work
    s.launch(fill_kernel, a, N, 1.0)
    for _ in range(3):
        ge.launch(s)
    s.launch(add_one_kernel, a, N)
    assert not s.query()
    hold.open()
    s.synchronize()
    # ((((1 + 1) * 2 + 1) * 2 + 1) * 2) + 1
    assert (_read(a) == 23.0).all()


def test_graph_exec_instantiate_snapshots_the_graph(s, bufs):
    a, _, _ = bufs
    g = srt.Graph()
    g.add_kernel_node(fill_kernel, a, N, 1.0)
    ge = g.instantiate()
    g.add_kernel_node(add_one_kernel, a, N, deps=g.nodes()[0])  # after instantiate
    ge.launch(s)
    s.synchronize()
    assert (_read(a) == 1.0).all()


def test_graph_exec_launch_errors(s, bufs):
    ge = srt.Graph().instantiate()
    with pytest.raises(srt.InvalidTypeError):
        ge.launch("stream")
    dead = srt.Stream(non_blocking=True)
    dead.destroy()
    with pytest.raises(srt.InvalidHandleError):
        ge.launch(dead)
    with pytest.raises(srt.InvalidTypeError):
        srt.Graph.instantiate("graph")


def test_graph_exec_replay_on_another_stream_runs_on_that_stream(s, s2, dev):
    cpu_only(dev, PY_KERNELS)
    # replay plans are compiled per stream: a plan reused across streams would hand kernels
    # the context (ctx.stream) of the stream it was first compiled for
    seen = []

    @srt.kernel
    def where(ctx):
        seen.append((ctx.stream, ctx.device))

    g = srt.Graph()
    g.add_kernel_node(where)
    ge = g.instantiate()
    for stream in (s, s2, s):
        ge.launch(stream)
    dev.synchronize()
    assert seen == [(s, dev), (s2, dev), (s, dev)]


def test_graph_exec_kernel_failure_reported_at_synchronize(s, dev):
    cpu_only(dev, PY_KERNELS)
    @srt.kernel
    def boom(ctx):
        raise RuntimeError("kernel boom")

    g = srt.Graph()
    g.add_kernel_node(boom)
    g.instantiate().launch(s)
    with pytest.raises(srt.LaunchError) as ei:
        s.synchronize()
    assert isinstance(ei.value.__cause__, RuntimeError)
    assert "graph launch (graph node: boom)" in str(ei.value)  # the node, not run_plan


def test_graph_exec_host_node_failure_reported_at_synchronize(s):
    # every backend: the failure of a host node (here with no dependents, where cpu and CUDA
    # agree) is raised by the next synchronize covering the launch, and the exec stays usable
    def bad():
        raise RuntimeError("host node boom")

    g = srt.Graph()
    node = g.add_host_node(bad)
    ge = g.instantiate()
    ge.launch(s)
    with pytest.raises(srt.LaunchError) as ei:
        s.synchronize()
    assert "host node boom" in str(ei.value.__cause__)
    log = []
    ge.set_host_node_params(node, log.append, 1)
    ge.launch(s)
    s.synchronize()
    assert log == [1]


def test_graph_exec_failure_in_a_parallel_branch_reported_and_exec_reusable(s, dev):
    cpu_only(dev, "a host function cannot fail in CUDA: a failed host node's dependents still run there")
    def bad():
        raise RuntimeError("branch boom")

    log = []
    g = srt.Graph()
    root = g.add_empty_node()
    x = g.add_host_node(bad, deps=root)
    y = g.add_host_node(log.append, "y", deps=root)
    g.add_host_node(log.append, "join", deps=[x, y])
    ge = g.instantiate()
    ge.launch(s)
    with pytest.raises(srt.LaunchError) as ei:
        s.synchronize()
    assert "branch boom" in str(ei.value.__cause__)
    assert "graph node: host function" in str(ei.value) and ".bad'" in str(ei.value)
    assert "join" not in log  # a failed node's dependents do not run
    ge.set_host_node_params(x, log.append, "x")
    ge.launch(s)
    s.synchronize()
    assert log[-1] == "join" and "x" in log


# -- one exec never overlaps itself -------------------------------------------------------------------
def test_graph_exec_launches_on_two_streams_never_overlap(s, s2, dev):
    active = [0]
    peak = [0]
    calls = [0]
    lock = threading.Lock()
    entered = threading.Event()
    release = threading.Event()

    def body():
        with lock:
            active[0] += 1
            calls[0] += 1
            peak[0] = max(peak[0], active[0])
        entered.set()
        release.wait(timeout=30)  # the first launch holds here until the test releases it
        with lock:
            active[0] -= 1

    g = srt.Graph()
    g.add_host_node(body)
    ge = g.instantiate()
    ge.launch(s)
    try:
        assert entered.wait(timeout=30)
        second_done = threading.Event()
        ge.launch(s2)  # must wait for the launch on s, still inside body()
        s2.launch_host_func(second_done.set)
        assert not second_done.wait(timeout=WINDOW)
        assert calls[0] == 1
    finally:
        release.set()
    s2.synchronize()
    assert calls[0] == 2 and peak[0] == 1
    # many launches over three streams: never two inside at once
    s3 = srt.Stream(dev, non_blocking=True)
    for i in range(30):
        ge.launch((s, s2, s3)[i % 3])
    dev.synchronize()
    assert calls[0] == 32 and peak[0] == 1


def test_graph_exec_launches_from_two_threads_never_overlap(s, s2, dev):
    active = [0]
    peak = [0]
    calls = [0]
    lock = threading.Lock()

    def body():
        with lock:
            active[0] += 1
            calls[0] += 1
            peak[0] = max(peak[0], active[0])
        with lock:
            active[0] -= 1

    g = srt.Graph()
    root = g.add_host_node(body)
    g.add_host_node(body, deps=root)  # two nodes: an overlap would interleave them
    ge = g.instantiate()
    start = threading.Barrier(2, timeout=30)

    def launcher(stream):
        start.wait()
        for _ in range(25):
            ge.launch(stream)

    threads = [threading.Thread(target=launcher, args=(st,)) for st in (s, s2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    dev.synchronize()
    assert calls[0] == 100 and peak[0] == 1


def test_graph_exec_two_execs_of_one_graph_may_overlap(s, s2, dev):
    cpu_only(dev, HOST_CONCURRENCY)
    # the rule is per exec: two execs of the same graph are independent
    met = threading.Barrier(2, timeout=30)
    g = srt.Graph()
    g.add_host_node(met.wait)
    ge1, ge2 = g.instantiate(), g.instantiate()
    ge1.launch(s)
    ge2.launch(s2)
    s.synchronize()
    s2.synchronize()


# -- branch concurrency ---------------------------------------------------------------------------
def _meet(mine, other, log, tag):
    mine.set()
    log.append((tag, other.wait(timeout=10)))


def test_graph_exec_independent_branches_run_concurrently(s, dev):
    cpu_only(dev, HOST_CONCURRENCY)
    # each branch signals the other and waits for the other's signal: they only both succeed
    # when they run at the same time
    ea, eb = threading.Event(), threading.Event()
    log = []
    g = srt.Graph()
    root = g.add_empty_node()
    a = g.add_host_node(_meet, ea, eb, log, "a", deps=root)
    b = g.add_host_node(_meet, eb, ea, log, "b", deps=root)
    g.add_host_node(log.append, "join", deps=[a, b])
    g.instantiate().launch(s)
    s.synchronize()
    assert sorted(log[:2]) == [("a", True), ("b", True)] and log[2] == "join"


def test_graph_exec_captured_fork_runs_branches_concurrently(s, s2, dev):
    cpu_only(dev, HOST_CONCURRENCY)
    ea, eb = threading.Event(), threading.Event()
    log = []
    s.begin_capture()
    s2.wait(s.record())
    s2.launch_host_func(_meet, eb, ea, log, "b")
    s.launch_host_func(_meet, ea, eb, log, "a")
    s.wait(s2.record())
    s.launch_host_func(log.append, "join")
    ge = s.end_capture().instantiate()
    for _ in range(3):
        ea.clear()
        eb.clear()
        ge.launch(s)
        s.synchronize()
    assert log.count("join") == 3 and all(x[1] for x in log if x != "join")


def test_graph_exec_join_waits_for_every_branch(s, dev):
    cpu_only(dev, PY_KERNELS)
    # join depends on a and b; b holds for a window unless join has (wrongly) started
    join_started = threading.Event()
    log = []
    g = srt.Graph()
    a = g.add_host_node(log.append, "a")
    b = g.add_kernel_node(wait_kernel, join_started, log, "b", WINDOW)
    g.add_host_node(lambda: (join_started.set(), log.append("join")), deps=[a, b])
    g.instantiate().launch(s)
    s.synchronize()
    assert log[-2:] == [("b", False), "join"] and "a" in log


def test_graph_exec_captured_launch_keeps_disabled_nodes_empty(s, bufs):
    a, _, _ = bufs
    g = srt.Graph()
    f = g.add_kernel_node(fill_kernel, a, N, 1.0)
    inc = g.add_kernel_node(add_one_kernel, a, N, deps=f)
    ge = g.instantiate()
    ge.set_kernel_node_params(f, a, N, 5.0)
    ge.set_node_enabled(inc, False)
    s.begin_capture()
    ge.launch(s)  # captured as a child graph of what this exec runs now
    outer = s.end_capture()
    ge.set_kernel_node_params(f, a, N, 9.0)  # later changes do not reach the captured graph
    outer.instantiate().launch(s)
    s.synchronize()
    assert (_read(a) == 5.0).all()


def test_graph_exec_captured_launch_of_exec_with_memory_nodes_refused(s):
    g = srt.Graph()
    al = g.add_mem_alloc_node(64)
    g.add_mem_free_node(al.ptr, deps=al)
    ge = g.instantiate()
    s.begin_capture()
    with pytest.raises(srt.InvalidValueError, match="memory"):
        ge.launch(s)
    assert s.end_capture().nodes() == []
    ge.destroy()


# -- upload, destroy -------------------------------------------------------------------------------------
def test_graph_exec_upload_then_launch(s, bufs):
    a, _, _ = bufs
    g = srt.Graph()
    g.add_kernel_node(add_one_kernel, a, N)
    ge = g.instantiate()
    ge.upload(s)
    for _ in range(3):
        ge.launch(s)
    s.synchronize()
    assert (_read(a) == 3.0).all()
    with pytest.raises(srt.InvalidTypeError):
        ge.upload(None)


def test_graph_exec_destroy(s, bufs):
    a, _, _ = bufs
    g = srt.Graph()
    k = g.add_kernel_node(add_one_kernel, a, N)
    ge = g.instantiate()
    ge.launch(s)
    ge.destroy()  # the enqueued launch still completes
    s.synchronize()
    assert (_read(a) == 1.0).all()
    for call in (lambda: ge.launch(s), lambda: ge.upload(s), ge.destroy,
                 lambda: ge.set_kernel_node_params(k, a, N), lambda: ge.update(g),
                 lambda: ge.set_node_enabled(k, False)):
        with pytest.raises(srt.InvalidHandleError):
            call()
    # the graph itself still instantiates
    g.instantiate().launch(s)
    s.synchronize()
    assert (_read(a) == 2.0).all()


@pytest.mark.parametrize("bad", ["event of another device", "destroyed event"])
def test_graph_exec_refused_launch_launches_nothing(bad):
    # the record node's event was checked after the graph was enqueued: the launch raised, yet
    # the graph ran, and the next launch of the exec was not ordered after it
    log = []
    e = srt.Event("cpu:0")
    g = srt.Graph()
    h = g.add_host_node(log.append, "ran")
    g.add_event_record_node(e, deps=h)
    ge = g.instantiate()
    s = srt.Stream("cpu:1" if bad == "event of another device" else "cpu:0", non_blocking=True)
    if bad == "destroyed event":
        e.destroy()
    pos = s._pos
    with pytest.raises(srt.InvalidHandleError):
        ge.launch(s)
    s.synchronize()
    assert log == [] and s._pos == pos  # nothing enqueued, nothing ran
    if bad == "event of another device":
        ok = srt.Stream("cpu:0", non_blocking=True)
        ge.launch(ok)
        ok.synchronize()
        assert log == ["ran"] and e.query()
