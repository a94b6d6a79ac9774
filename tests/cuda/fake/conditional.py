"""Conditional nodes (CUDA 12.4+): handles, ``cudaGraphAddNode`` of a conditional node, their
execution, and ``cudaGraphSetConditional`` called from device code.

What it models, as the CUDA documentation says:

- ``cudaGraphConditionalHandleCreate(graph, defaultLaunchValue, flags)``: a handle of ``graph``
  (flags 0 or ``cudaGraphCondAssignDefault``); with the flag, the value is set to the default at
  the start of every launch of an exec. Without it, the value is the one the exec's previous
  launch left (0 before the first): CUDA leaves it unspecified, so a program relying on it is
  wrong either way. Values are 32-bit (``unsigned int``) and live per exec.
- ``cudaGraphAddNode`` of a ``cudaGraphNodeTypeConditional`` node: the handle must be one of
  the graph or of a graph the node's graph is a body inside; ``size`` 1 or 2 for IF, 1 for
  WHILE, at least 1 for SWITCH. The node makes ``size`` body graphs (CUDA-owned: they cannot be
  destroyed or instantiated on their own, and go with the node's graph) and writes their array
  into ``nodeParams.conditional.phGraph_out``, as the driver does. A body takes kernel, empty,
  memcpy (not of pageable host memory), memset and conditional nodes only.
- Instantiate copies the bodies with the graph; it fails with
  ``cudaGraphInstantiateConditionalHandleUnused`` when a handle of the graph (or of a body in
  it) serves no conditional node.
- A launch runs IF's body 0 when the value is not 0, else body 1 when there are two; WHILE's
  body 0 as long as the value is not 0, tested before each iteration; SWITCH's body ``value``
  when ``value < size``, else none. The value is read when the node runs.
- ``cudaGraphSetConditional(handle, value)`` in device code: the kernels' CUDA C is built with
  :data:`PRELUDE` before it (see ``kernels.Function``), whose definition records the last value
  set per handle on the calling OS thread; once the launch ran, :func:`take` gives them to the
  graph launch running on that thread. A kernel not run by a launch of the handle's exec
  setting it is a FakeMisuse (undefined on a GPU), and so is a kernel setting more than
  ``_MAX_SETS`` handles in one launch.

Not modelled: concurrent launches of one exec sharing its values (CUDA serializes them);
updating an exec's conditional node or its bodies in place (``cudaGraphExecUpdate``,
``cudaGraphExec*NodeSetParams`` of a body node: refused, the exec must be made again);
``cudaStreamBeginCaptureToGraph`` into a body.
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING, Any

from cuda.bindings import runtime as rt

from . import state
from .binding import runtime
from .state import LOCK, SUCCESS, E, FakeMisuse

if TYPE_CHECKING:
    from .graphs import Exec, Graph

_T = rt.cudaGraphConditionalNodeType
IF, WHILE, SWITCH = int(_T.cudaGraphCondTypeIf), int(_T.cudaGraphCondTypeWhile), \
    int(_T.cudaGraphCondTypeSwitch)
ASSIGN_DEFAULT = int(rt.cudaGraphConditionalHandleFlags.cudaGraphCondAssignDefault)
BODY_KINDS = frozenset(("kernel", "empty", "memcpy", "memset", "conditional"))
_U32 = (1 << 32) - 1
_MAX_SETS = 64  # handles one kernel launch may set (PRELUDE's table)
# cudaConditionalNodeParams: handle (8 bytes), type (4), size (4), then phGraph_out (a pointer)
_PH_GRAPH_OUT = 16

PRELUDE = r"""
// tests/cuda/fake/conditional.py: cudaGraphSetConditional recorded per OS thread, taken by the
// fake once the launch ran (the last value set for each handle)
typedef unsigned long long cudaGraphConditionalHandle;
static thread_local unsigned long long srt_fake_cond_h[64];
static thread_local unsigned srt_fake_cond_v[64];
static thread_local unsigned srt_fake_cond_n = 0, srt_fake_cond_over = 0;
extern "C" void cudaGraphSetConditional(cudaGraphConditionalHandle h, unsigned int v) {
  for (unsigned i = 0; i < srt_fake_cond_n; ++i)
    if (srt_fake_cond_h[i] == h) { srt_fake_cond_v[i] = v; return; }
  if (srt_fake_cond_n == 64) { srt_fake_cond_over = 1; return; }
  srt_fake_cond_h[srt_fake_cond_n] = h;
  srt_fake_cond_v[srt_fake_cond_n++] = v;
}
extern "C" int srt_fake_cond_take(unsigned long long* h, unsigned* v) {
  const int n = srt_fake_cond_over ? -1 : (int)srt_fake_cond_n;
  for (unsigned i = 0; i < srt_fake_cond_n; ++i) h[i] = srt_fake_cond_h[i], v[i] = srt_fake_cond_v[i];
  srt_fake_cond_n = srt_fake_cond_over = 0;
  return n;
}
"""


class Handle:
    """A ``cudaGraphConditionalHandle``: its graph, default and flags."""

    def __init__(self, graph: Graph, default: int, flags: int) -> None:
        self.handle = state.new_handle()
        self.graph = graph
        self.default = default
        self.flags = flags


class CondNode:
    """A conditional node's parameters (``Node.run``): its handle, type and body graphs, and
    the CUDA-owned array of the bodies (``phGraph_out`` points at it while the node lives)."""

    def __init__(self, handle: Handle, type_: int, bodies: list[Graph]) -> None:
        self.handle = handle
        self.type = type_
        self.bodies = bodies
        self.array = (ctypes.c_void_p * len(bodies))(*[b.handle for b in bodies])


HANDLES: dict[int, Handle] = {}


def _graphs() -> dict[int, Graph]:
    from .graphs import GRAPHS

    return GRAPHS


def _inside(g: Graph | None, owner: Graph) -> bool:
    """Whether ``g`` is ``owner`` or a body inside it (at any depth)."""
    while g is not None:
        if g is owner:
            return True
        g = None if g.body_of is None else g.body_of.graph
    return False


@runtime("cudaGraphConditionalHandleCreate")
def cudaGraphConditionalHandleCreate(graph: Any, defaultLaunchValue: int, flags: int) -> tuple:
    with LOCK:
        g = _graphs().get(state.as_int(graph))
        if g is None or int(flags) not in (0, ASSIGN_DEFAULT):
            return (E.cudaErrorInvalidValue, None)
        h = Handle(g, int(defaultLaunchValue) & _U32, int(flags))
        HANDLES[h.handle] = h
    return (SUCCESS, rt.cudaGraphConditionalHandle(h.handle))


@runtime("cudaGraphAddNode")
def cudaGraphAddNode(graph: Any, deps: Any, dependencyData: Any, n: int, nodeParams: Any) -> tuple:
    from .graphs import GRAPHS, Graph, _add

    if nodeParams is None:
        return (E.cudaErrorInvalidValue, None)
    if int(nodeParams.type) != int(rt.cudaGraphNodeType.cudaGraphNodeTypeConditional):
        raise state.FakeUnsupported(f"cudaGraphAddNode of a {nodeParams.type!r}: the fake adds "
                                    "conditional nodes only (the other kinds have their own calls)")
    if dependencyData not in (None, [], ()):
        raise state.FakeUnsupported("cudaGraphAddNode with edge data: not modelled")
    c = nodeParams.conditional
    type_, size = int(c.type), int(c.size)
    with LOCK:
        g = GRAPHS.get(state.as_int(graph))
        h = HANDLES.get(state.as_int(c.handle))
        if g is None or h is None or not _inside(g, h.graph) or state.as_int(c.ctx):
            return (E.cudaErrorInvalidValue, None)
        if not (size >= 1 and (type_ == SWITCH or (type_ == IF and size <= 2)
                               or (type_ == WHILE and size == 1))):
            return (E.cudaErrorInvalidValue, None)
        bodies = [Graph() for _ in range(size)]
        cond = CondNode(h, type_, bodies)
        node, bad = _add(graph, deps, n, "conditional", cond, (E.cudaErrorInvalidValue, None))
        if bad:
            return bad
        for b in bodies:
            b.body_of = node
            GRAPHS[b.handle] = b
    # the driver writes the CUDA-owned array's address into the caller's parameters
    ctypes.c_void_p.from_address(c.getPtr() + _PH_GRAPH_OUT).value = ctypes.addressof(cond.array)
    return (SUCCESS, rt.cudaGraphNode_t(node.handle))


def tree(g: Graph) -> list[Graph]:
    """``g`` and the bodies inside it, at any depth."""
    out = [g]
    for n in g.nodes.values():
        if n.kind == "conditional":
            for b in n.run.bodies:
                out += tree(b)
    return out


def drop(g: Graph) -> None:
    """Forget the bodies of ``g``'s conditional nodes and their nodes (``g`` destroyed; call
    holding LOCK), and the handles of those graphs."""
    from .graphs import GRAPHS, NODES

    graphs = tree(g)
    for b in graphs[1:]:
        GRAPHS.pop(b.handle, None)
        for h in b.nodes:
            NODES.pop(h, None)
    mine = {id(x) for x in graphs}
    for k in [k for k, h in HANDLES.items() if id(h.graph) in mine]:
        del HANDLES[k]


def unused(g: Graph) -> bool:
    """Whether a handle of ``g`` or of a body inside it serves no conditional node (instantiate
    fails: ``cudaGraphInstantiateConditionalHandleUnused``)."""
    graphs = tree(g)
    mine = {id(x) for x in graphs}
    used = {id(n.run.handle) for x in graphs for n in x.nodes.values() if n.kind == "conditional"}
    return any(id(h.graph) in mine and id(h) not in used for h in HANDLES.values())


class CondExec:
    """An instantiated conditional node: the handle, type and an exec of each body."""

    def __init__(self, cond: CondNode, device: int, flags: int) -> None:
        from .graphs import Exec

        self.handle = cond.handle.handle
        self.type = cond.type
        self.bodies = [Exec(b, device, flags) for b in cond.bodies]

    def snapshot(self) -> Any:
        """The node's work in a launch (body parameters as they are now)."""
        from .graphs import Exec

        bodies = [b.snapshot() for b in self.bodies]
        h, type_ = self.handle, self.type

        def node() -> None:
            launch = _current(h)
            if type_ == WHILE:
                while launch.values[h]:
                    Exec.run(bodies[0])
                return
            v = launch.values[h]
            k = (0 if v else 1 if len(bodies) == 2 else -1) if type_ == IF else \
                v if v < len(bodies) else -1
            if k >= 0:
                Exec.run(bodies[k])

        return node


class Launch:
    """One launch of an exec with conditional nodes: the values of its handles (the exec's,
    shared by its launches), made current on the worker thread while it runs."""

    def __init__(self, values: dict[int, int]) -> None:
        self.values = values


_tls = threading.local()  # ``stack``: the launches running on this thread (a captured launch
# runs inside the graph it became a child of)


def _current(h: int) -> Launch:
    for launch in reversed(getattr(_tls, "stack", ())):
        if h in launch.values:
            return launch
    raise FakeMisuse(f"conditional handle {hex(h)} used outside a launch of its graph")


def values_of(x: Exec) -> dict[int, int] | None:
    """The value of each handle of ``x``'s graph tree (0 until set), None without conditional
    nodes (made once per exec at instantiate)."""
    graphs = tree(x.graph)
    if len(graphs) == 1 and not any(n.kind == "conditional" for n in x.graph.nodes.values()):
        return None
    return {n.run.handle.handle: 0 for g in graphs for n in g.nodes.values()
            if n.kind == "conditional"}


def launch_run(x: Exec, steps: list[tuple]) -> Any:
    """What a launch of ``x`` runs on the worker thread: its steps, its handles' defaults set
    first and its values current while they run."""
    from .graphs import Exec

    values = x.cond_values
    if values is None:
        return lambda: Exec.run(steps)
    defaults = [(h, HANDLES[h].default) for h in values
                if h in HANDLES and HANDLES[h].flags & ASSIGN_DEFAULT]
    launch = Launch(values)

    def run() -> None:
        for h, d in defaults:
            values[h] = d
        stack = _tls.__dict__.setdefault("stack", [])
        stack.append(launch)
        try:
            Exec.run(steps)
        finally:
            stack.pop()

    return run


def take(lib: Any) -> None:
    """After a launch of a kernel whose source calls ``cudaGraphSetConditional``: its calls, on
    this thread, given to the launch they belong to."""
    hs = (ctypes.c_ulonglong * _MAX_SETS)()
    vs = (ctypes.c_uint * _MAX_SETS)()
    n = lib.srt_fake_cond_take(hs, vs)
    if n < 0:
        raise FakeMisuse(f"a kernel set more than {_MAX_SETS} conditional handles in one launch")
    for i in range(n):
        _current(int(hs[i])).values[int(hs[i])] = int(vs[i])


def body_refuses(g: Graph, kind: str) -> bool:
    """Whether body graph ``g`` cannot hold a node of ``kind``."""
    return g.body_of is not None and kind not in BODY_KINDS
