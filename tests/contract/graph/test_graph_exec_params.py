"""Per-node parameter updates of an executable graph (kernel, host, memcpy, memset) and enable/disable:
later launches only, in place in the backend graph, refusals."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt
from tests.conftest import PY_KERNELS, add_one_kernel, cpu_only, fill_kernel
from tests.conftest import read_f32 as _read
from tests.contract.backend_kernels import _dev_f32, add_one
from tests.contract.graph.exec_kernels import log_kernel, scale_kernel, wait_kernel

N = 16


WINDOW = 0.25  # seconds a correct runtime keeps something blocked; only a failing one is faster


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
        ge.set_kernel_node_params(srt.Graph().add_kernel_node(fill_kernel, a, N, 1.0), a, N, 1.0)
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


def test_backend_explicit_graph_nodes_and_updates(bdev):
    s = srt.Stream(bdev, non_blocking=True)
    n = 256
    a, b = _dev_f32(bdev, np.zeros(n)), _dev_f32(bdev, np.zeros(n))
    seen: list[str] = []
    g = srt.Graph()
    fill = g.add_memset_node(a, 0, 4 * n)
    inc = g.add_kernel_node(add_one, a, n, grid=1, block=256, deps=(fill,))
    cp = g.add_memcpy_node(b, a, 4 * n, deps=(inc,))
    g.add_host_node(seen.append, "host", deps=(cp,))
    ge = g.instantiate()
    ge.launch(s)
    s.synchronize()
    assert seen == ["host"]
    assert np.array_equal(srt.read(b, (n,), np.float32), np.ones(n, np.float32))
    ge.set_kernel_node_params(inc, b, n, grid=1, block=256)  # now increments b, later launches only
    ge.launch(s)
    s.synchronize()
    assert np.array_equal(srt.read(a, (n,), np.float32), np.zeros(n, np.float32))
    assert np.array_equal(srt.read(b, (n,), np.float32), np.zeros(n, np.float32))  # copied after
    ge.set_node_enabled(cp, False)
    ge.launch(s)
    s.synchronize()
    assert np.array_equal(srt.read(b, (n,), np.float32), np.ones(n, np.float32))  # no copy: +1 stays
    assert seen == ["host"] * 3
    ge.destroy()
    for p in (a, b):
        srt.free(p)
