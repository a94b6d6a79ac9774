"""Executable graphs: launch, per-node parameter updates, enable/disable, whole-graph update,
launch serialisation, branch concurrency, event nodes, upload and destroy."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamrt as srt
from tests.conftest import (
    HOST_CONCURRENCY,
    PY_KERNELS,
    _grid_stride,
    add_one_kernel,
    copy_kernel,
    cpu_only,
    fill_kernel,
    restore_delays,
    set_delays,
)
from tests.conftest import read_f32 as _read

N = 16
R = srt.GraphExecUpdateResult
WINDOW = 0.25  # seconds a correct runtime keeps something blocked; only a failing one is faster


@pytest.fixture
def dev(any_dev):
    """Each backend's device 0: executable graphs are a contract of every backend."""
    return any_dev


@pytest.fixture
def bufs(dev):
    ptrs = [srt.malloc(N * 4, dev) for _ in range(3)]
    for p in ptrs:
        srt.memset(p, 0, N * 4)
    yield ptrs
    for p in ptrs:
        srt.free(p)


@srt.kernel(cuda=_grid_stride("scale_kernel", "float* ptr, int n, float factor", "ptr[i] *= factor"),
            signature="ptr, i32, f32")
def scale_kernel(ctx, ptr, n, factor):
    ctx.array(ptr, (n,), np.float32)[:] *= factor


@srt.kernel
def log_kernel(ctx, log, tag):
    log.append(tag)


@srt.kernel
def wait_kernel(ctx, event, log, tag, timeout):
    """Holds until ``event`` is set (or ``timeout`` passes), then logs ``(tag, was_set)``."""
    log.append((tag, event.wait(timeout=timeout)))


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


# -- per-node parameter updates: later launches only -------------------------------------------
def test_graph_exec_set_kernel_params_apply_to_later_launches_only(s, bufs, gate):
    a, b, _ = bufs
    g = srt.Graph()
    node = g.add_kernel_node(fill_kernel, a, N, 1.0)
    ge = g.instantiate()
    hold = gate(s)
    ge.launch(s)  # enqueued with the old params, held by the gate
    ge.set_kernel_node_params(node, b, N, 7.0, grid=4, block=(2, 2))
    ge.launch(s)
    hold.open()
    s.synchronize()
    assert (_read(a) == 1.0).all() and (_read(b) == 7.0).all()
    # the user's graph is unchanged; only the exec changed
    assert node.params["args"] == (a, N, 1.0) and tuple(node.params["grid"]) == (1, 1, 1)


def test_graph_exec_set_kernel_params_keeps_launch_shape_unless_given(s, dev):
    cpu_only(dev, PY_KERNELS)
    seen = []

    @srt.kernel
    def shape(ctx, tag):
        seen.append((tag, tuple(ctx.grid), tuple(ctx.block)))

    g = srt.Graph()
    node = g.add_kernel_node(shape, "a", grid=3, block=5)
    ge = g.instantiate()
    ge.set_kernel_node_params(node, "b")
    ge.launch(s)
    ge.set_kernel_node_params(node, "c", grid=(2, 2))
    ge.launch(s)
    s.synchronize()
    assert seen == [("b", (3, 1, 1), (5, 1, 1)), ("c", (2, 2, 1), (5, 1, 1))]


def test_graph_exec_set_host_node_params_same_arity(s):
    # a new callable with the very same argument objects, then new arguments of the same number:
    # a backend that updates its graph in place must not keep calling the old ones
    old, new = [], []
    tag = "x"
    g = srt.Graph()
    host = g.add_host_node(old.append, tag)
    ge = g.instantiate()
    ge.launch(s)
    ge.set_host_node_params(host, new.append, tag)
    ge.launch(s)
    ge.set_host_node_params(host, new.append, "y")
    ge.launch(s)
    s.synchronize()
    assert old == ["x"] and new == ["x", "y"]


def test_graph_exec_set_memcpy_memset_host_params_later_launches_only(s, bufs, gate):
    a, b, c = bufs
    log = []
    g = srt.Graph()
    fill = g.add_kernel_node(fill_kernel, a, N, 3.0)
    cp = g.add_memcpy_node(b, a, N * 4, deps=fill)
    ms = g.add_memset_node(c, 0, N * 4, deps=cp)
    host = g.add_host_node(log.append, "old", deps=ms)
    ge = g.instantiate()
    hold = gate(s)
    ge.launch(s)
    ge.set_memcpy_node_params(cp, c, a, 8)
    ge.set_memset_node_params(ms, b, 0xFF, 4)
    ge.set_host_node_params(host, lambda x, y: log.append(x + y), "ne", "w")
    hold.open()
    s.synchronize()
    assert log == ["old"] and (_read(b) == 3.0).all() and (_read(c) == 0.0).all()
    ge.launch(s)
    s.synchronize()
    assert log == ["old", "new"]
    got_c = _read(c)
    assert (got_c[:2] == 3.0).all() and (got_c[2:] == 0.0).all()
    assert srt.read(b, (4,), np.uint8).tolist() == [0xFF] * 4
    assert (_read(b)[1:] == 3.0).all()


def test_graph_exec_updates_reach_the_backend_graph_in_place(s, bufs, dev):
    # on cuda: set-params, enable/disable and exec update change the instantiated graph
    # (cudaGraphExec*NodeSetParams, cudaGraphNodeSetEnabled) instead of building it again
    if dev.backend == "cpu":
        pytest.skip("the cpu backend has no graph of its own: its plans are compiled again")
    a, b, _ = bufs
    host = [np.zeros(N, np.float32) for _ in range(2)]
    g = srt.Graph()
    k = g.add_kernel_node(fill_kernel, a, N, 1.0)
    m = g.add_memset_node(b, 0, N * 4, deps=k)
    cp = g.add_memcpy_node(host[0], a, N * 4, deps=m)  # pageable host memory

    def launch():
        ge.launch(s)
        s.synchronize()
        assert ge._plans[dev] is plan  # not instantiated again

    ge = g.instantiate()
    ge.launch(s)
    s.synchronize()
    plan = ge._plans[dev]
    ge.set_kernel_node_params(k, a, N, 2.0)
    ge.set_memset_node_params(m, b, 7, N * 4)
    ge.set_memcpy_node_params(cp, host[1], a, N * 4)
    launch()
    assert (host[0] == 1.0).all() and (host[1] == 2.0).all()
    assert (srt.read(b, (N * 4,), np.uint8) == 7).all()
    ge.set_node_enabled(k, False)
    srt.memset(a, 0, N * 4)
    launch()
    assert (host[1] == 0.0).all()  # the disabled fill did not run
    ge.set_node_enabled(k, True)
    variant = srt.Graph()
    k2 = variant.add_kernel_node(fill_kernel, a, N, 4.0)
    m2 = variant.add_memset_node(b, 9, N * 4, deps=k2)
    variant.add_memcpy_node(host[0], a, N * 4, deps=m2)
    ge.update(variant)
    launch()
    assert (host[0] == 4.0).all() and (srt.read(b, (N * 4,), np.uint8) == 9).all()
    # what CUDA cannot change in place (a memset of nothing) builds the graph again
    ge.set_memset_node_params(m, b, 0, 0)
    ge.launch(s)
    s.synchronize()
    assert ge._plans[dev] is not plan and (srt.read(b, (N * 4,), np.uint8) == 9).all()


def test_graph_exec_host_buffer_of_an_updated_copy_kept_for_launches_in_flight(s, bufs, dev, gate):
    # a launch enqueued before the update still copies into the old host array: the backend
    # graph keeps it until that launch has run, then lets it go
    import gc
    import weakref

    if dev.backend == "cpu":
        pytest.skip("the cpu backend's enqueued plans hold their own operands")
    a = bufs[0]
    g = srt.Graph()
    cp = g.add_memcpy_node(np.ones(N, np.float32), a, N * 4)  # the user's graph keeps this one
    ge = g.instantiate()
    ge.launch(s)
    mid = np.ones(N, np.float32)  # held by the exec alone
    ge.set_memcpy_node_params(cp, mid, a, N * 4)
    hold = gate(s)
    ge.launch(s)
    ge.set_memcpy_node_params(cp, np.ones(N, np.float32), a, N * 4)
    gone = weakref.ref(mid)
    del mid
    gc.collect()
    assert gone() is not None  # the launch in flight still writes into it
    hold.open()
    s.synchronize()
    assert (gone() == 0.0).all()
    ge.set_memcpy_node_params(cp, np.ones(N, np.float32), a, N * 4)
    gc.collect()
    assert gone() is None  # that launch has run: the next update lets it go


def test_graph_exec_set_params_refusals(s, bufs):
    a, b, c = bufs
    host = np.zeros(N, np.float32)
    g = srt.Graph()
    k = g.add_kernel_node(fill_kernel, a, N, 1.0)
    d2d = g.add_memcpy_node(b, a, N * 4, deps=k)
    h2d = g.add_memcpy_node(c, host, N * 4)
    ms = g.add_memset_node(c, 0, 4, deps=h2d)
    h = g.add_host_node(print)
    ge = g.instantiate()
    with pytest.raises(srt.InvalidValueError, match="direction"):
        ge.set_memcpy_node_params(d2d, host, a, N * 4)  # device->device becomes device->host
    with pytest.raises(srt.InvalidValueError, match="direction"):
        ge.set_memcpy_node_params(h2d, a, b, N * 4)
    with pytest.raises(srt.InvalidValueError):
        ge.set_memcpy_node_params(k, b, a, 4)  # a kernel node
    with pytest.raises(srt.InvalidValueError):
        ge.set_kernel_node_params(ms, a)
    with pytest.raises(srt.InvalidValueError, match="0-255"):
        ge.set_memset_node_params(ms, a, 300, 4)
    with pytest.raises(srt.InvalidTypeError):
        ge.set_host_node_params(h, 5)
    with pytest.raises(srt.InvalidValueError):  # a node of another graph
        ge.set_kernel_node_params(srt.Graph().add_kernel_node(fill_kernel), a)
    with pytest.raises(srt.InvalidTypeError):
        ge.set_kernel_node_params("node", a)
    # the refusals changed nothing
    ge.launch(s)
    s.synchronize()
    assert (_read(b) == 1.0).all()


# -- enable / disable ----------------------------------------------------------------------------------
def test_graph_exec_disabled_node_acts_as_empty(s, bufs):
    a, _, _ = bufs
    g = srt.Graph()
    fill = g.add_kernel_node(fill_kernel, a, N, 1.0)
    inc = g.add_kernel_node(add_one_kernel, a, N, deps=fill)
    g.add_kernel_node(scale_kernel, a, N, 3.0, deps=inc)
    ge = g.instantiate()
    assert ge.node_enabled(inc)
    ge.set_node_enabled(inc, False)
    assert not ge.node_enabled(inc)
    ge.launch(s)
    s.synchronize()
    assert (_read(a) == 3.0).all()
    ge.set_node_enabled(inc, True)
    ge.launch(s)
    s.synchronize()
    assert (_read(a) == 6.0).all()


def test_graph_exec_disabled_node_keeps_ordering_through_it(s, dev):
    cpu_only(dev, PY_KERNELS)
    # first -> disabled -> last: last must still wait for first
    last_started = threading.Event()
    log = []
    g = srt.Graph()
    first = g.add_kernel_node(wait_kernel, last_started, log, "first", WINDOW)
    mid = g.add_kernel_node(log_kernel, log, "mid", deps=first)
    g.add_host_node(lambda: (last_started.set(), log.append("last")), deps=mid)
    ge = g.instantiate()
    ge.set_node_enabled(mid, False)
    ge.launch(s)
    s.synchronize()
    assert log == [("first", False), "last"]


def test_graph_exec_enable_refused_for_other_node_types(bufs):
    g = srt.Graph()
    h = g.add_host_node(print)
    ge = g.instantiate()
    with pytest.raises(srt.InvalidValueError):
        ge.set_node_enabled(h, False)
    with pytest.raises(srt.InvalidTypeError):
        ge.set_node_enabled(h, 0)
    with pytest.raises(srt.InvalidValueError):
        ge.node_enabled(h)  # cudaGraphNodeGetEnabled too: kernel, memcpy and memset nodes only


def test_graph_exec_disable_applies_to_later_launches_only(s, bufs, gate):
    a, _, _ = bufs
    g = srt.Graph()
    inc = g.add_kernel_node(add_one_kernel, a, N)
    ge = g.instantiate()
    hold = gate(s)
    ge.launch(s)
    ge.set_node_enabled(inc, False)
    ge.launch(s)
    hold.open()
    s.synchronize()
    assert (_read(a) == 1.0).all()


# -- whole-graph update ----------------------------------------------------------------------------
def _chain(a, b, *, second=add_one_kernel, value=1.0):
    g = srt.Graph()
    k1 = g.add_kernel_node(fill_kernel, a, N, value)
    k2 = g.add_kernel_node(second, a, N, deps=k1)
    g.add_memcpy_node(b, a, N * 4, deps=k2)
    return g


def test_graph_exec_update_accepts_new_params_and_kernel_function(s, bufs, gate):
    a, b, c = bufs
    ge = _chain(a, b).instantiate()
    hold = gate(s)
    ge.launch(s)  # held: keeps the old params
    new = srt.Graph()
    k1 = new.add_kernel_node(fill_kernel, a, N, 5.0)
    k2 = new.add_kernel_node(scale_kernel, a, N, 2.0, deps=k1)  # another kernel function
    new.add_memcpy_node(c, a, N * 4, deps=k2)
    ge.update(new)
    ge.launch(s)
    hold.open()
    s.synchronize()
    assert (_read(b) == 2.0).all()  # first launch: fill 1, +1
    assert (_read(c) == 10.0).all()  # second launch: fill 5, *2
    # the exec does not follow later edits of the graph it was updated from
    new.add_empty_node()
    ge.launch(s)
    s.synchronize()
    assert (_read(c) == 10.0).all()


def test_graph_exec_update_topology_changed(bufs):
    a, b, _ = bufs
    ge = _chain(a, b).instantiate()
    more = _chain(a, b)
    more.add_empty_node()
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge.update(more)
    assert ei.value.result is R.TOPOLOGY_CHANGED and ei.value.code == 910
    rewired = _chain(a, b)
    n0, _, n2 = rewired.nodes()
    rewired.add_dependencies(n0, n2)
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge.update(rewired)
    assert ei.value.result is R.TOPOLOGY_CHANGED and ei.value.node is n2


def test_graph_exec_update_compares_edges_not_their_count_or_order(s, bufs):
    a, b, c = bufs

    def join(first, second, value):
        # fill a and b, then c = a (a join node whose dependencies are listed in a given order)
        g = srt.Graph()
        fa = g.add_kernel_node(fill_kernel, a, N, value)
        fb = g.add_kernel_node(fill_kernel, b, N, value)
        nodes = (fa, fb)
        g.add_memcpy_node(c, a, N * 4, deps=[nodes[first], nodes[second]])
        return g

    ge = join(0, 1, 1.0).instantiate()
    # the same edges listed the other way round: the same topology (dependencies are a set)
    ge.update(join(1, 0, 3.0))
    ge.launch(s)
    s.synchronize()
    assert (_read(c) == 3.0).all()
    # as many edges as before, but one comes from another node: a topology change
    moved = srt.Graph()
    fa = moved.add_kernel_node(fill_kernel, a, N, 1.0)
    fb = moved.add_kernel_node(fill_kernel, b, N, 1.0, deps=fa)
    cp = moved.add_memcpy_node(c, a, N * 4, deps=fb)
    orig = srt.Graph()
    oa = orig.add_kernel_node(fill_kernel, a, N, 1.0)
    ob = orig.add_kernel_node(fill_kernel, b, N, 1.0)
    orig.add_memcpy_node(c, a, N * 4, deps=oa)
    orig.add_dependencies(oa, ob)  # orig: a -> b, a -> c; moved: a -> b, b -> c
    ge2 = orig.instantiate()
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge2.update(moved)
    assert ei.value.result is R.TOPOLOGY_CHANGED and ei.value.node is cp


def test_graph_exec_update_and_set_params_refuse_a_move_to_another_device(s, dev, bufs):
    cpu_only(dev, "needs a second device of the same backend (the cpu backend has two)")
    a, _, _ = bufs
    other = srt.Device("cpu:1")
    far = srt.malloc(N * 4, other)
    try:
        g = srt.Graph()
        k = g.add_kernel_node(fill_kernel, a, N, 1.0)
        ms = g.add_memset_node(a, 0, N * 4, deps=k)
        ge = g.instantiate()
        # the kernel node now belongs to the other device: its function's context changed
        moved_kernel = srt.Graph()
        with other:
            k2 = moved_kernel.add_kernel_node(fill_kernel, a, N, 1.0)
        moved_kernel.add_memset_node(a, 0, N * 4, deps=k2)
        with pytest.raises(srt.GraphExecUpdateError) as ei:
            ge.update(moved_kernel)
        assert ei.value.result is R.UNSUPPORTED_FUNCTION_CHANGE and ei.value.node is k2
        # the memset's memory is on the other device
        moved_memset = srt.Graph()
        k3 = moved_memset.add_kernel_node(fill_kernel, a, N, 1.0)
        ms3 = moved_memset.add_memset_node(far, 0, N * 4, deps=k3)
        with pytest.raises(srt.GraphExecUpdateError) as ei:
            ge.update(moved_memset)
        assert ei.value.result is R.PARAMETERS_CHANGED and ei.value.node is ms3
        # the per-node setter refuses what update refuses (cudaGraphExecMemsetNodeSetParams)
        with pytest.raises(srt.InvalidValueError, match="device"):
            ge.set_memset_node_params(ms, far, 0, N * 4)
        srt.memset(far, 0x11, N * 4)
        ge.launch(s)
        s.synchronize()
        # the refusals changed nothing: the exec still fills a, then clears it; far is untouched
        assert (_read(a) == 0.0).all() and (srt.read(far, (N * 4,), np.uint8) == 0x11).all()
        ge.destroy()
    finally:
        srt.free(far)


def test_graph_exec_update_takes_the_new_event_of_a_record_node(s, bufs, gate):
    a, _, _ = bufs

    def graph(event):
        g = srt.Graph()
        k = g.add_kernel_node(fill_kernel, a, N, 1.0)
        g.add_event_record_node(event, deps=k)
        return g

    old, new = srt.Event(), srt.Event()
    ge = graph(old).instantiate()
    ge.update(graph(new))
    hold = gate(s)
    ge.launch(s)
    # recorded by this launch, behind the gate (an event never recorded reads as complete)
    assert not new.query()
    assert old.query()  # the replaced event is not recorded any more
    hold.open()
    new.synchronize()
    assert (_read(a) == 1.0).all()


def test_graph_exec_update_node_type_changed(bufs):
    a, b, _ = bufs
    ge = _chain(a, b).instantiate()
    g = srt.Graph()
    k1 = g.add_kernel_node(fill_kernel, a, N, 1.0)
    m = g.add_memset_node(a, 0, 4, deps=k1)  # was a kernel
    g.add_memcpy_node(b, a, N * 4, deps=m)
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge.update(g)
    assert ei.value.result is R.NODE_TYPE_CHANGED and ei.value.node is m


def test_graph_exec_update_copy_direction_changed(bufs):
    a, b, _ = bufs
    ge = _chain(a, b).instantiate()
    g = srt.Graph()
    k1 = g.add_kernel_node(fill_kernel, a, N, 1.0)
    k2 = g.add_kernel_node(add_one_kernel, a, N, deps=k1)
    cp = g.add_memcpy_node(np.zeros(N, np.float32), a, N * 4, deps=k2)  # now device -> host
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge.update(g)
    assert ei.value.result is R.PARAMETERS_CHANGED and ei.value.node is cp


def test_graph_exec_update_memory_nodes_not_supported(bufs):
    a, _, _ = bufs

    def graph(nbytes):
        g = srt.Graph()
        al = g.add_mem_alloc_node(nbytes)
        k = g.add_kernel_node(fill_kernel, al.ptr, N, 1.0, deps=al)
        g.add_mem_free_node(al.ptr, deps=k)
        return g

    base = graph(N * 4)
    ge = base.instantiate()
    other = graph(N * 8)  # another allocation (and size)
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge.update(other)
    assert ei.value.result is R.NOT_SUPPORTED and ei.value.node is other.nodes()[0]
    # the same allocation, but the free node changes to another allocation's address
    g = srt.Graph()
    al = g.add_mem_alloc_node(N * 4)
    g.add_mem_free_node(al.ptr, deps=al)
    ge2 = g.instantiate()
    h = srt.Graph()
    al2 = h.add_mem_alloc_node(N * 4)
    f = h.add_mem_free_node(al.ptr, deps=al2)
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge2.update(h)
    assert ei.value.result is R.NOT_SUPPORTED and ei.value.node in (al2, f)
    ge.destroy()
    ge2.destroy()


def test_graph_exec_update_of_clone_with_same_memory_nodes_accepted(s, bufs):
    a, _, _ = bufs
    g = srt.Graph()
    al = g.add_mem_alloc_node(N * 4)
    k = g.add_kernel_node(fill_kernel, al.ptr, N, 1.0, deps=al)
    cp = g.add_memcpy_node(a, al.ptr, N * 4, deps=k)
    g.add_mem_free_node(al.ptr, deps=cp)
    ge = g.instantiate()
    ge.set_kernel_node_params(k, al.ptr, N, 4.0)
    ge.launch(s)
    s.synchronize()
    assert (_read(a) == 4.0).all()
    c = g.clone()
    with pytest.raises(srt.InvalidValueError):  # a clone's node is not a node of this exec
        ge.set_kernel_node_params(c.find_in_clone(k), al.ptr, N, 2.0)
    ge.update(c)  # the clone's params (fill 1.0) with the very same memory nodes: accepted
    ge.launch(s)
    s.synchronize()
    assert (_read(a) == 1.0).all()


def test_graph_exec_update_refused_leaves_exec_unchanged(s, bufs):
    a, b, _ = bufs
    ge = _chain(a, b).instantiate()
    bad = srt.Graph()
    bad.add_kernel_node(fill_kernel, a, N, 9.0)
    with pytest.raises(srt.GraphExecUpdateError):
        ge.update(bad)
    ge.launch(s)
    s.synchronize()
    assert (_read(b) == 2.0).all()
    with pytest.raises(srt.InvalidTypeError):
        ge.update("graph")


def test_graph_exec_update_child_graph(s, bufs):
    a, _, _ = bufs

    def parent(value, extra=False):
        child = srt.Graph()
        k = child.add_kernel_node(fill_kernel, a, N, value)
        if extra:
            child.add_empty_node(deps=k)
        p = srt.Graph()
        p.add_child_graph_node(child)
        return p

    original = parent(1.0)
    ge = original.instantiate()
    ge.update(parent(8.0))
    ge.launch(s)
    s.synchronize()
    assert (_read(a) == 8.0).all()
    # the update reached the exec's own copy of the child graph, not the user's graph
    inner = original.nodes()[0].params["graph"]
    assert inner.nodes()[0].params["args"] == (a, N, 1.0)
    original.instantiate().launch(s)
    s.synchronize()
    assert (_read(a) == 1.0).all()
    bad = parent(2.0, extra=True)
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge.update(bad)
    assert ei.value.result is R.TOPOLOGY_CHANGED and ei.value.node is bad.nodes()[0]


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



@srt.kernel
def trace_kernel(ctx, log, tag):
    """Logs its start and end; the sleep between (0-1 ms, GIL released) outlasts the hand-over of
    a chain to a pool thread, so a node started too early overlaps the node it should wait for."""
    log.append(("start", tag))
    time.sleep(random.random() * 1e-3)
    log.append(("end", tag))


@st.composite
def dags(draw):
    """A random graph spec: per top-level node ``(deps, child, disabled)``; ``child`` is None for a
    kernel node, else the dependency lists of a child graph's kernel nodes."""

    def deps_of(i, most):
        return sorted(draw(st.sets(st.integers(0, i - 1), max_size=most))) if i else []

    spec = []
    for i in range(draw(st.integers(1, 10))):
        child = None
        if draw(st.integers(0, 2)) == 0:  # few edges inside: children with parallel ends
            child = [deps_of(j, 1) for j in range(draw(st.integers(1, 5)))]
        spec.append((deps_of(i, 3), child, child is None and draw(st.booleans())))
    return spec


def _ancestors(deps_lists):
    anc = []
    for deps in deps_lists:  # deps always point to earlier nodes
        acc = set()
        for d in deps:
            acc |= anc[d] | {d}
        anc.append(acc)
    return anc


@settings(max_examples=150, deadline=None)
@given(dags())
def test_graph_exec_schedule_respects_every_edge(spec):
    # Random DAGs of kernel nodes and child graphs, some kernel nodes disabled, replayed on two
    # streams under delay injection: every node ends before any node that depends on it, directly,
    # through a child graph's entry or exit, or through a disabled node, starts; a disabled node
    # does not run, and only top-level nodes are disabled (a child's node of the same index runs).
    dev = srt.Device("cpu:0")
    log = []
    g = srt.Graph()
    nodes, tags = [], []  # per top-level node: its Node, and the tags of the kernels it runs
    pairs = []  # (tag, tag): the first must end before the second starts
    tag = 0
    for deps, child, _ in spec:
        if child is None:
            nodes.append(g.add_kernel_node(trace_kernel, log, tag, deps=[nodes[d] for d in deps]))
            tags.append([tag])
            tag += 1
            continue
        sub = srt.Graph()
        inner = []
        for cdeps in child:
            inner.append(sub.add_kernel_node(trace_kernel, log, tag, deps=[inner[d] for d in cdeps]))
            tag += 1
        first = tag - len(child)
        for j, anc in enumerate(_ancestors(child)):
            pairs += [(first + a, first + j) for a in anc]
        nodes.append(g.add_child_graph_node(sub, deps=[nodes[d] for d in deps]))
        tags.append(list(range(first, tag)))
    for i, anc in enumerate(_ancestors([deps for deps, _, _ in spec])):
        pairs += [(x, y) for a in anc for x in tags[a] for y in tags[i]]
    off = {tags[i][0] for i, (_, _, disabled) in enumerate(spec) if disabled}
    ge = g.instantiate()
    for i, (_, _, disabled) in enumerate(spec):
        if disabled:
            ge.set_node_enabled(nodes[i], False)
    streams = [srt.Stream(dev, non_blocking=True) for _ in range(2)]
    prev = set_delays(50)
    try:
        for stream in streams:
            log.clear()
            ge.launch(stream)
            stream.synchronize()
            at = {entry: k for k, entry in enumerate(log)}
            assert len(at) == len(log) == 2 * (tag - len(off))
            assert all(("start", t) in at for t in range(tag) if t not in off)
            for x, y in pairs:
                if x not in off and y not in off:
                    assert at[("end", x)] < at[("start", y)], (x, y, log)
    finally:
        restore_delays(prev)
        ge.destroy()
        for stream in streams:
            stream.destroy()

# -- event nodes ---------------------------------------------------------------------------------------
def test_graph_exec_event_record_node_marks_graph_work(s, s2, bufs, gate):
    a, b, _ = bufs
    ev = srt.Event()
    g = srt.Graph()
    k = g.add_kernel_node(fill_kernel, a, N, 4.0)
    g.add_event_record_node(ev, deps=k)
    ge = g.instantiate()
    hold = gate(s)
    ge.launch(s)
    assert not ev.query()  # recorded at the launch, behind the gate
    s2.wait(ev)
    s2.launch(copy_kernel, b, a, N)
    hold.open()
    s2.synchronize()
    assert ev.query() and (_read(b) == 4.0).all()


def test_graph_exec_event_wait_node_orders_after_other_stream(s, s2, bufs, gate):
    a, b, _ = bufs
    hold = gate(s2)
    s2.launch(fill_kernel, a, N, 6.0)
    ev = s2.record()
    done = threading.Event()
    g = srt.Graph()
    w = g.add_event_wait_node(ev)
    g.add_kernel_node(copy_kernel, b, a, N, deps=w)
    g.add_host_node(done.set, deps=g.nodes()[1])
    g.instantiate().launch(s)
    assert not done.wait(timeout=WINDOW)  # the graph waits for s2's gate
    hold.open()
    s.synchronize()
    assert (_read(b) == 6.0).all()


def test_graph_exec_event_nodes_inside_child_graph(s, s2, bufs, gate):
    a, b, _ = bufs
    # a wait node in a child graph: the graph waits for s2
    hold = gate(s2)
    s2.launch(fill_kernel, a, N, 2.0)
    ready = s2.record()
    done = threading.Event()
    child = srt.Graph()
    w = child.add_event_wait_node(ready)
    c = child.add_kernel_node(copy_kernel, b, a, N, deps=w)
    recorded = srt.Event()
    child.add_event_record_node(recorded, deps=c)
    parent = srt.Graph()
    cg = parent.add_child_graph_node(child)
    parent.add_host_node(done.set, deps=cg)
    parent.instantiate().launch(s)
    assert not recorded.query()  # a record node in a child graph marks the launch
    assert not done.wait(timeout=WINDOW)
    hold.open()
    recorded.synchronize()
    assert (_read(b) == 2.0).all()


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
