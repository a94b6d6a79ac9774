"""The cpu replay's fork/join schedule: tiny chains run inline on the stream's worker, while
branches that block or release the GIL still get threads of their own (schedule.py)."""

from __future__ import annotations

import threading

import numpy as np

import streamrt as srt
from streamrt.backends.cpu import schedule


def test_graph_replay_blocking_branches_each_get_a_thread(s):
    # three branches that only finish together: the worker runs one inline and helpers take the
    # others while it blocks (the worker plus LIMIT helpers: three threads on any machine)
    assert schedule.LIMIT >= 2
    met = threading.Barrier(3, timeout=20)
    log = []
    g = srt.Graph()
    root = g.add_empty_node()
    branches = [g.add_host_node(lambda i=i: log.append((i, met.wait())), deps=root)
                for i in range(3)]
    g.add_host_node(log.append, "join", deps=branches)
    ge = g.instantiate()
    for _ in range(3):
        ge.launch(s)
        s.synchronize()
    assert log.count("join") == 3 and len(log) == 12


def test_graph_replay_fork_join_of_tiny_kernels_matches_a_chain(s):
    # layers of independent kernels each adding into its own slot, joined by a kernel summing the
    # layer: the result is what the same kernels give in a chain, launch after launch
    @srt.kernel
    def bump(ctx, ptr, i):
        a = ctx.array(ptr + 8 * i, (1,), np.float64)  # its own slot: siblings never share it
        a += 1.0

    @srt.kernel
    def fold(ctx, ptr):
        a = ctx.array(ptr, (8,), np.float64)
        a[7] += a[:7].sum()

    p = srt.malloc(64)
    srt.memset(p, 0, 64)
    g = srt.Graph()
    join = g.add_kernel_node(fold, p)
    for _ in range(20):
        layer = [g.add_kernel_node(bump, p, i, deps=[join]) for i in range(7)]
        join = g.add_kernel_node(fold, p, deps=layer)
    ge = g.instantiate()
    for _ in range(5):
        ge.launch(s)
    s.synchronize()
    got = srt.read(p, (8,), np.float64)
    want = np.zeros(8)
    for _ in range(5):
        want[7] += want[:7].sum()
        for _ in range(20):
            want[:7] += 1
            want[7] += want[:7].sum()
    np.testing.assert_array_equal(got, want)
    srt.free(p)


def test_graph_replay_branch_blocked_on_a_later_join_still_finishes(s):
    # a waits for c, which joins b and d: while the worker blocks in a, helpers run b and d
    # and then c, whose predecessors finished on helpers, not on the worker
    ready = threading.Event()
    log = []
    g = srt.Graph()
    root = g.add_empty_node()
    a = g.add_host_node(lambda: log.append(("a", ready.wait(20))), deps=root)
    b = g.add_host_node(log.append, "b", deps=root)
    d = g.add_host_node(log.append, "d", deps=root)
    c = g.add_host_node(lambda: (log.append("c"), ready.set()), deps=[b, d])
    g.add_host_node(log.append, "end", deps=[a, c])
    ge = g.instantiate()
    for _ in range(3):
        ready.clear()
        ge.launch(s)
        s.synchronize()
    assert log.count(("a", True)) == 3 and log[-1] == "end" and log.count("c") == 3
