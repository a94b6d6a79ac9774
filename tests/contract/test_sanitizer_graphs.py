"""The sanitizer and graphs: graph nodes named in findings, node ordering, graph memory bugs and correct
graph memory programs."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from tests.contract.sanitizer_helpers import kinds, read_k, streams, write_k


@srt.kernel
def inc_k(ctx, p, n):
    ctx.array(p, (n,), np.float32)[:] += 1


def test_sanitizer_names_graph_nodes_as_g_nodes_lists_them(dev, san, tmp_path):
    # "node #k" was the node's place in the replay order, not in g.nodes(): here #1 was nodes()[0]
    s, = streams(dev, 1)
    p, q = srt.malloc(1024), srt.malloc(1024)
    g = srt.Graph()
    a = g.add_kernel_node(inc_k, p, 256)
    b = g.add_kernel_node(write_k, q, 256, 1.0)
    c = g.add_kernel_node(write_k, p, 256, 2.0)  # BUG: unordered with a
    g.add_dependencies([b, b], [a, c])  # b runs first
    with srt.trace(tmp_path / "t.json"):
        g.instantiate().launch(s)
        s.synchronize()
    f, = san.report()
    assert "'inc_k' on" in f.message and "node #0" in f.message and "node #2" in f.message
    assert "node #1" not in f.message
    import json

    positions = {e["name"]: e["args"].get("position") for e in
                 json.loads((tmp_path / "t.json").read_text())["traceEvents"] if e.get("ph") == "X"}
    assert positions.get("inc_k") == "node #0"


def test_sanitizer_graph_nodes(dev, san):
    s, = streams(dev, 1)
    p = srt.malloc(1024)
    g = srt.Graph()
    a = g.add_kernel_node(write_k, p, 256, 1.0)
    b = g.add_kernel_node(write_k, p, 256, 2.0)  # BUG: no edge between the two writers
    ge = g.instantiate()
    ge.launch(s)
    s.synchronize()
    rep = san.report()
    assert kinds(rep) == ["race"] and "node #0" in str(rep[0]) and "node #1" in str(rep[0])
    srt.sanitizer.clear()
    g.add_dependencies(a, b)  # fixed: ordered by an edge, and launches are ordered too
    ge2 = g.instantiate()
    for _ in range(3):
        ge2.launch(s)
    s.synchronize()
    assert san.report() == []
    srt.free(p)


GRAPH_MEMORY_BUGS = ["parallel writers", "node not after the alloc", "node not before the free",
                     "unordered stream", "after a free outside the graph", "after srt.free"]


@pytest.mark.parametrize("bug", GRAPH_MEMORY_BUGS)
def test_sanitizer_graph_memory(dev, san, bug):
    # graph allocations (MEM_ALLOC nodes) were not tracked at all: none of these was reported
    s, t = streams(dev)
    g = srt.Graph()
    a = g.add_mem_alloc_node(1024)
    w = g.add_kernel_node(write_k, a.ptr, 256, 1.0, deps=[a])
    if bug == "parallel writers":
        w2 = g.add_kernel_node(write_k, a.ptr, 256, 2.0, deps=[a])  # BUG: no edge to w
        g.add_mem_free_node(a.ptr, deps=[w, w2])
    elif bug == "node not after the alloc":
        w2 = g.add_kernel_node(write_k, a.ptr, 256, 2.0)  # BUG: a root, not after the alloc
        g.add_mem_free_node(a.ptr, deps=[w, w2])
    elif bug == "node not before the free":
        f = g.add_mem_free_node(a.ptr, deps=[w])
        g.add_kernel_node(write_k, a.ptr, 256, 2.0, deps=[a])  # BUG: not before the free
        assert f.type is srt.NodeType.MEM_FREE
    ge = g.instantiate()
    ge.launch(s)
    if bug == "unordered stream":
        t.launch(write_k, a.ptr, 256, 3.0)  # BUG: no wait on the launch that allocates
    elif bug == "after a free outside the graph":
        t.wait(s.record())
        out: list[float] = []
        t.launch(read_k, a.ptr, 256, out)  # ordered: fine
        s.wait(t.record())
        s.free(a.ptr)
        t.launch(write_k, a.ptr, 256, 4.0)  # BUG: not ordered after the free
    elif bug == "after srt.free":
        s.synchronize()
        srt.free(a.ptr)
        t.launch(write_k, a.ptr, 256, 4.0)  # BUG: the allocation is gone
    dev.synchronize()
    expected = {"unordered stream": "use-before-alloc", "node not after the alloc":
                "use-before-alloc", "parallel writers": "race"}.get(bug, "use-after-free")
    rep = san.report()
    assert kinds(rep) == [expected], rep
    assert expected == "race" or "graph allocation" in str(rep[0])
    if bug == "unordered stream":
        s.free(a.ptr)  # still live: the launch did not free it
    ge.destroy()


def test_sanitizer_graph_memory_auto_free_races_an_access(dev, san):
    # auto_free_on_launch frees the previous launch's allocation as the next launch starts: a
    # read on another stream not ordered before that launch was not reported
    s, t = streams(dev)
    h = srt.Graph()
    b = h.add_mem_alloc_node(1024)
    h.add_kernel_node(write_k, b.ptr, 256, 1.0, deps=[b])
    he = h.instantiate(auto_free_on_launch=True)
    he.launch(s)
    t.wait(s.record())
    out: list[float] = []
    t.launch(read_k, b.ptr, 256, out)
    he.launch(s)  # BUG: s does not wait for t's read before the allocation is freed
    dev.synchronize()
    rep = san.report()
    assert kinds(rep) == ["use-after-free"], rep
    s.free(b.ptr)
    s.synchronize()
    he.destroy()


def test_sanitizer_graph_memory_correct_programs_are_clean(dev, san):
    s, t = streams(dev)
    g = srt.Graph()
    a = g.add_mem_alloc_node(1024)
    w = g.add_kernel_node(write_k, a.ptr, 256, 1.0, deps=[a])
    w2 = g.add_kernel_node(write_k, a.ptr, 256, 2.0, deps=[w])
    g.add_mem_free_node(a.ptr, deps=[w2])
    ge = g.instantiate()
    for _ in range(3):  # relaunches: each launch a new allocation of the same address
        ge.launch(s)
    h = srt.Graph()  # an allocation that escapes, used on another stream, freed by a graph
    b = h.add_mem_alloc_node(1024)
    h.add_kernel_node(write_k, b.ptr, 256, 1.0, deps=[b])
    he = h.instantiate(auto_free_on_launch=True)
    he.launch(s)
    he.launch(s)  # frees the first launch's allocation as it starts
    t.wait(s.record())
    out: list[float] = []
    t.launch(read_k, b.ptr, 256, out)
    f = srt.Graph()
    f.add_mem_free_node(b.ptr)
    fe = f.instantiate()
    s.wait(t.record())
    fe.launch(s)
    dev.synchronize()
    assert san.report() == [] and out == [256.0]
    for e in (ge, he, fe):
        e.destroy()
