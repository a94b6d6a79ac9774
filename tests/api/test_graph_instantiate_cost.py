"""Instantiate's cost structure (DESIGN.md §6), counted, never timed: the graph-memory lifetime
analysis holds memory nodes only, clones share what never changes, and the collector pauses
(nested, error-safe, never switching on a collector that was off) around bulk graph work."""

from __future__ import annotations

import gc
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamrt as srt
from streamrt.graph import gcpause, memory
from streamrt.graph.compile import topo


def _random_graph(rng: random.Random, n: int) -> srt.Graph:
    g = srt.Graph()
    nodes: list = []
    for _ in range(n):
        deps = rng.sample(nodes, min(len(nodes), rng.randint(0, 3)))
        nodes.append(g.add_empty_node(deps=deps))
    for _ in range(n // 4):  # later edges, some to earlier nodes: ties out of creation order
        a, b = rng.sample(nodes, 2)
        try:
            g.add_dependencies(a, b)
        except srt.InvalidValueError:
            pass  # a cycle, or the edge exists
    return g


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 60), st.integers(1, 5))
def test_graph_memory_order_matches_topo_and_reachability(seed, n, every):
    """memory.order: the topological order every instantiate took (compile.topo, ties by creation
    order) restricted to the memory nodes, and each node's memory-node ancestors exactly."""
    rng = random.Random(seed)
    g = _random_graph(rng, n)
    nodes = g._nodes
    mem = [x for x in nodes if x.index % every == 0]  # stand-ins: any subset works the same
    ordered, anc = memory.order(nodes, mem)
    full = topo(g)
    assert ordered == [x for x in full if x in mem]
    pos = {id(x): i for i, x in enumerate(mem)}
    for x in nodes:  # brute force: the memory nodes reaching x
        seen, stack, want = set(), list(x._deps), 0
        while stack:
            d = stack.pop()
            if id(d) in seen:
                continue
            seen.add(id(d))
            if id(d) in pos:
                want |= 1 << pos[id(d)]
            stack.extend(d._deps)
        assert anc[x.index] == want
    assert max(anc, default=0).bit_length() <= len(mem)  # memory nodes only, not the graph


def test_graph_memory_ancestry_is_bounded_by_memory_nodes():
    """A long chain inside one MEM_ALLOC/MEM_FREE pair: every bitset has at most two bits (the
    old analysis held one bit per node of the graph, quadratic memory in all)."""
    g = srt.Graph()
    a = g.add_mem_alloc_node(4096)
    prev = a
    for _ in range(2000):
        prev = g.add_empty_node(deps=prev)
    f = g.add_mem_free_node(a.ptr, deps=prev)
    ordered, anc = memory.order(g._nodes, [a, f])
    assert ordered == [a, f]
    assert max(anc).bit_length() == 1  # only the alloc's bit reaches anything but the free
    ge = g.instantiate()
    assert ge.memory_footprint >= 4096
    ge.destroy()


def test_graph_clone_shares_params_and_finds_originals():
    g = srt.Graph()
    a = g.add_empty_node()
    b = g.add_host_node(print, 1, deps=a)
    c = g.clone()
    cc = c.clone()
    assert c.nodes()[1]._params is b._params  # shared: a node's params are only ever replaced
    assert cc.find_in_clone(b) is cc.nodes()[1] and cc.find_in_clone(c.nodes()[0]) is cc.nodes()[0]
    late = g.add_empty_node()  # added after the clone: not an original of it
    with pytest.raises(srt.InvalidValueError):
        c.find_in_clone(late)
    with pytest.raises(srt.InvalidValueError):
        c.find_in_clone(c.nodes()[0])


def _no_pause() -> None:
    """Wait for a building lease of an earlier test to end (it holds a pause meanwhile)."""
    deadline = time.monotonic() + 30
    while (gcpause._leased or gcpause._depth) and time.monotonic() < deadline:
        time.sleep(gcpause.QUIET)
    assert not gcpause._depth


def _auto() -> bool:
    """Whether automatic full collections run (on, thresholds not deferring the third)."""
    return gc.isenabled() and gc.get_threshold()[0] != 0 and gc.get_threshold()[2] < (1 << 20)


@pytest.fixture
def gc_on():
    _no_pause()
    was, thresholds = gc.isenabled(), gc.get_threshold()
    gc.enable()
    yield
    _no_pause()
    gc.set_threshold(*thresholds)
    (gc.enable if was else gc.disable)()


def test_gc_pause_nested_and_error_safe(gc_on):
    before = gc.get_threshold()
    with gcpause.paused():
        assert not _auto() and gc.isenabled()  # the program's switch is its own
        assert gc.get_threshold()[:2] == before[:2]  # young collections still run
        with gcpause.paused():
            assert not _auto()
        assert not _auto()  # the inner end leaves the outer pause in force
    assert _auto() and gc.get_threshold() == before
    with pytest.raises(KeyError), gcpause.paused():
        raise KeyError("inside")
    assert _auto() and gc.get_threshold() == before  # on the error path too


def test_gc_pause_never_enables_a_collector_that_was_off(gc_on):
    gc.disable()
    with gcpause.paused():
        pass
    assert not gc.isenabled()
    g = srt.Graph()
    for _ in range(gcpause.BULK + 10):
        g.add_empty_node()
    g.instantiate().destroy()
    _no_pause()
    assert not gc.isenabled()
    gc.enable()
    assert _auto()  # and nothing of a pause is left once the program switches it on


def test_gc_pause_keeps_what_the_program_changes_meanwhile(gc_on):
    """A program's gc.disable() during a pause stays; so do thresholds it set meanwhile."""
    with gcpause.paused():
        gc.disable()
    assert not gc.isenabled()
    gc.enable()
    with gcpause.paused():
        gc.set_threshold(500, 10, 10)
    assert gc.get_threshold()[0] == 500


def test_gc_building_lease_ends_when_building_stops(gc_on):
    """Bulk building defers full collections (a lease; young ones still run: program code runs
    between the adds); once adds stop the thresholds are the program's again."""
    before = gc.get_threshold()
    g = srt.Graph()
    for _ in range(gcpause.BULK + gcpause.DENSE * 2):
        g.add_empty_node()
    assert gcpause._leased and not _auto()  # full collections wait while it grows
    assert gc.get_threshold()[:2] == before[:2]  # young ones run
    with gcpause.paused():  # a block inside the lease: still paused after it
        pass
    assert not _auto() and gcpause._leased
    deadline = time.monotonic() + 30
    while gcpause._leased and time.monotonic() < deadline:
        time.sleep(gcpause.QUIET)
    assert gc.get_threshold() == before
    assert not gcpause._leased


def test_gc_pause_does_not_survive_fork(gc_on):
    """A child forked during a pause (another thread's, or the lease) starts with none."""
    import os

    gcpause.pause()
    try:
        pid = os.fork()
        if pid == 0:  # the child: report through the exit status only
            os._exit(0 if _auto() and not gcpause._depth else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        gcpause.resume()


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 80))
def test_graph_clone_edges_in_order(seed, n):
    """The one-pass clone keeps every edge list in the order a clone always had: dependencies
    as in the original, dependents by the dependent's creation order (edges to later nodes too)."""
    g = _random_graph(random.Random(seed), n)
    c = g.clone()
    for o, k in zip(g._nodes, c._nodes):
        assert [d.index for d in k._deps] == [d.index for d in o._deps]
        assert [d.index for d in k._dependents] == sorted(d.index for d in o._dependents)
        assert all(d.graph is c for d in (*k._deps, *k._dependents))
