"""Property test of the graph scheduler (hypothesis): random DAGs of nodes run in an order that
respects every edge (on cpu:0)."""

from __future__ import annotations

import random
import time

from hypothesis import given, settings
from hypothesis import strategies as st

import streamrt as srt
from tests.conftest import restore_delays, set_delays


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
