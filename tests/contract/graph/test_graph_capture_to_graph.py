"""``s.begin_capture_to_graph`` (``cudaStreamBeginCaptureToGraph``): capture appends to an
existing graph, after given nodes of it, and ``end_capture`` returns that graph."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from tests.conftest import add_one_kernel, fill_kernel, read_f32
from tests.contract.graph.conftest import N


@pytest.fixture
def s(dev):
    """A non-blocking stream of the backend under test."""
    return srt.Stream(dev, non_blocking=True)


def test_capture_appends_after_the_given_nodes_and_returns_the_same_graph(s, bufs):
    g = srt.Graph()
    a = g.add_kernel_node(fill_kernel, bufs[0], N, 1.0)
    s.begin_capture_to_graph(g, deps=[a])
    s.launch(add_one_kernel, bufs[0], N)  # after a: 1 + 1
    s.launch(add_one_kernel, bufs[0], N)  # after that: + 1
    assert s.capture_info().graph is g
    got = s.end_capture()
    assert got is g and len(g.nodes()) == 3
    first = [n for n in g.nodes() if list(n.dependencies) == [a]]
    assert len(first) == 1 and first[0].type is srt.NodeType.KERNEL
    ge = g.instantiate()
    for _ in range(2):
        ge.launch(s)
        s.synchronize()
        assert np.all(read_f32(bufs[0], N) == 3.0)
    ge.destroy()


def test_capture_to_graph_without_deps_starts_a_root_and_checks_only_its_own_nodes(s, bufs):
    # a node of the graph made before, joined to nothing, is not an unjoined captured node
    g = srt.Graph()
    g.add_kernel_node(fill_kernel, bufs[1], N, 5.0)
    s.begin_capture_to_graph(g)
    s.launch(fill_kernel, bufs[0], N, 2.0)
    assert s.end_capture() is g
    assert len(g.root_nodes()) == 2
    ge = g.instantiate()
    ge.launch(s)
    s.synchronize()
    assert np.all(read_f32(bufs[0], N) == 2.0) and np.all(read_f32(bufs[1], N) == 5.0)
    ge.destroy()


def test_capture_to_graph_still_refuses_unjoined_captured_work(s, bufs, dev):
    g = srt.Graph()
    g.add_empty_node()
    other = srt.Stream(dev, non_blocking=True)
    s.begin_capture_to_graph(g)
    other.wait(s.record())  # other joins the capture
    other.launch(fill_kernel, bufs[0], N, 1.0)  # never joined back into s
    with pytest.raises(srt.CaptureUnjoinedError):
        s.end_capture()


def test_capture_to_graph_refusals(s, bufs):
    g, h = srt.Graph(), srt.Graph()
    b = h.add_empty_node()
    with pytest.raises(srt.StreamRTError):  # deps must be nodes of the graph captured into
        s.begin_capture_to_graph(g, deps=[b])
    assert not s.is_capturing()
    with pytest.raises(srt.InvalidTypeError):
        s.begin_capture_to_graph(object())
    dead = srt.Graph()
    dead.destroy()
    with pytest.raises(srt.InvalidHandleError):
        s.begin_capture_to_graph(dead)
    assert not s.is_capturing()
    s.begin_capture_to_graph(g)
    t = srt.Stream(s.device, non_blocking=True)
    with pytest.raises(srt.IllegalStateError, match="already being captured into"):
        t.begin_capture_to_graph(g, mode=srt.CaptureMode.RELAXED)  # one capture per graph
    assert not t.is_capturing()
    with pytest.raises(srt.IllegalStateError):  # nor destroyed while a capture appends to it
        g.destroy()
    s.launch(fill_kernel, bufs[0], N, 1.0)
    assert s.end_capture() is g and len(g.nodes()) == 1
