"""``streamrt demo`` section for seed 002: the same pipeline eager, captured and built explicitly."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..device import Device
from ..errors import CaptureError, GraphExecUpdateError, InvalidValueError
from ..graph import CaptureMode, Graph
from ..graph.update import GraphExecUpdateResult
from ..kernel import kernel
from ..stream import Stream
from .report import check, table

# grid-stride loops: correct for any launch shape, like the Python bodies
FOO_CUDA = r"""extern "C" __global__ void foo(float* data, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    data[i] *= 2.0f;
}"""

BAR_CUDA = r"""extern "C" __global__ void bar(float* data, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    data[i] += 1.0f;
}"""


@kernel(cuda=FOO_CUDA, signature="ptr, i32")
def foo(ctx, data, n):
    """Seed 002's foo: data[i] *= 2."""
    x = ctx.array(data, (n,), np.float32)
    x *= 2.0


@kernel(cuda=BAR_CUDA, signature="ptr, i32")
def bar(ctx, data, n):
    """Seed 002's bar: data[i] += 1."""
    x = ctx.array(data, (n,), np.float32)
    x += 1.0


def _pipeline(s: Stream, src: int, dst: int, n: int) -> None:
    s.launch(foo, src, n, grid=(n + 255) // 256, block=256)
    s.memcpy(dst, src, n * 4)
    s.launch(bar, dst, n, grid=(n + 255) // 256, block=256)


def demo_graphs(dev: Device, out: Callable[[str], None]) -> list[str]:
    """Seed 002: eager, captured, explicit; replay cost; node update; exec update; DOT."""
    out("== task graphs (seed 002): capture, explicit construction, replay, updates ==")
    failures: list[str] = []
    n = 1 << 12
    s = Stream(dev, non_blocking=True)
    src, dst = s.malloc(n * 4), s.malloc(n * 4)
    ones = np.ones(n, np.float32)
    result = np.empty(n, np.float32)

    def reset() -> None:
        s.memcpy(src, ones, n * 4)

    # 1. eager
    reset()
    _pipeline(s, src, dst, n)
    s.memcpy(result, dst, n * 4)
    eager = result.copy()
    # 2. stream capture (THREAD_LOCAL, as the seed recommends)
    s.begin_capture(CaptureMode.THREAD_LOCAL)
    _pipeline(s, src, dst, n)
    captured = s.end_capture()
    ge_cap = captured.instantiate()
    reset()
    ge_cap.launch(s)
    s.memcpy(result, dst, n * 4)
    check(np.array_equal(result, eager), "captured graph == eager pipeline", failures, out)
    # 3. explicit construction with dependencies
    g = Graph()
    a = g.add_kernel_node(foo, src, n, grid=(n + 255) // 256, block=256)
    c = g.add_memcpy_node(dst, src, n * 4, deps=[a])
    b = g.add_kernel_node(bar, dst, n, grid=(n + 255) // 256, block=256)
    g.add_dependencies(c, b)  # without this edge bar could run before the copy
    ge = g.instantiate()
    reset()
    ge.launch(s)
    s.memcpy(result, dst, n * 4)
    check(np.array_equal(result, eager), "explicit graph == eager pipeline", failures, out)
    rows = [("captured", len(captured.nodes()), len(captured.edges())),
            ("explicit", len(g.nodes()), len(g.edges()))]
    table(rows, ("graph", "nodes", "edges"), out)
    # 4. replay cost per node vs eager launches (on zeros: repeated doubling stays finite)
    reps = 200
    s.memcpy(src, np.zeros(n, np.float32), n * 4)
    t0 = time.perf_counter()
    for _ in range(reps):
        _pipeline(s, src, dst, n)
    s.synchronize()
    eager_us = (time.perf_counter() - t0) / (reps * 3) * 1e6
    t0 = time.perf_counter()
    for _ in range(reps):
        ge.launch(s)
    s.synchronize()
    replay_us = (time.perf_counter() - t0) / (reps * 3) * 1e6
    t0 = time.perf_counter()
    for _ in range(reps):
        ge.launch(s)
    launch_us = (time.perf_counter() - t0) / reps * 1e6
    s.synchronize()
    table([("eager launches", f"{eager_us:.1f}"), ("graph replay", f"{replay_us:.1f}"),
           ("host cost of one ge.launch", f"{launch_us:.1f} (whole graph)")],
          ("per node, us", "cost"), out)
    # 5. node parameter update: no re-instantiation
    other = s.malloc(n * 4)
    s.memcpy(other, np.full(n, 5.0, np.float32), n * 4)
    ge.set_kernel_node_params(b, other, n)  # bar now works on `other`
    ge.launch(s)
    s.memcpy(result, other, n * 4)
    check(bool(np.all(result == 6.0)), "set_kernel_node_params: bar ran on the new buffer (5+1)",
          failures, out)
    # 6. exec update from a graph with the same topology
    g2 = g.clone()
    ge.update(g2)  # back to the original parameters
    reset()
    ge.launch(s)
    s.memcpy(result, dst, n * 4)
    check(np.array_equal(result, eager), "ge.update(clone): original parameters restored",
          failures, out)
    # 7. an exec update that changes the topology is refused; the exec keeps its graph
    g3 = g.clone()
    g3.remove_dependencies(g3.nodes()[1], g3.nodes()[2])  # the copy -> bar edge
    try:
        ge.update(g3)
        refused = None
    except GraphExecUpdateError as e:
        refused = e.result
    reset()
    ge.launch(s)
    s.memcpy(result, dst, n * 4)
    check(refused is GraphExecUpdateResult.TOPOLOGY_CHANGED and np.array_equal(result, eager),
          "ge.update(graph without an edge): TOPOLOGY_CHANGED, the exec still runs its graph",
          failures, out)
    failures += _capture_rules(dev, out)
    failures += _graph_memory(dev, out)
    # 8. DOT
    path = Path(tempfile.gettempdir()) / "streamrt_seed002_graph.dot"
    g.to_dot(path)
    out(f"  graph written as Graphviz DOT to {path} (render: dot -Tpng {path.name} -o graph.png)")
    check(path.read_text().count("->") == 2, "the DOT file has the two edges", failures, out)
    for e in (ge, ge_cap):
        e.destroy()
    for p in (src, dst, other):
        s.free(p)
    s.synchronize()
    s.destroy()
    return failures


def _capture_rules(dev: Device, out: Callable[[str], None]) -> list[str]:
    """Seed 002's capture errors: a synchronize inside a capture, a fork never joined."""
    failures: list[str] = []
    s, s2 = Stream(dev, non_blocking=True), Stream(dev, non_blocking=True)
    p = s.malloc(4)
    s.begin_capture()
    s.memset(p, 0, 4)
    try:
        s.synchronize()  # not permitted while capturing: the capture is invalidated
        codes = [0]
    except CaptureError as e:
        codes = [e.code]
    try:
        s.end_capture()
    except CaptureError as e:
        codes.append(e.code)
    s.begin_capture()
    s2.wait(s.record())  # fork: s2 joins the capture
    s2.memset(p, 1, 4)  # ... and is never joined back into s
    try:
        s.end_capture()
    except CaptureError as e:
        codes.append(e.code)
    check(codes == [900, 901, 904] and not s.is_capturing() and not s2.is_capturing(),
          f"capture errors: synchronize in a capture {codes[0]}, end of the invalidated capture "
          f"{codes[1] if len(codes) > 1 else None}, unjoined fork {codes[-1]}; streams usable after",
          failures, out)
    s.free(p)
    s.synchronize()
    for x in (s, s2):
        x.destroy()
    return failures


def _graph_memory(dev: Device, out: Callable[[str], None]) -> list[str]:
    """Seed 002's graph memory: allocations whose lifetimes cannot overlap share memory; a
    relaunch while one is still live is refused unless auto_free_on_launch."""
    failures: list[str] = []
    size = 2 << 20
    s = Stream(dev, non_blocking=True)
    g = Graph()
    a1 = g.add_mem_alloc_node(size)
    f1 = g.add_mem_free_node(a1.ptr, deps=[g.add_memset_node(a1.ptr, 1, size, deps=[a1])])
    a2 = g.add_mem_alloc_node(size, deps=[f1])  # after the first is freed: may share it
    g.add_mem_free_node(a2.ptr, deps=[g.add_memset_node(a2.ptr, 2, size, deps=[a2])])
    ge = g.instantiate()
    ge.launch(s)
    check(ge.memory_footprint < 2 * size,
          f"two {size >> 20} MiB graph allocations, one after the other's free: footprint "
          f"{ge.memory_footprint >> 20} MiB", failures, out)
    h = Graph()
    b = h.add_mem_alloc_node(size)  # never freed in the graph
    h.add_memset_node(b.ptr, 3, size, deps=[b])
    he = h.instantiate()
    he.launch(s)
    try:
        he.launch(s)
        relaunch = "accepted"
    except InvalidValueError:
        relaunch = "refused"
    s.free(b.ptr)  # freed outside the graph: relaunching is fine again
    he.launch(s)
    s.free(b.ptr)
    s.synchronize()
    check(relaunch == "refused", "relaunch with the allocation still live: refused; after "
          "s.free(ptr) it launches again", failures, out)
    for e in (ge, he):
        e.destroy()
    s.destroy()
    return failures
