"""A graph launch's precomputed record (GraphExec._record): the launches after the first skip
the general path, and every change that the general path would see sends them back to it."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from streamrt import sync
from tests.conftest import PY_KERNELS, cpu_only

N = 16


@srt.kernel
def add_one(ctx, ptr):
    a = ctx.array(ptr, (N,), np.float32)
    a += 1.0


def _graph(ptr):
    g = srt.Graph()
    node = g.add_kernel_node(add_one, ptr)
    return g, node


def _read(ptr):
    return srt.read(ptr, (N,), np.float32)


def test_graph_launch_record_follows_kernel_param_updates(s, dev):
    cpu_only(dev, PY_KERNELS)
    a, b = srt.malloc(4 * N), srt.malloc(4 * N)
    for p in (a, b):
        srt.memset(p, 0, 4 * N)
    g, node = _graph(a)
    ge = g.instantiate()
    for _ in range(3):  # recorded after the first
        ge.launch(s)
    ge.set_kernel_node_params(node, b)
    ge.launch(s)
    s.synchronize()
    assert _read(a)[0] == 3 and _read(b)[0] == 1
    ge.set_node_enabled(node, False)
    ge.launch(s)
    s.synchronize()
    assert _read(b)[0] == 1


def test_graph_launch_record_refused_after_destroy(s):
    g = srt.Graph()
    g.add_empty_node()
    ge = g.instantiate()
    ge.launch(s)
    ge.launch(s)
    ge.destroy()
    with pytest.raises(srt.InvalidHandleError):
        ge.launch(s)


def test_graph_launch_record_refused_on_a_destroyed_stream(dev):
    st = srt.Stream(dev, non_blocking=True)
    g = srt.Graph()
    g.add_empty_node()
    ge = g.instantiate()
    ge.launch(st)
    ge.launch(st)
    st.synchronize()
    st.destroy()
    with pytest.raises(srt.InvalidHandleError):
        ge.launch(st)


def test_graph_launch_record_orders_after_a_launch_on_another_stream(s, s2, dev):
    cpu_only(dev, PY_KERNELS)
    # s, s, s2, s: each launch after the previous one whatever its stream (one exec never
    # overlaps itself), so every increment lands
    a = srt.malloc(4 * N)
    srt.memset(a, 0, 4 * N)
    ge = _graph(a)[0].instantiate()
    for st in (s, s, s2, s, s, s2, s2, s):
        ge.launch(st)
    dev.synchronize()
    assert _read(a)[0] == 8


def test_graph_launch_record_seen_by_a_tracer_enabled_later(s, tmp_path):
    # the tracer sees every launch once it is on, recorded launches included
    g = srt.Graph()
    g.add_empty_node()
    ge = g.instantiate()
    ge.launch(s)
    ge.launch(s)
    s.synchronize()
    with srt.trace(tmp_path / "t.json") as tr:
        for _ in range(3):
            ge.launch(s)
        s.synchronize()
    names = [e.get("name", "") for e in tr.to_json()["traceEvents"]]
    assert sum("graph launch" in n for n in names) == 3


def test_graph_launch_record_synchronous_under_launch_blocking(s, dev):
    cpu_only(dev, PY_KERNELS)
    a = srt.malloc(4 * N)
    srt.memset(a, 0, 4 * N)
    ge = _graph(a)[0].instantiate()
    ge.launch(s)
    ge.launch(s)
    s.synchronize()
    prev = sync.set_launch_blocking(True)
    try:
        ge.launch(s)
        assert s.query()  # done when the launch returned
    finally:
        sync.set_launch_blocking(prev)
    s.synchronize()
    assert _read(a)[0] == 3


def test_graph_launch_record_carries_what_the_stream_learnt_since(s, s2, dev, gate):
    """A launch after the stream waited on an event passes that ordering on.

    The record keeps a copy of the launch stream's clock; a wait merged into the stream after
    the record was made must reach the next launch's ordering: a later launch of the exec on a
    third stream is ordered after this one, and through it after the event, so a block freed
    before that event is reusable there by the event-dependency rule (no opportunistic or
    internal-dependency reuse allowed).
    """
    cpu_only(dev, PY_KERNELS)
    pool = srt.MemPool(dev, reuse_allow_opportunistic=False,
                       reuse_allow_internal_dependencies=False)
    s3 = srt.Stream(dev, non_blocking=True)
    g = srt.Graph()
    g.add_empty_node()
    ge = g.instantiate()
    for _ in range(3):  # the record is made, then used
        ge.launch(s)
    hold = gate(s2)  # s2's free stays pending: only ordering can make it reusable
    p = s2.malloc(4096, pool)
    s2.free(p)
    s.wait(s2.record())  # s learns s2's free, after the record was made
    ge.launch(s)  # the record's path: it must pass s's new clock on
    ge.launch(s3)  # ordered after that launch, hence after s2's free
    before = pool.stats()["reuse_event_dependency"]
    q = s3.malloc(4096, pool)
    assert q == p and pool.stats()["reuse_event_dependency"] == before + 1
    hold.open()
    s3.free(q)
    s3.synchronize()
    ge.destroy()
    pool.destroy()
