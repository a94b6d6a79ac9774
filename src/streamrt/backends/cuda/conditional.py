"""Conditional nodes of the cuda backend: a frontend conditional node built as a native CUDA one
(``cudaGraphConditionalHandleCreate``, ``cudaGraphAddNode`` of a ``cudaGraphNodeTypeConditional``
node), its bodies built the way the top graph is (:meth:`.NativeGraph._add`, recursively).

streamrt's value of a handle lives at ``h.ptr``, a device ``uint64`` any kernel or copy may write
(ACL's model, API.md §9.1); CUDA's lives in its handle, set only by ``cudaGraphSetConditional``
in device code or by the handle's default. Invariants bridging the two:

- each frontend conditional node gets a CUDA handle of its own, made on the CUDA graph that
  holds the node, without a CUDA default;
- a *bridge* kernel (:data:`BRIDGE`: ``cudaGraphSetConditional(handle, *h.ptr)``) runs right
  before the node (it takes the node's dependencies, the node depends on it alone), and for
  WHILE at the end of its body (after every sink of the body), so CUDA's value is a copy of
  ``*h.ptr`` read after everything ordered before the node (or before the next test) wrote it:
  CUDA evaluates the condition exactly where streamrt's replay reads ``h.ptr``;
- the copy saturates at ``2**32 - 1`` (CUDA's values are ``unsigned int``): not 0 stays not 0,
  and ``v >= size`` of a SWITCH stays ``>= size``, so every kind takes the same branch;
- a handle's ``default`` is written to ``h.ptr`` at the start of every launch
  (``cudaGraphCondAssignDefault``'s semantics on streamrt's value) by a :data:`DEFAULT` kernel
  node, one per handle with a default, which every root node of the top graph depends on.

Version gate: IF (one body) and WHILE need cuda-bindings 12.4, IF with an else body and SWITCH
12.8 (:func:`refusal`); below that instantiate refuses the node (NODE_OPERATION_NOT_SUPPORTED).
A graph holding conditional nodes takes updates by being built again (:meth:`.NativeGraph.update`
returns False for them and for their body nodes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...graph.compile import flatten
from ...graph.conditional import ConditionalType
from ...graph.instantiate import GraphInstantiateResult, refuse
from ...graph.node import NodeType
from ...kernel import Kernel
from ...validate import is_int
from .errors import check
from .runtime import rt

if TYPE_CHECKING:
    from ...graph.conditional import ConditionalHandle
    from ...graph.node import Node
    from .graph import NativeGraph

__all__ = ["BRIDGE", "DEFAULT", "add_node", "bindings_version", "defaults", "refusal"]

IF_WHILE = (12, 4)  # cuda-bindings with conditional nodes: IF (one body), WHILE
ELSE_SWITCH = (12, 8)  # IF with an else body, SWITCH


def _device_only(ctx: Any, *args: Any) -> None:
    raise AssertionError("a cuda backend kernel of its own: it runs only as CUDA C")


BRIDGE = Kernel(_device_only, name="streamrt_cond_bridge", signature="u64, ptr", cuda=r"""
extern "C" __device__ void cudaGraphSetConditional(unsigned long long handle, unsigned int value);
// streamrt's value (the uint64 at h.ptr) into the CUDA handle of its conditional node, saturated
// at 2^32 - 1: not 0 stays not 0, a SWITCH index past the bodies stays past them
extern "C" __global__ void streamrt_cond_bridge(unsigned long long handle,
                                                const unsigned long long* value) {
    const unsigned long long v = *value;
    cudaGraphSetConditional(handle, v > 0xffffffffull ? 0xffffffffu : (unsigned int)v);
}
""")

DEFAULT = Kernel(_device_only, name="streamrt_cond_default", signature="ptr, u64", cuda=r"""
// a handle's default, written to h.ptr at the start of a launch
extern "C" __global__ void streamrt_cond_default(unsigned long long* value,
                                                 unsigned long long d) {
    *value = d;
}
""")


def _installed() -> tuple[int, int]:
    import cuda.bindings

    parts = str(getattr(cuda.bindings, "__version__", "0.0")).split(".")
    return int(parts[0]), int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def bindings_version() -> tuple[int, int]:
    """The installed cuda-bindings' (major, minor), for the gate (read at each build: tests
    replace it)."""
    return _installed()


def refusal(kind: ConditionalType, size: int, version: tuple[int, int]) -> str | None:
    """Why cuda-bindings ``version`` cannot build a ``kind`` node of ``size`` bodies, or None."""
    need = IF_WHILE if kind is not ConditionalType.SWITCH and size == 1 else ELSE_SWITCH
    if version >= need:
        return None
    what = "an IF node with an else body" if kind is ConditionalType.IF and size == 2 else \
        f"a {kind.name} node"
    return (f"{what} needs cuda-bindings >= {need[0]}.{need[1]} (cudaGraphAddNode of a "
            f"conditional node), this is {version[0]}.{version[1]}")


def defaults(flat: list[tuple[Node | None, list[int], bool]]) -> list[ConditionalHandle]:
    """The handles with a default of the conditional nodes of ``flat`` and of their bodies, at
    any depth (a handle serves one conditional node: no repeats)."""
    out = []
    for n, _deps, _on in flat:
        if n is not None and n.type is NodeType.CONDITIONAL:
            h = n._params["handle"]
            if h.default is not None:
                out.append(h)
            for body in n._params["bodies"]:
                out += defaults(flatten(body, set()))
    return out


def add_node(ng: NativeGraph, graph: Any, node: Node, deps: list[int]) -> int:
    """Build frontend conditional ``node`` into CUDA graph ``graph`` after ``deps``: its bridge,
    the native node, its bodies (and a WHILE body's closing bridge); returns the native node."""
    p = node._params
    kind = ConditionalType(int(p["kind"]))
    bodies = p["bodies"]
    why = refusal(kind, len(bodies), bindings_version())
    if why is not None:
        raise refuse(GraphInstantiateResult.NODE_OPERATION_NOT_SUPPORTED, node, f"{node!r}: {why}")
    h = p["handle"]
    if h.device._impl is not ng.dev:  # the bridge and default kernels read and write h.ptr
        raise refuse(GraphInstantiateResult.MULTIPLE_DEVICES_NOT_SUPPORTED, node,
                     f"{node!r}: its handle's value is memory of {h.device.name}, the graph runs "
                     f"on cuda:{ng.dev.index} (make the handle with that device current)")
    for body in bodies:
        _refuse_pageable(body)
    ch = check(rt.cudaGraphConditionalHandleCreate(graph, 0, 0))
    bridge = ng._one_thread(graph, deps, BRIDGE, (int(ch), h.ptr))
    params = rt.cudaGraphNodeParams()
    params.type = rt.cudaGraphNodeType.cudaGraphNodeTypeConditional
    c = params.conditional
    c.handle = ch
    c.type = rt.cudaGraphConditionalNodeType(int(kind))
    c.size = len(bodies)
    rdeps = [rt.cudaGraphNode_t(bridge)]
    if _installed() >= (13, 0):  # cudaGraphAddNode took edge data in 13.0 (12.x: _v2)
        made = check(rt.cudaGraphAddNode(graph, rdeps, None, 1, params))
    else:  # pragma: no cover - cuda-bindings 12.x
        made = check(rt.cudaGraphAddNode(graph, rdeps, 1, params))
    for k, body_graph in enumerate(params.conditional.phGraph_out):  # CUDA-owned, one per body
        out = rt.cudaGraph_t(int(body_graph))
        flat = flatten(bodies[k], set())
        built: list[int] = []
        for n, ds, _on in flat:
            built.append(ng._add(out, n, [built[d] for d in ds], -1))
            if n is not None:
                ng._nested.add(n)
        if kind is ConditionalType.WHILE:  # the next test reads what this trip wrote
            inner = {d for _n, ds, _on in flat for d in ds}
            ng._one_thread(out, [m for i, m in enumerate(built) if i not in inner], BRIDGE,
                           (int(ch), h.ptr))
    return int(made)


def _refuse_pageable(body: Any) -> None:
    """A copy of pageable host memory in a body (CUDA takes device and pinned memory there)."""
    for n in body._walk():
        if n.type is NodeType.MEMCPY and not all(
                is_int(x) for x in (n._params["dst"], n._params["src"])):
            raise refuse(GraphInstantiateResult.NODE_OPERATION_NOT_SUPPORTED, n,
                         f"{n!r} copies host memory that is not pinned: CUDA takes device and "
                         "pinned memory in a conditional body")
