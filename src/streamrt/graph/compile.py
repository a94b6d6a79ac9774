"""Compiling an exec's graph for one backend: the DAG flattened, each node's queue operation.

The frontend flattens the graph (child graphs inlined), makes every enabled node's operation
with the launching queue's ``op_*`` methods (kernel contexts, memory endpoints and argument
tuples made once), wraps each with its index, DAG ancestry and creation site while a sanitizer
or tracer is active, and hands the list to the device's ``graph_runner``: the cpu backend
replays those operations, a backend with graphs of its own builds its graph from the nodes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from keyword import iskeyword
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import instrument
from ..backends.base import GraphRunner
from ..eager import endpoint
from ..errors import InvalidValueError
from ..kernel import KernelContext
from ..labels import WRAPPER, fn_label
from ..validate import is_int
from .node import Node, NodeType

if TYPE_CHECKING:
    from ..backends.base import NodeOp
    from ..stream import Stream
    from .graph import Graph

__all__ = ["Compiled", "compile_graph", "flatten", "topo"]


class Compiled(NamedTuple):
    """An exec compiled for a stream (or a device): the backend's runner and, instrumented,
    ``mem``: id(memory node) -> (its index in the launch, bitset of its ancestors, its label)."""

    runner: GraphRunner
    mem: dict[int, tuple[int, int, str]]


def compile_graph(template: Graph, disabled: set[int], stream: Stream) -> Compiled:
    """Flatten ``template`` and instantiate it on ``stream``'s device."""
    flat = flatten(template, disabled)
    nodes = [n for n, _, _ in flat]
    ops_of = _ops_for(stream)
    if not instrument.listeners:
        return Compiled(stream.device._impl.graph_runner(flat, ops_of), {})
    anc = ancestors([deps for _, deps, _ in flat])

    def wrapped(i: int, n: Node) -> NodeOp:
        op = ops_of(i, n)
        if op is None:
            return None
        kind, name, accesses = _describe(n)
        return (_node_call, ((i, node_label(n, template), kind, name, anc[i], accesses, n.site),
                             *op))

    runner = stream.device._impl.graph_runner(flat, wrapped)
    mem = {id(n): (i, anc[i], node_label(n, template)) for i, n in enumerate(nodes)
           if n is not None and n.type in (NodeType.MEM_ALLOC, NodeType.MEM_FREE)}
    return Compiled(runner, mem)


def _node_call(meta: tuple, fn: Any, args: tuple) -> None:
    """An instrumented node: its own OpInfo, nested in the launch, with its DAG ancestry."""
    index, label, kind, name, ancestors, accesses, site = meta
    parent = instrument.current()  # the launch (replays run nodes in a copy of its context)
    if parent is not None and parent.site:
        site = f"{site}, launched at {parent.site}" if site else f"launched at {parent.site}"
    op = instrument.OpInfo(None, kind, name, {}, accesses, site=site)
    op.parent = parent
    op.index, op.node, op.ancestors = index, label, ancestors
    instrument.run(op, fn, args)


setattr(_node_call, WRAPPER, True)  # failure labels name the node's own operation


def ancestors(deps: list[list[int]]) -> list[int]:
    """Every node's ancestors in a flattened graph, as a bitset of indices."""
    anc = [0] * len(deps)
    for i, ds in enumerate(deps):
        acc = 0
        for d in ds:
            acc |= anc[d] | (1 << d)
        anc[i] = acc
    return anc


def _ops_for(stream: Stream) -> Any:
    q = stream._q
    impl = stream.device._impl

    def op_of(i: int, n: Node) -> NodeOp:
        p = n._params
        t = n.type
        if t is NodeType.KERNEL:
            # the node runs on the device it was made for (cudaGraphKernelNodeParams: the
            # context at creation), whichever device's stream launches the graph
            ctx = KernelContext(p["grid"], p["block"], p["device"], stream)
            k = p["kernel"]
            if k.bind is not None and not instrument.listeners:  # views made now, once
                return (direct(k.bind(ctx, *p["args"])), ())
            return q.op_launch(k, ctx, p["args"])
        if t is NodeType.MEMCPY:
            k = p["nbytes"]
            if not k:
                return None
            return q.op_copy(endpoint(impl, p["dst"], k, writable=True),
                             endpoint(impl, p["src"], k, writable=False), k)
        if t is NodeType.MEMSET:
            k = p["nbytes"]
            return q.op_fill(impl.endpoint(p["ptr"], k), p["value"], k) if k else None
        if t is NodeType.HOST:
            return q.op_host(p["fn"], p["args"])
        return None  # EMPTY, events and memory nodes: handled at launch on the host

    return op_of


# (number of positional arguments, keyword names) -> a maker of closures calling with them
_CALLERS: dict[tuple[int, tuple[str, ...]], Callable[..., Callable[[], Any]]] = {}


def direct(bound: Callable[[], Any]) -> Callable[[], Any]:
    """A binder's ``functools.partial`` with keywords as a closure making the same call: a
    partial merges its keywords into a new dict at every call (140 ns on this 2-core VM, where
    ``np.add`` of 256 floats takes 230), a closure passes them as the call's own keywords.
    Anything else, or keywords that are not plain identifiers, is returned as it is."""
    if type(bound) is not functools.partial or not bound.keywords or len(bound.args) > 16:
        return bound
    names = tuple(bound.keywords)
    if not all(type(n) is str and n.isidentifier() and not iskeyword(n) for n in names):
        return bound
    key = (len(bound.args), names)
    make = _CALLERS.get(key)
    if make is None:
        # generated once per shape of call (as namedtuple and dataclasses do): the names are
        # identifiers checked above, and every value is an argument, never source
        pos = [f"a{i}" for i in range(len(bound.args))]
        kws = [f"k_{n}" for n in names]
        src = (f"def make(f, {', '.join([*pos, *kws])}):\n"
               f"    def call():\n"
               f"        return f({', '.join([*pos, *(f'{n}=k_{n}' for n in names)])})\n"
               f"    return call\n")
        space: dict[str, Any] = {}
        exec(src, space)  # noqa: S102
        make = space["make"]
        if len(_CALLERS) < 256:
            _CALLERS[key] = make
    call = make(bound.func, *bound.args, *bound.keywords.values())
    call.__name__ = call.__qualname__ = getattr(bound.func, "__name__", "bound")
    return call  # type: ignore[no-any-return]


def flatten(template: Graph, disabled: set[int]) -> list[tuple[Node | None, list[int], bool]]:
    """The DAG with child graphs inlined, in dependency order: ``(node, deps, enabled)``.

    ``node`` is None for a child graph's exit (a join); ``deps`` are indices into the list.
    """
    flat: list[tuple[Node | None, list[int], bool]] = []

    def inline(graph: Graph, entry_deps: list[int], top: bool) -> list[int]:
        start = len(flat)
        index = [0] * len(graph._nodes)  # node.index -> its position in flat
        for n in topo(graph):
            deps = [index[d.index] for d in n._deps] or list(entry_deps)
            if n.type is NodeType.GRAPH:
                leaves = inline(n._params["graph"], deps, False)
                flat.append((None, leaves, True))
            else:
                flat.append((n, deps, not (top and n.index in disabled)))
            index[n.index] = len(flat) - 1
        # this graph's exits: its entries nothing added since ``start`` depends on
        dependents = {d for _, deps, _ in flat[start:] for d in deps}
        return [i for i in index if i not in dependents] or list(entry_deps)

    inline(template, [], True)
    return flat


def topo(graph: Graph) -> list[Node]:
    """Kahn's order, ties by creation order; the builder guarantees acyclicity. Indexed by
    ``node.index``, which is the node's position in ``graph._nodes`` (nodes are only added)."""
    nodes = graph._nodes
    npred = [len(n._deps) for n in nodes]
    ready = [n for n in nodes if not n._deps]
    i = 0
    while i < len(ready):
        n = ready[i]
        i += 1
        for d in n._dependents:
            k = d.index
            npred[k] -= 1
            if not npred[k]:
                ready.append(d)
    if len(ready) != len(nodes):
        raise InvalidValueError(f"{graph!r} has a cycle")
    return ready


def node_label(n: Node, top: Graph) -> str:
    """How findings and traces name a node: its creation index, as ``g.nodes()`` lists it."""
    return f"#{n.index}" if n.graph is top else f"#{n.index} of a child graph"


def _describe(n: Node) -> tuple[str, str, tuple]:
    p = n._params
    if n.type is NodeType.MEMCPY:
        acc = tuple((int(x), p["nbytes"], w) for x, w in ((p["dst"], True), (p["src"], False))
                    if is_int(x))
        return "memcpy", f"memcpy {p['nbytes']} B", acc
    if n.type is NodeType.MEMSET:
        return "memset", f"memset {p['nbytes']} B", ((p["ptr"], p["nbytes"], True),)
    if n.type is NodeType.HOST:
        return "host", fn_label(p["fn"]), ()
    return "kernel", p["kernel"].name, ()
