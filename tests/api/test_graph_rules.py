"""API.md §5 (explicit graphs, exec, update) and DESIGN.md §3 graph memory, §5 exec update; seed 002."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt

from .conftest import Gate, add_one, fill, scale, sync

pytestmark = [pytest.mark.api, pytest.mark.timeout(60)]


N = 1024


@srt.kernel
def foo(ctx, p, n):
    x = ctx.array(p, (n,), np.float32)
    x *= 2.0


bar = add_one      # seed 002's bar: x += 1


@pytest.fixture
def bufs(dev):
    """Three zeroed buffers of N floats: src, dst, other."""
    src, dst, other = (srt.malloc(N * 4) for _ in range(3))
    for p in (src, dst, other):
        srt.write(p, np.zeros(N, np.float32))
    yield src, dst, other
    for p in (src, dst, other):
        srt.free(p)


def rd(p, n=N):
    return srt.read(p, (n,), np.float32)


def put(value, *ptrs):
    for p in ptrs:
        srt.write(p, np.full(N, value, np.float32))


def run(graph, times=1, s=None):
    """Instantiate graph (or take a GraphExec), launch it times on s (a new non-blocking stream
    by default) and synchronize; returns (exec, stream)."""
    ge = graph.instantiate() if isinstance(graph, srt.Graph) else graph
    s = s if s is not None else srt.Stream(non_blocking=True)
    for _ in range(times):
        ge.launch(s)
    sync(s)
    return ge, s


def test_graph_seed002_capture_vs_explicit(bufs):
    src, dst, _ = bufs
    s = srt.Stream(non_blocking=True)
    srt.write(src, np.ones(N, np.float32))
    s.begin_capture(srt.CaptureMode.THREAD_LOCAL)
    s.launch(foo, src, N, grid=N // 256, block=256)
    s.memcpy(dst, src, N * 4)
    s.launch(bar, dst, N, grid=N // 256, block=256)
    g = s.end_capture()
    types = [nd.type for nd in g.nodes()]
    assert types == [srt.NodeType.KERNEL, srt.NodeType.MEMCPY, srt.NodeType.KERNEL]
    n0, n1, n2 = g.nodes()
    assert g.edges() == [(n0, n1), (n1, n2)]
    assert g.root_nodes() == [n0]
    assert n1.dependencies == (n0,) and n1.dependents == (n2,)
    ge, _ = run(g, s=s)
    assert (rd(src) == 2).all() and (rd(dst) == 3).all()
    # explicit construction, the same program
    srt.write(src, np.ones(N, np.float32))
    g2 = srt.Graph()
    a = g2.add_kernel_node(foo, src, N, grid=N // 256, block=256)
    c = g2.add_memcpy_node(dst, src, N * 4, deps=[a])
    b = g2.add_kernel_node(bar, dst, N, grid=N // 256, block=256, deps=[c])
    assert b.type == srt.NodeType.KERNEL and c.type == srt.NodeType.MEMCPY
    ge2, _ = run(g2, s=s)
    assert (rd(src) == 2).all() and (rd(dst) == 3).all()
    ge.destroy()
    ge2.destroy()


def test_graph_readme_flow(bufs):
    src, dst, other = bufs
    put(1, src)
    g2 = srt.Graph()
    a = g2.add_kernel_node(scale, src, N, 2.0)
    c = g2.add_memcpy_node(dst, src, N * 4, deps=[a])
    b = g2.add_kernel_node(scale, dst, N, 0.5, deps=[c])
    ge, s = run(g2, 3)
    assert (rd(src) == 8).all() and (rd(dst) == 4).all()
    ge.set_kernel_node_params(b, other, N, 0.5)
    put(4, other)
    run(ge, s=s)
    assert (rd(other) == 2).all() and (rd(dst) == 16).all()
    ge.update(g2.clone())     # same topology: accepted, restores original params
    run(ge, s=s)
    assert (rd(dst) == 16).all() and (rd(other) == 2).all()
    dot = g2.to_dot()
    assert isinstance(dot, str) and "digraph" in dot


def test_graph_to_dot_path(tmp_path):
    g = srt.Graph()
    g.add_empty_node()
    p = tmp_path / "g.dot"
    txt = g.to_dot(str(p))
    assert p.read_text() == txt or "digraph" in p.read_text()


def test_graph_dependencies_add_remove():
    g = srt.Graph()
    a, b, c, d = (g.add_empty_node() for _ in range(4))
    assert g.root_nodes() == [a, b, c, d] and g.edges() == []
    g.add_dependencies(a, b)
    g.add_dependencies([a, b], [c, d])
    assert g.edges() == [(a, b), (a, c), (b, d)] or set(g.edges()) == {(a, b), (a, c), (b, d)}
    assert g.root_nodes() == [a]
    assert set(a.dependents) == {b, c}
    g.remove_dependencies(a, c)
    assert set(g.edges()) == {(a, b), (b, d)}
    assert c in g.root_nodes()
    with pytest.raises(srt.StreamRTError):
        g.add_dependencies([a, b], [c])     # unequal lengths
    with pytest.raises(srt.StreamRTError):
        g.remove_dependencies(c, d)         # no such edge


def test_graph_node_order_is_dependency_not_insertion(dev):
    log = []
    g = srt.Graph()
    second = g.add_host_node(log.append, "second")
    first = g.add_host_node(log.append, "first")
    g.add_dependencies(first, second)
    run(g, 5)
    assert log == ["first", "second"] * 5


def test_graph_clone_and_find_in_clone():
    g = srt.Graph()
    a = g.add_empty_node()
    b = g.add_empty_node(deps=[a])
    c = g.clone()
    ca, cb = c.find_in_clone(a), c.find_in_clone(b)
    assert ca is not a and cb.dependencies == (ca,)
    assert [n.type for n in c.nodes()] == [srt.NodeType.EMPTY] * 2
    c.add_empty_node(deps=[cb])
    assert len(g.nodes()) == 2
    with pytest.raises(srt.StreamRTError):
        g.find_in_clone(a)  # g is not a clone of g


def test_graph_child_graph_is_cloned(bufs):
    src = bufs[0]
    put(1, src)
    child = srt.Graph()
    child.add_kernel_node(add_one, src, N)
    n = (g := srt.Graph()).add_child_graph_node(child)
    assert n.type == srt.NodeType.GRAPH
    child.add_kernel_node(add_one, src, N)   # after adding: not seen by the parent
    run(g)
    assert (rd(src) == 2).all()


def test_graph_memset_host_params(bufs):
    p = bufs[0]
    log = []
    g = srt.Graph()
    m = g.add_memset_node(p, 1, N * 4)
    h = g.add_host_node(log.append, "a", deps=[m])
    assert m.type == srt.NodeType.MEMSET and h.type == srt.NodeType.HOST
    ge, s = run(g)
    assert (srt.read(p, (N * 4,), np.uint8) == 1).all() and log == ["a"]
    ge.set_memset_node_params(m, p, 7, 16)
    ge.set_host_node_params(h, log.append, "b")
    run(ge, s=s)
    got = srt.read(p, (N * 4,), np.uint8)
    assert (got[:16] == 7).all() and (got[16:] == 1).all() and log == ["a", "b"]


def test_graph_set_memcpy_params(bufs):
    src, dst, other = bufs
    put(3, src)
    put(9, other)
    g = srt.Graph()
    c = g.add_memcpy_node(dst, src, N * 4)
    ge = g.instantiate()
    ge.set_memcpy_node_params(c, dst, other, N * 4)
    run(ge)
    assert (rd(dst) == 9).all()


def test_graph_params_apply_to_later_launches_only(bufs):
    src, _, other = bufs
    g = srt.Graph()
    gate = Gate()
    g.add_host_node(gate._wait)
    k = g.add_kernel_node(fill, src, N, 1.0)
    g.add_dependencies(g.nodes()[0], k)
    ge = g.instantiate()
    s = srt.Stream(non_blocking=True)
    ge.launch(s)                                  # held at the host node
    ge.set_kernel_node_params(k, other, N, 5.0)   # must not affect the queued launch
    gate.open()
    sync(s)
    assert (rd(src) == 1).all() and (rd(other) == 0).all()
    run(ge, s=s)
    assert (rd(other) == 5).all()


def test_graph_set_node_enabled(bufs):
    src = bufs[0]
    g = srt.Graph()
    a = g.add_kernel_node(add_one, src, N)
    g.add_kernel_node(add_one, src, N, deps=[a])
    ge = g.instantiate()
    ge.set_node_enabled(a, False)
    _, s = run(ge)
    assert (rd(src) == 1).all()
    ge.set_node_enabled(a, True)
    run(ge, s=s)
    assert (rd(src) == 3).all()


def test_graph_launches_of_one_exec_never_overlap(dev, delay):
    state = {"active": 0, "max": 0}
    lock = threading.Lock()

    def enter():
        with lock:
            state["active"] += 1
            state["max"] = max(state["max"], state["active"])

    def leave():
        with lock:
            state["active"] -= 1

    g = srt.Graph()
    a = g.add_host_node(enter)
    b = g.add_empty_node(deps=[a])
    g.add_host_node(leave, deps=[b])
    ge = g.instantiate()
    streams = [srt.Stream(non_blocking=True) for _ in range(3)]
    for _ in range(10):
        for st in streams:
            ge.launch(st)
    for st in streams:
        sync(st)
    assert state["max"] == 1 and state["active"] == 0


def test_graph_launch_is_stream_ordered(bufs):
    src = bufs[0]
    g = srt.Graph()
    g.add_kernel_node(add_one, src, N)
    ge = g.instantiate()
    s = srt.Stream(non_blocking=True)
    gate = Gate()
    gate.hold(s)
    ge.launch(s)
    s.launch(scale, src, N, 10.0)
    ge.upload(s)
    assert not s.query()
    gate.open()
    sync(s)
    assert (rd(src) == 10).all()


def test_graph_independent_branches_both_run(bufs):
    src, dst, _ = bufs
    g = srt.Graph()
    root = g.add_empty_node()
    g.add_kernel_node(fill, src, N, 1.0, deps=[root])
    g.add_kernel_node(fill, dst, N, 2.0, deps=[root])
    run(g)
    assert (rd(src) == 1).all() and (rd(dst) == 2).all()


def test_graph_event_nodes(dev):
    e_in, e_out = srt.Event(), srt.Event()
    other = srt.Stream(non_blocking=True)
    gate = Gate()
    log = []
    gate.hold(other)
    other.launch_host_func(log.append, "before")
    other.record(e_in)
    g = srt.Graph()
    w = g.add_event_wait_node(e_in)
    h = g.add_host_node(log.append, "graph", deps=[w])
    r = g.add_event_record_node(e_out, deps=[h])
    assert w.type == srt.NodeType.WAIT_EVENT and r.type == srt.NodeType.EVENT_RECORD
    ge = g.instantiate()
    s = srt.Stream(non_blocking=True)
    ge.launch(s)
    after = srt.Stream(non_blocking=True)
    after.wait(e_out)
    after.launch_host_func(log.append, "after")
    gate.open()
    sync(after)
    sync(s)
    assert log == ["before", "graph", "after"]


def test_graph_mem_alloc_free_nodes(dev):
    g = srt.Graph()
    al = g.add_mem_alloc_node(N * 4)
    assert al.type == srt.NodeType.MEM_ALLOC and isinstance(al.ptr, int)
    k = g.add_kernel_node(fill, al.ptr, N, 3.0, deps=[al])
    out = srt.malloc(N * 4)
    c = g.add_memcpy_node(out, al.ptr, N * 4, deps=[k])
    fr = g.add_mem_free_node(al.ptr, deps=[c])
    assert fr.type == srt.NodeType.MEM_FREE
    ge, _ = run(g, 3)       # freed inside the graph: relaunch is fine
    assert (rd(out) == 3).all()
    ge.destroy()
    srt.free(out)


def test_graph_mem_alloc_unfreed_relaunch(dev):
    g = srt.Graph()
    al = g.add_mem_alloc_node(4096)
    g.add_memset_node(al.ptr, 5, 4096, deps=[al])
    ge, s = run(g)
    assert (srt.read(al.ptr, (4096,), np.uint8) == 5).all()   # valid after the launch
    with pytest.raises(srt.StreamRTError):
        ge.launch(s)
    s.free(al.ptr)
    sync(s)
    ge.launch(s)          # freed outside: relaunch legal
    s.free(al.ptr)
    sync(s)
    ge.destroy()   # CUDA: one live exec per graph with memory nodes
    ge2 = g.instantiate(auto_free_on_launch=True)
    ge2.launch(s)
    ge2.launch(s)
    s.free(al.ptr)
    sync(s)


def test_graph_memory_shared_between_non_overlapping(dev):
    g = srt.Graph()
    a = g.add_mem_alloc_node(4 << 20)
    fa = g.add_mem_free_node(a.ptr, deps=[g.add_memset_node(a.ptr, 1, 4 << 20, deps=[a])])
    b = g.add_mem_alloc_node(4 << 20, deps=[fa])
    g.add_mem_free_node(b.ptr, deps=[g.add_memset_node(b.ptr, 2, 4 << 20, deps=[b])])
    ge = g.instantiate()
    if hasattr(ge, "memory_footprint"):
        assert ge.memory_footprint < 8 << 20
    run(ge)


# ---- exec update (DESIGN §5) ---------------------------------------------------------------

def _chain(p, k1=add_one, extra=False):
    g = srt.Graph()
    a = g.add_kernel_node(k1, p, N)
    b = g.add_memset_node(p, 0, 16, deps=[a])
    if extra:
        g.add_empty_node(deps=[b])
    return g


def _kernels(p, chained):
    g = srt.Graph()
    a = g.add_kernel_node(add_one, p, N)
    g.add_kernel_node(add_one, p, N, deps=[a] if chained else ())
    return g


def _one_node(add):
    g = srt.Graph()
    add(g)
    return g


def _mem_nodes(nbytes):
    g = srt.Graph()
    a = g.add_mem_alloc_node(nbytes)
    g.add_mem_free_node(a.ptr, deps=[a])
    return g


# Updates an exec refuses: id: (the exec's graph, the update's graph (both from the three
# buffers), the result, whether the error must name a node of either graph)
R = srt.GraphExecUpdateResult


UPDATE_REFUSED = {
    "topology_changed": (lambda b: _chain(b[0]), lambda b: _chain(b[0], extra=True),
                         R.TOPOLOGY_CHANGED, False),
    "edge_changed_is_topology": (lambda b: _kernels(b[0], True), lambda b: _kernels(b[0], False),
                                 R.TOPOLOGY_CHANGED, False),
    "node_type_changed": (lambda b: _one_node(lambda g: g.add_kernel_node(add_one, b[0], N)),
                          lambda b: _one_node(lambda g: g.add_memset_node(b[0], 0, 16)),
                          R.NODE_TYPE_CHANGED, True),
    "copy_direction_changed": (lambda b: _one_node(lambda g: g.add_memcpy_node(b[1], b[0], N * 4)),
                               lambda b: _one_node(lambda g: g.add_memcpy_node(
                                   np.zeros(N, np.float32), b[0], N * 4)),
                               R.PARAMETERS_CHANGED, False),
    "mem_nodes_not_supported": (lambda b: _mem_nodes(4096), lambda b: _mem_nodes(8192),
                                R.NOT_SUPPORTED, False),
}


@pytest.mark.parametrize("make_g, make_h, result, names_node", UPDATE_REFUSED.values(),
                         ids=UPDATE_REFUSED.keys())
def test_exec_update_refused(bufs, make_g, make_h, result, names_node):
    g, h = make_g(bufs), make_h(bufs)
    ge = g.instantiate()
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge.update(h)
    assert ei.value.result == result
    assert ei.value.code == 910
    if names_node:
        assert ei.value.node is not None
        assert ei.value.node is h.nodes()[0] or ei.value.node is g.nodes()[0]


def test_exec_update_kernel_function_change_allowed(bufs):
    p = bufs[0]
    put(1, p)
    ge = _chain(p, add_one).instantiate()
    ge.update(_chain(p, foo))
    run(ge)
    got = rd(p)
    assert (got[4:] == 2).all() and (got[:4] == 0).all()


def test_exec_update_refused_leaves_exec_working(bufs):
    p = bufs[0]
    ge = _chain(p).instantiate()
    with pytest.raises(srt.GraphExecUpdateError):
        ge.update(_chain(p, extra=True))
    run(ge)
    assert (rd(p)[4:] == 1).all()


def test_exec_update_result_enum_has_members():
    for m in ("TOPOLOGY_CHANGED", "NODE_TYPE_CHANGED", "FUNCTION_CHANGED", "PARAMETERS_CHANGED",
              "NOT_SUPPORTED"):
        assert hasattr(srt.GraphExecUpdateResult, m)
    for m in ("KERNEL", "MEMCPY", "MEMSET", "HOST", "GRAPH", "EMPTY", "WAIT_EVENT", "EVENT_RECORD",
              "MEM_ALLOC", "MEM_FREE"):
        assert hasattr(srt.NodeType, m)


def test_graph_replay_equals_eager(dev):
    rng = np.random.default_rng(5)
    init = rng.random(N, dtype=np.float32)
    p = srt.malloc(N * 4)
    s = srt.Stream(non_blocking=True)
    ops_seq = [(scale, 1.5), (add_one, None), (scale, 0.25), (add_one, None)]

    def enqueue(st):
        for k, f in ops_seq:
            st.launch(k, p, N, *(() if f is None else (f,)))

    srt.write(p, init)
    enqueue(s)
    sync(s)
    eager = rd(p)
    srt.write(p, init)
    s.begin_capture()
    enqueue(s)
    run(s.end_capture(), s=s)
    assert np.array_equal(rd(p), eager)
    srt.free(p)


def test_graph_exec_update_error_node_and_kernel_params(dev):
    g = srt.Graph()
    p = srt.malloc(64)
    k = g.add_kernel_node(fill, p, 16, 1.0, grid=2, block=8)
    assert k.params is not None
    ge = g.instantiate()
    h = srt.Graph()
    h.add_empty_node()
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge.update(h)
    assert ei.value.node is not None
    assert isinstance(ei.value, srt.StreamRTError)
    ge.destroy()
    srt.free(p)
