"""Graph memory sharing (DESIGN.md §3): MEM_ALLOC/MEM_FREE nodes whose lifetimes cannot overlap share
physical memory at instantiate (footprint), small allocations share granules (slabs), and a
property test that packing never overlaps lifetimes that may overlap."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamrt as srt
from tests.conftest import copy_kernel, fill_kernel
from tests.conftest import read_f32 as _read
from tests.contract.graph.graph_memory import _pairs_chain, add_kernel

N = 16


UNIT = 2 << 20  # 2 MiB: a multiple of every backend's graph granule (cuda: the VMM granularity)


def test_graph_memory_chain_of_pairs_shares_one_allocation(s):
    g, allocs = _pairs_chain(4, UNIT)
    assert len({a.ptr for a in allocs}) == 4  # distinct addresses...
    ge = g.instantiate()
    assert UNIT <= ge.memory_footprint < 2 * UNIT  # ...about one physical allocation
    for _ in range(3):
        ge.launch(s)
    s.synchronize()
    ge.destroy()


def test_graph_memory_independent_allocations_do_not_share(s, out):
    # two branches allocate, fill with different values concurrently, then combine
    g = srt.Graph()
    a = g.add_mem_alloc_node(UNIT)
    b = g.add_mem_alloc_node(UNIT)
    fa = g.add_kernel_node(fill_kernel, a.ptr, N, 1.0, deps=a)
    fb = g.add_kernel_node(fill_kernel, b.ptr, N, 2.0, deps=b)
    ca = g.add_kernel_node(copy_kernel, out, a.ptr, N, deps=[fa, fb])
    cb = g.add_kernel_node(add_kernel, out, b.ptr, N, deps=ca)
    g.add_mem_free_node(a.ptr, deps=cb)
    g.add_mem_free_node(b.ptr, deps=cb)
    ge = g.instantiate()
    assert ge.memory_footprint >= 2 * UNIT  # both live at once: no sharing
    for _ in range(3):
        ge.launch(s)
    s.synchronize()
    assert (_read(out) == 3.0).all()
    ge.destroy()


def test_graph_memory_alloc_overlapping_a_live_one_does_not_share(s, out):
    # a is freed only after b was allocated and used: lifetimes overlap
    g = srt.Graph()
    a = g.add_mem_alloc_node(UNIT)
    fa = g.add_kernel_node(fill_kernel, a.ptr, N, 5.0, deps=a)
    b = g.add_mem_alloc_node(UNIT, deps=fa)
    fb = g.add_kernel_node(fill_kernel, b.ptr, N, 7.0, deps=b)
    c = g.add_kernel_node(copy_kernel, out, a.ptr, N, deps=fb)  # a must still hold 5.0
    g.add_mem_free_node(a.ptr, deps=c)
    g.add_mem_free_node(b.ptr, deps=c)
    ge = g.instantiate()
    assert ge.memory_footprint >= 2 * UNIT
    ge.launch(s)
    s.synchronize()
    assert (_read(out) == 5.0).all()
    ge.destroy()


def test_graph_memory_unordered_branches_do_not_share(s, dev):
    # a's free comes before b's alloc in a topological order, but no edge orders them: the two
    # lifetimes may overlap, so packing must follow the DAG, not the order it walks it in
    outs = [srt.malloc(N * 4, dev) for _ in range(2)]
    g = srt.Graph()
    a = g.add_mem_alloc_node(UNIT)
    fa = g.add_kernel_node(fill_kernel, a.ptr, N, 1.0, deps=a)
    ca = g.add_kernel_node(copy_kernel, outs[0], a.ptr, N, deps=fa)
    g.add_mem_free_node(a.ptr, deps=ca)
    prev = g.add_empty_node()
    for _ in range(4):  # b's branch starts deeper than a's ends
        prev = g.add_empty_node(deps=prev)
    b = g.add_mem_alloc_node(UNIT, deps=prev)
    fb = g.add_kernel_node(fill_kernel, b.ptr, N, 2.0, deps=b)
    cb = g.add_kernel_node(copy_kernel, outs[1], b.ptr, N, deps=fb)
    g.add_mem_free_node(b.ptr, deps=cb)
    ge = g.instantiate()
    assert ge.memory_footprint >= 2 * UNIT
    for _ in range(2):
        ge.launch(s)
    s.synchronize()
    assert (_read(outs[0]) == 1.0).all() and (_read(outs[1]) == 2.0).all()
    ge.destroy()
    for p in outs:
        srt.free(p)


def test_graph_memory_packing_skips_every_busy_range_not_only_the_last(s):
    # x (3 units) is freed before z and y, which live together at offsets 0 and 1 (inside x's
    # bytes). r runs in a branch of its own, beside all three: it must go past x's end, not
    # just past y's (which ends inside x)
    g = srt.Graph()
    x = g.add_mem_alloc_node(3 * UNIT)
    fx = g.add_mem_free_node(x.ptr, deps=x)
    z = g.add_mem_alloc_node(UNIT, deps=fx)
    y = g.add_mem_alloc_node(UNIT, deps=fx)
    done = g.add_empty_node(deps=[g.add_mem_free_node(p.ptr, deps=[z, y]) for p in (z, y)])
    prev = g.add_empty_node()
    for _ in range(3):  # r's alloc comes after z's and y's in a topological order
        prev = g.add_empty_node(deps=prev)
    r = g.add_mem_alloc_node(UNIT, deps=prev)
    g.add_mem_free_node(r.ptr, deps=[r, done])
    ge = g.instantiate()
    assert ge.memory_footprint >= 4 * UNIT  # x and r may be live at once
    ge.launch(s)
    s.synchronize()
    ge.destroy()


def test_graph_memory_captured_pairs_share(s, out):
    s.begin_capture()
    for i in range(3):
        p = s.malloc(UNIT)
        s.launch(fill_kernel, p, N, float(i + 1))
        s.launch(add_kernel, out, p, N)
        s.free(p)
    g = s.end_capture()
    ge = g.instantiate()
    assert UNIT <= ge.memory_footprint < 2 * UNIT
    for _ in range(3):
        ge.launch(s)
    s.synchronize()
    assert (_read(out) == 18.0).all()
    ge.destroy()


# -- slabs: small allocations of one graph share granules ------------------------------------------
@pytest.fixture
def granule(dev, monkeypatch):
    """The device's graph granule; on cpu raised to 64 KiB so that its slabs hold several
    allocations (at 512 B, one small allocation fills a cpu slab)."""
    if dev.backend == "cpu":
        monkeypatch.setattr(dev._impl, "graph_granule", 64 << 10)
    return dev._impl.graph_granule


def test_graph_memory_small_allocations_live_at_once_share_a_granule(s, granule):
    # 40 allocations live together: on cuda each used to cost a whole 2 MiB granule
    count, nbytes = 40, 1000
    m = nbytes // 4
    out = srt.malloc(count * m * 4)
    g = srt.Graph()
    allocs = [g.add_mem_alloc_node(nbytes) for _ in range(count)]
    fills = [g.add_kernel_node(fill_kernel, a.ptr, m, float(i), deps=a) for i, a in enumerate(allocs)]
    copies = [g.add_kernel_node(copy_kernel, out + i * m * 4, a.ptr, m, deps=fills)
              for i, a in enumerate(allocs)]
    for a in allocs:
        g.add_mem_free_node(a.ptr, deps=copies)
    ge = g.instantiate()
    # 1000 bytes take 1024 of a slab; all 40 fit in one (a 64 KiB or 2 MiB granule)
    assert ge.memory_footprint == granule
    for _ in range(2):
        ge.launch(s)
    s.synchronize()
    got = srt.read(out, (count, m), np.float32)
    assert (got == np.arange(count, dtype=np.float32)[:, None]).all()  # no two overlap
    ge.destroy()
    srt.free(out)


def test_graph_memory_slabs_with_disjoint_lifetimes_share(s, granule):
    # a chain of alloc -> fill -> free of half a granule each: two per slab, every slab's
    # lifetime over before the next one's starts, so all of them share one granule
    g, allocs = _pairs_chain(8, granule // 2)
    assert len({a._params["alloc"].range for a in allocs}) == 4  # four slabs
    ge = g.instantiate()
    assert ge.memory_footprint == granule
    ge.launch(s)
    s.synchronize()
    ge.destroy()


def test_graph_memory_slab_with_a_long_lived_member_does_not_share(s, out, granule):
    # a lives across the whole chain: its slab overlaps every later slab's lifetime
    g = srt.Graph()
    a = g.add_mem_alloc_node(granule // 4)
    fa = g.add_kernel_node(fill_kernel, a.ptr, N, 9.0, deps=a)
    prev = fa
    for i in range(4):
        b = g.add_mem_alloc_node(granule // 2, deps=prev)
        fb = g.add_kernel_node(fill_kernel, b.ptr, granule // 8, float(i), deps=b)
        prev = g.add_mem_free_node(b.ptr, deps=fb)
    c = g.add_kernel_node(copy_kernel, out, a.ptr, N, deps=prev)
    g.add_mem_free_node(a.ptr, deps=c)
    ge = g.instantiate()
    assert ge.memory_footprint == 2 * granule  # a's slab, and one the others take turns on
    for _ in range(2):
        ge.launch(s)
    s.synchronize()
    assert (_read(out) == 9.0).all()  # no later allocation overwrote a
    ge.destroy()


def test_graph_memory_captured_small_allocations_share_a_slab(s, out, granule):
    # stream capture makes MEM_ALLOC nodes too: its small allocations take slabs as well
    s.begin_capture()
    ptrs = [s.malloc(N * 4) for _ in range(4)]
    for i, p in enumerate(ptrs):
        s.launch(fill_kernel, p, N, float(i + 1))
    for p in ptrs:
        s.launch(add_kernel, out, p, N)
        s.free(p)
    g = s.end_capture()
    ge = g.instantiate()
    assert ge.memory_footprint == granule
    ge.launch(s)
    s.synchronize()
    assert (_read(out) == 10.0).all()  # 1 + 2 + 3 + 4: no two overlap
    ge.destroy()


def test_graph_memory_slab_shares_with_an_allocation_between_its_members(s, out, granule):
    # y1 and y2 share a slab; x lives after y1's free and before y2's alloc: x's lifetime and
    # the slab's never overlap, though the slab's first member comes first
    g = srt.Graph()
    y1 = g.add_mem_alloc_node(N * 4)
    y2 = g.add_mem_alloc_node(N * 4)  # same slab as y1 (created next to it)
    x = g.add_mem_alloc_node(UNIT)
    assert y1._params["alloc"].range is y2._params["alloc"].range
    f1 = g.add_kernel_node(fill_kernel, y1.ptr, N, 1.0, deps=y1)
    c1 = g.add_kernel_node(add_kernel, out, y1.ptr, N, deps=f1)
    free1 = g.add_mem_free_node(y1.ptr, deps=c1)
    g.add_dependencies(free1, x)
    fx = g.add_kernel_node(fill_kernel, x.ptr, N, 2.0, deps=x)
    cx = g.add_kernel_node(add_kernel, out, x.ptr, N, deps=fx)
    freex = g.add_mem_free_node(x.ptr, deps=cx)
    g.add_dependencies(freex, y2)
    f2 = g.add_kernel_node(fill_kernel, y2.ptr, N, 4.0, deps=y2)
    c2 = g.add_kernel_node(add_kernel, out, y2.ptr, N, deps=f2)
    g.add_mem_free_node(y2.ptr, deps=c2)
    ge = g.instantiate()
    assert ge.memory_footprint == max(UNIT, granule)
    ge.launch(s)
    s.synchronize()
    assert (_read(out) == 7.0).all()
    ge.destroy()


def test_graph_memory_graphs_do_not_share_slabs(s, out, granule):
    # each graph has slabs of its own, so both can have a live exec at once
    execs, ranges = [], []
    for value in (1.0, 2.0):
        g = srt.Graph()
        a = g.add_mem_alloc_node(N * 4)
        f = g.add_kernel_node(fill_kernel, a.ptr, N, value, deps=a)
        g.add_kernel_node(add_kernel, out, a.ptr, N, deps=f)
        ranges.append(a._params["alloc"].range)
        execs.append(g.instantiate())
    srt.memset(out, 0, N * 4)
    for ge in execs:
        ge.launch(s)
    s.synchronize()
    assert ranges[0] is not ranges[1]
    assert (_read(out) == 3.0).all()
    for ge in execs:
        ge.destroy()


# -- packing, property-based: random DAGs of memory nodes -----------------------------------------
def _ancestors(node) -> set:
    """Every node ``node`` depends on, directly or not (from the public node API)."""
    seen: set = set()
    stack = list(node.dependencies)
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.dependencies)
    return seen


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_graph_memory_packing_never_overlaps_lifetimes_that_may_overlap(granule, monkeypatch, data):
    # Two ranges (an allocation's, or a slab's) may share bytes only if, for every pair of their
    # members, one's free is an ancestor of the other's alloc. Checked on random DAGs, with extra
    # edges added after creation (so slab members need not be allocated in creation order), on
    # the offsets instantiate computes; and first fit leaves no gap: a range not at 0 starts
    # where a range whose lifetime overlaps its own ends.
    from streamrt.graph import memory as gmem

    packed: list = []

    def spy(allocs, ancestors, bit):
        offsets, footprint = real(allocs, ancestors, bit)
        packed.append((allocs, offsets, footprint))
        return offsets, footprint

    real = gmem.pack
    monkeypatch.setattr(gmem, "pack", spy)
    sizes = [64, granule // 4, granule // 2 + 512, granule, 3 * granule]
    g = srt.Graph()
    nodes: list = []
    unfreed: list = []
    for _ in range(data.draw(st.integers(2, 14), label="nodes")):
        deps = data.draw(st.lists(st.sampled_from(nodes), max_size=3, unique=True)) if nodes else []
        kind = data.draw(st.sampled_from(["alloc", "alloc", "free", "empty"]))
        if kind == "free" and unfreed:
            a = unfreed.pop(data.draw(st.integers(0, len(unfreed) - 1)))
            nodes.append(g.add_mem_free_node(a.ptr, deps=[a, *(d for d in deps if d is not a)]))
        elif kind == "alloc":
            nodes.append(g.add_mem_alloc_node(data.draw(st.sampled_from(sizes)), deps=deps))
            unfreed.append(nodes[-1])
        else:
            nodes.append(g.add_empty_node(deps=deps))
    for _ in range(data.draw(st.integers(0, 4), label="late edges")):
        i, j = data.draw(st.integers(0, len(nodes) - 1)), data.draw(st.integers(0, len(nodes) - 1))
        if i > j and nodes[j] not in nodes[i].dependencies:
            try:
                g.add_dependencies(nodes[i], nodes[j])  # a later node before an earlier one
            except srt.InvalidValueError:
                pass  # it would close a cycle
    ge = g.instantiate()
    try:
        if not any(n.type is srt.NodeType.MEM_ALLOC for n in nodes):
            return
        ((allocs, offsets, footprint),) = packed
        members: dict = {}
        for a, anode, fnode in allocs:
            members.setdefault(a.range, []).append((anode, fnode))
        anc = {n: _ancestors(n) for life in members.values() for m in life for n in m if n}

        def may_overlap(x, y) -> bool:
            return not all((yf is not None and yf in anc[xa]) or (xf is not None and xf in anc[ya])
                           for xa, xf in members[x] for ya, yf in members[y])

        assert footprint == max(offsets[r] + r.size for r in members) == ge.memory_footprint
        for r in members:
            lo, hi = offsets[r], offsets[r] + r.size
            others = [q for q in members if q is not r and may_overlap(r, q)]
            for q in others:
                assert hi <= offsets[q] or offsets[q] + q.size <= lo, (r, q)
            assert lo == 0 or any(offsets[q] + q.size == lo for q in others), r
    finally:
        ge.destroy()
