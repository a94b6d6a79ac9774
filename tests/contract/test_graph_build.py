"""Explicit graph construction: nodes, edges, queries, cycles, clone, child graphs, DOT, bad params."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt
from tests.conftest import add_one_kernel, fill_kernel
from tests.conftest import read_f32 as _read

N = 16


def test_graph_nodes_roots_edges_in_creation_order(buf):
    g = srt.Graph()
    a = g.add_empty_node()
    b = g.add_kernel_node(fill_kernel, buf, N, 1.0)
    c = g.add_kernel_node(add_one_kernel, buf, N, deps=[b, a])
    d = g.add_host_node(print, deps=a)
    e = g.add_memset_node(buf, 0, 4)
    assert g.nodes() == [a, b, c, d, e]
    assert g.root_nodes() == [a, b, e]
    # ordered by the destination's creation, then by dependency order
    assert g.edges() == [(b, c), (a, c), (a, d)]
    assert c.dependencies == (b, a) and a.dependents == (c, d)
    assert isinstance(c.dependencies, tuple) and isinstance(a.dependents, tuple)
    assert e.dependencies == () and e.dependents == ()


def test_graph_node_types_and_params(buf, dev):
    g = srt.Graph()
    host = np.zeros(N, np.float32)
    ev = srt.Event(dev)
    child = srt.Graph()
    child.add_empty_node()
    nodes = {
        srt.NodeType.KERNEL: g.add_kernel_node(fill_kernel, buf, N, 2.0, grid=(2, 3), block=4),
        srt.NodeType.MEMCPY: g.add_memcpy_node(host, buf, N * 4),
        srt.NodeType.MEMSET: g.add_memset_node(buf, 7, 8),
        srt.NodeType.HOST: g.add_host_node(print, "x"),
        srt.NodeType.GRAPH: g.add_child_graph_node(child),
        srt.NodeType.EMPTY: g.add_empty_node(),
        srt.NodeType.EVENT_RECORD: g.add_event_record_node(ev),
        srt.NodeType.WAIT_EVENT: g.add_event_wait_node(ev),
        srt.NodeType.MEM_ALLOC: g.add_mem_alloc_node(100),
    }
    nodes[srt.NodeType.MEM_FREE] = g.add_mem_free_node(nodes[srt.NodeType.MEM_ALLOC].ptr,
                                                       deps=nodes[srt.NodeType.MEM_ALLOC])
    for t, n in nodes.items():
        assert n.type is t
    k = nodes[srt.NodeType.KERNEL].params
    assert k["kernel"] is fill_kernel and k["args"] == (buf, N, 2.0)
    assert tuple(k["grid"]) == (2, 3, 1) and tuple(k["block"]) == (4, 1, 1)
    m = nodes[srt.NodeType.MEMCPY].params
    assert m["dst"] is host and m["src"] == buf and m["nbytes"] == N * 4
    assert dict(nodes[srt.NodeType.MEMSET].params) == {"ptr": buf, "value": 7, "nbytes": 8}
    assert nodes[srt.NodeType.HOST].params["fn"] is print
    assert nodes[srt.NodeType.HOST].params["args"] == ("x",)
    assert nodes[srt.NodeType.EVENT_RECORD].params["event"] is ev
    alloc = nodes[srt.NodeType.MEM_ALLOC]
    assert alloc.params["nbytes"] == 100 and alloc.params["ptr"] == alloc.ptr
    assert nodes[srt.NodeType.MEM_FREE].params["ptr"] == alloc.ptr
    with pytest.raises(TypeError):  # a read-only view: params change through the exec only
        k["args"] = ()
    with pytest.raises(srt.InvalidValueError):
        _ = nodes[srt.NodeType.EMPTY].ptr  # only MEM_ALLOC nodes have an address


def test_graph_duplicate_deps_collapse_to_one_edge():
    g = srt.Graph()
    a = g.add_empty_node()
    b = g.add_empty_node(deps=[a, a])
    assert b.dependencies == (a,) and g.edges() == [(a, b)]


def test_graph_add_and_remove_dependencies():
    g = srt.Graph()
    a, b, c = g.add_empty_node(), g.add_empty_node(), g.add_empty_node()
    g.add_dependencies([a, a], [b, c])
    assert g.edges() == [(a, b), (a, c)] and g.root_nodes() == [a]
    g.add_dependencies(b, c)
    assert c.dependencies == (a, b)
    g.remove_dependencies(a, c)
    assert c.dependencies == (b,) and a.dependents == (b,)
    with pytest.raises(srt.InvalidValueError, match="no edge"):
        g.remove_dependencies(a, c)
    with pytest.raises(srt.InvalidValueError, match="already exists"):
        g.add_dependencies(a, b)
    with pytest.raises(srt.InvalidValueError, match="equal lengths"):
        g.add_dependencies([a, b], [c])


def test_graph_dependency_batches_with_a_repeated_edge_refused():
    """A batch listing one edge twice is refused whole and changes nothing.

    The story: each edge passed the per-edge checks on its own, so ``add_dependencies([a, a],
    [b, b])`` added a -> b twice, and ``remove_dependencies`` of such a batch removed the first
    copy and then failed half-way with a bare ValueError, leaving the graph changed.
    """
    g = srt.Graph()
    a, b = g.add_empty_node(), g.add_empty_node()
    with pytest.raises(srt.InvalidValueError, match="more than once"):
        g.add_dependencies([a, a], [b, b])
    assert g.edges() == []
    g.add_dependencies(a, b)
    with pytest.raises(srt.InvalidValueError, match="more than once"):
        g.remove_dependencies([a, a], [b, b])
    assert g.edges() == [(a, b)]


def test_graph_add_dependencies_refuses_cycles():
    g = srt.Graph()
    a = g.add_empty_node()
    b = g.add_empty_node(deps=a)
    c = g.add_empty_node(deps=b)
    with pytest.raises(srt.InvalidValueError, match="cycle"):
        g.add_dependencies(c, a)
    with pytest.raises(srt.InvalidValueError, match="cycle"):
        g.add_dependencies(a, a)
    assert g.edges() == [(a, b), (b, c)]


def test_graph_add_dependencies_cycle_is_all_or_nothing():
    g = srt.Graph()
    a, b, c, d = (g.add_empty_node() for _ in range(4))
    before = g.edges()
    # the first two edges are fine on their own; the third closes a -> b -> c -> a
    with pytest.raises(srt.InvalidValueError, match="cycle"):
        g.add_dependencies([a, b, c], [b, c, a])
    assert g.edges() == before
    assert all(n.dependencies == () and n.dependents == () for n in (a, b, c, d))
    # a batch whose edges only form a cycle together is refused as well
    with pytest.raises(srt.InvalidValueError, match="cycle"):
        g.add_dependencies([c, d], [d, c])
    assert g.edges() == before
    # a refused batch whose bad edge comes first also leaves nothing behind
    g.add_dependencies(a, b)
    with pytest.raises(srt.InvalidValueError):
        g.add_dependencies([b, c], [a, d])
    assert g.edges() == [(a, b)]


def test_graph_refuses_foreign_nodes():
    g, h = srt.Graph(), srt.Graph()
    a = g.add_empty_node()
    x = h.add_empty_node()
    with pytest.raises(srt.InvalidValueError, match="belongs to"):
        g.add_empty_node(deps=x)
    with pytest.raises(srt.InvalidValueError, match="belongs to"):
        g.add_dependencies(x, a)
    with pytest.raises(srt.InvalidValueError, match="belongs to"):
        g.add_dependencies(a, x)
    with pytest.raises(srt.InvalidValueError):
        g.remove_dependencies(x, a)
    with pytest.raises(srt.InvalidTypeError):
        g.add_empty_node(deps=[a, "node"])
    with pytest.raises(srt.InvalidTypeError):
        g.add_empty_node(deps=3)
    assert g.nodes() == [a] and a.dependents == ()


def test_graph_bad_params_refused(buf, dev):
    g = srt.Graph()
    cases = [
        (srt.InvalidTypeError, "kernel", lambda: g.add_kernel_node(print, buf)),
        (srt.InvalidValueError, "grid", lambda: g.add_kernel_node(fill_kernel, buf, N, 1.0, grid=0)),
        (srt.InvalidTypeError, "block", lambda: g.add_kernel_node(fill_kernel, buf, N, 1.0,
                                                                  block=1.5)),
        (srt.InvalidTypeError, "takes 3 argument", lambda: g.add_kernel_node(fill_kernel, buf)),
        (srt.InvalidValueError, ">= 0", lambda: g.add_memset_node(buf, 0, -1)),
        (srt.InvalidValueError, "0-255", lambda: g.add_memset_node(buf, 256, 4)),
        (srt.InvalidTypeError, "int", lambda: g.add_memset_node(buf, 1.0, 4)),
        (srt.InvalidAddressError, "leaves", lambda: g.add_memset_node(buf, 0, 1 << 20)),
        (srt.InvalidAddressError, "not inside", lambda: g.add_memcpy_node(8, buf, 4)),
        (srt.InvalidValueError, "holds", lambda: g.add_memcpy_node(np.zeros(2, np.uint8), buf, 4)),
        (srt.InvalidValueError, "read-only", lambda: g.add_memcpy_node(b"abcd", buf, 4)),
        (srt.InvalidTypeError, "callable", lambda: g.add_host_node(42)),
        (srt.InvalidTypeError, "Graph", lambda: g.add_child_graph_node("graph")),
        (srt.InvalidTypeError, "Event", lambda: g.add_event_record_node(None)),
        (srt.InvalidTypeError, "Event", lambda: g.add_event_wait_node(1)),
        (srt.InvalidTypeError, "int", lambda: g.add_mem_alloc_node(1.5)),
        (srt.InvalidValueError, "not graph memory", lambda: g.add_mem_free_node(buf)),
    ]
    for exc, words, call in cases:
        with pytest.raises(exc, match=words):
            call()
    assert g.nodes() == []  # nothing half-added
    dead = srt.Event(dev)
    dead.destroy()
    with pytest.raises(srt.InvalidHandleError):
        g.add_event_record_node(dead)
    with pytest.raises(srt.InvalidTypeError):
        g.instantiate(auto_free_on_launch=1)


def test_graph_explicit_edges_order_execution(s, buf):
    # two kernels with an edge run in edge order, whatever their creation order
    g = srt.Graph()
    inc = g.add_kernel_node(add_one_kernel, buf, N)
    fill = g.add_kernel_node(fill_kernel, buf, N, 5.0)
    g.add_dependencies(fill, inc)
    assert g.root_nodes() == [fill]
    ge = g.instantiate()
    ge.launch(s)
    s.synchronize()
    assert (_read(buf) == 6.0).all()


def test_graph_edge_orders_host_nodes(s):
    # b depends on a; a holds until b has started or a window passes. With the edge, b can
    # only start after a, so a always sees the window pass; without it, b would release a early.
    b_started = threading.Event()
    log = []

    def a():
        log.append(("a", b_started.wait(timeout=0.25)))

    def b():
        b_started.set()
        log.append(("b", None))

    g = srt.Graph()
    na = g.add_host_node(a)
    g.add_host_node(b, deps=na)
    g.instantiate().launch(s)
    s.synchronize()
    assert log == [("a", False), ("b", None)]


def test_graph_child_graph_is_cloned_when_added(s, buf):
    child = srt.Graph()
    child.add_kernel_node(add_one_kernel, buf, N)
    parent = srt.Graph()
    fill = parent.add_kernel_node(fill_kernel, buf, N, 1.0)
    node = parent.add_child_graph_node(child, deps=fill)
    inner = node.params["graph"]
    assert inner is not child and len(inner.nodes()) == 1
    # later edits of the original child do not reach the parent
    child.add_kernel_node(add_one_kernel, buf, N, deps=child.nodes()[0])
    assert len(inner.nodes()) == 1
    ge = parent.instantiate()
    ge.launch(s)
    s.synchronize()
    assert (_read(buf) == 2.0).all()
    # the edited child alone adds two
    child.instantiate().launch(s)
    s.synchronize()
    assert (_read(buf) == 4.0).all()


def test_graph_child_graph_nested_ordering(s, buf):
    # parent: fill -> child(add, add) -> child2(add); nested child graphs inline in order
    inner = srt.Graph()
    a = inner.add_kernel_node(add_one_kernel, buf, N)
    inner.add_kernel_node(add_one_kernel, buf, N, deps=a)
    outer = srt.Graph()
    outer.add_child_graph_node(inner)
    parent = srt.Graph()
    f = parent.add_kernel_node(fill_kernel, buf, N, 10.0)
    c = parent.add_child_graph_node(outer, deps=f)
    parent.add_kernel_node(add_one_kernel, buf, N, deps=c)
    ge = parent.instantiate()
    for _ in range(3):
        ge.launch(s)
    s.synchronize()
    assert (_read(buf) == 13.0).all()


def test_graph_child_graph_with_memory_nodes_refused():
    child = srt.Graph()
    child.add_mem_alloc_node(64)
    with pytest.raises(srt.InvalidValueError, match="memory"):
        srt.Graph().add_child_graph_node(child)


def test_graph_child_graph_node_graph_refuses_memory_nodes():
    # cudaGraphChildGraphNodeGetGraph: "Allocation and free nodes cannot be added to the returned
    # graph"; they were accepted, never mapped, and the launch failed late
    child = srt.Graph()
    parent = srt.Graph()
    node = parent.add_child_graph_node(child)
    elsewhere = srt.Graph().add_mem_alloc_node(64)
    for embedded in (node.params["graph"], parent.clone().nodes()[0].params["graph"]):
        with pytest.raises(srt.InvalidValueError, match="child graph"):
            embedded.add_mem_alloc_node(64)
        with pytest.raises(srt.InvalidValueError, match="child graph"):
            embedded.add_mem_free_node(elsewhere.ptr)
        assert embedded.nodes() == []
    child.add_mem_alloc_node(64)  # the graph passed in stays the caller's own
    embedded.clone().add_mem_alloc_node(64)  # and a clone of the embedded one is standalone


def test_graph_clone_is_independent_of_later_edits(buf):
    g = srt.Graph()
    a = g.add_kernel_node(fill_kernel, buf, N, 1.0)
    b = g.add_kernel_node(add_one_kernel, buf, N, deps=a)
    c = g.clone()
    ca, cb = c.find_in_clone(a), c.find_in_clone(b)
    assert c.nodes() == [ca, cb] and ca is not a and ca.graph is c
    assert cb.dependencies == (ca,) and ca.type is srt.NodeType.KERNEL
    assert dict(ca.params) == dict(a.params)
    # edit the original: the clone keeps its shape
    g.add_empty_node(deps=b)
    g.remove_dependencies(a, b)
    assert len(c.nodes()) == 2 and c.edges() == [(ca, cb)]
    # edit the clone: the original does not see it
    c.add_empty_node(deps=cb)
    assert len(g.nodes()) == 3 and b.dependents == (g.nodes()[2],)


def test_graph_clone_copies_child_graphs_too(buf):
    inner = srt.Graph()
    inner.add_kernel_node(fill_kernel, buf, N, 1.0)
    g = srt.Graph()
    node = g.add_child_graph_node(inner)
    c = g.clone()
    mine, theirs = node.params["graph"], c.find_in_clone(node).params["graph"]
    # a child graph shared between clones would let an exec's update (which edits its clone's
    # child nodes) reach the user's graph
    assert theirs is not mine and theirs.nodes()[0] is not mine.nodes()[0]
    assert dict(theirs.nodes()[0].params) == dict(mine.nodes()[0].params)
    theirs.add_empty_node()
    assert len(mine.nodes()) == 1


def test_graph_find_in_clone_refuses_foreign_nodes(buf):
    g = srt.Graph()
    a = g.add_empty_node()
    c = g.clone()
    other = srt.Graph().add_empty_node()
    with pytest.raises(srt.InvalidValueError):
        c.find_in_clone(other)
    with pytest.raises(srt.InvalidValueError):
        c.find_in_clone(c.nodes()[0])  # a node of the clone is not an original
    with pytest.raises(srt.InvalidValueError):
        g.find_in_clone(a)  # g is not a clone of itself
    late = g.add_empty_node()  # created after the clone
    with pytest.raises(srt.InvalidValueError):
        c.find_in_clone(late)
    with pytest.raises(srt.InvalidTypeError):
        c.find_in_clone("a")
    # a clone of the clone still maps the first original's nodes
    cc = c.clone()
    assert cc.find_in_clone(a) is cc.nodes()[0]
    assert cc.find_in_clone(c.nodes()[0]) is cc.nodes()[0]


def test_graph_to_dot_names_types_kernels_and_edges(tmp_path, buf):
    g = srt.Graph()
    k = g.add_kernel_node(fill_kernel, buf, N, 1.0)
    m = g.add_memset_node(buf, 3, 8, deps=k)
    child = srt.Graph()
    child.add_kernel_node(add_one_kernel, buf, N)
    g.add_child_graph_node(child, deps=m)
    g.add_host_node(print, deps=k)
    path = tmp_path / "g.dot"
    text = g.to_dot(path)
    assert path.read_text() == text
    assert text.startswith("digraph") and text.rstrip().endswith("}")
    for word in ("KERNEL", "fill_kernel", "MEMSET", "HOST", "add_one_kernel", "subgraph"):
        assert word in text, word
    assert "n0 -> n1;" in text and "n1 -> n2;" in text and "n0 -> n3;" in text
    assert g.to_dot() == text  # without a path: just the text


def test_graph_empty_graph_launches(s):
    ge = srt.Graph().instantiate()
    for _ in range(3):
        ge.launch(s)
    s.synchronize()
    assert s.query()
