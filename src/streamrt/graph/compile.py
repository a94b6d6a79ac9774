"""Compiling an exec's graph for one backend: the DAG flattened, each node's queue operation.

The frontend flattens the graph (child graphs inlined), makes every enabled node's operation
with the launching queue's ``op_*`` methods (kernel contexts, memory endpoints and argument
tuples made once), wraps each with its index, DAG ancestry and creation site while a sanitizer
or tracer is active, and hands the list to the device's ``graph_runner``: the cpu backend
replays those operations, a backend with graphs of its own builds its graph from the nodes.
Event nodes have no operation: the backend makes them (bound at each launch, eventnodes.py),
with the marks of the exec's record points.
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
from . import conditional, eventnodes
from .node import Node, NodeType

if TYPE_CHECKING:
    from ..backends.base import NodeOp
    from ..device import Device
    from ..stream import Stream
    from .eventnodes import EventNodes, Point
    from .graph import Graph

__all__ = ["Compiled", "Nested", "compile_graph", "flatten", "reach", "reaches", "topo"]


class Compiled(NamedTuple):
    """An exec compiled for a stream (or a device): the backend's runner, instrumented ``mem``:
    id(memory node) -> (its index in the launch, its place in the DAG (:func:`reach`), its
    label), and its event nodes (``eventnodes.EventNodes``, None: it has none)."""

    runner: GraphRunner
    mem: dict[int, tuple[int, int, str]]
    events: EventNodes | None = None


def compile_graph(template: Graph, disabled: set[int], stream: Stream,
                  point: Callable[[int, Node, Device], Point] | None = None, *,
                  use_node_priority: bool = False) -> Compiled:
    """Flatten ``template`` and instantiate it on ``stream``'s device; ``point`` makes the
    record points of its record nodes (None: it has no event nodes), ``use_node_priority``:
    ``cudaGraphInstantiateFlagUseNodePriority``, for the device's graph runner."""
    flat = flatten(template, disabled)
    nodes = [n for n, _, _ in flat]
    impl = stream.device._impl
    anc = reach([deps for _, deps, _ in flat]) if instrument.listeners else None
    events = None if point is None else eventnodes.plan(flat, anc, stream.device, point)
    marks = {} if events is None else events.marks
    # the handles of its conditional nodes (an update may bring another graph's) and those made
    # for it: its kernels may set them, wherever they lie in the graph (ctx.set_condition)
    used = list(dict.fromkeys(n._params["handle"] for n in template._marked((NodeType.CONDITIONAL,))))
    conds = frozenset((*used, *conditional.tree_handles(template)[0])) if used else frozenset()
    ops_of = _Level(stream, anc is not None).ops(anc, conds, lambda n: node_label(n, template),
                                                 None)
    runner = impl.graph_runner(flat, ops_of, marks, use_node_priority=use_node_priority)
    if used and not impl.graph_conditionals_native:
        prologue = conditional.defaults_op(used, anc is not None)
        if prologue is not None:
            runner = _Prologue(runner, prologue)
    if anc is None:
        return Compiled(runner, {}, events)
    mem = {id(n): (i, anc[i], node_label(n, template)) for i, n in enumerate(nodes)
           if n is not None and n.type in (NodeType.MEM_ALLOC, NodeType.MEM_FREE)}
    return Compiled(runner, mem, events)


class _Level:
    """Makes the operations of one graph level (the flattened graph, or a conditional node's
    body) for a replaying backend: bodies are compiled into runners of their own, and a
    conditional node's operation runs them (conditional.run)."""

    def __init__(self, stream: Stream, instrumented: bool) -> None:
        self.stream = stream
        self.instrumented = instrumented

    def ops(self, anc: list[Reach] | None, conds: frozenset, label: Callable[[Node], str],
            outer: int | None) -> Callable[[int, Node], NodeOp]:
        """``op_of`` for a level: ``anc`` its DAG places (instrumented), ``conds`` the handles
        its kernels may set, ``label`` how findings name its nodes, ``outer`` the index in the
        launch of the conditional node a body belongs to (None: the top level)."""
        base = _ops_for(self.stream, conds,
                        lambda i, n: self.conditional(i, n, anc, conds, label, outer))
        if anc is None:
            return base

        def wrapped(i: int, n: Node) -> NodeOp:
            op = base(i, n)
            if op is None or n.type is NodeType.CONDITIONAL:  # its body nodes are the nodes
                return op
            kind, name, accesses = _describe(n)
            return (_node_call, ((i if outer is None else outer, label(n), kind, name, anc[i],
                                  accesses, n.site), *op))

        return wrapped

    def conditional(self, i: int, n: Node, anc: list[Reach] | None, conds: frozenset,
                    label: Callable[[Node], str], outer: int | None) -> NodeOp:
        """A conditional node's operation: its bodies compiled, run as the value says."""
        p = n._params
        impl = self.stream.device._impl
        index = i if outer is None else outer
        here = label(n)
        ops = []
        for k, body in enumerate(p["bodies"]):
            flat = flatten(body, set())
            banc = reach([deps for _, deps, _ in flat]) if self.instrumented else None

            def name(m: Node, body: Graph = body, k: int = k) -> str:
                inner = f"#{m.index}" if m.graph is body else f"#{m.index} of a child graph"
                return f"{inner} of body {k} of {here}"

            runner = impl.graph_runner(
                flat, self.ops(banc, conds, name, index), {})
            ops.append(runner.op_launch(self.stream._q))
        h = p["handle"]
        return (conditional.run, (h, h.cell(), int(p["kind"]), tuple(ops),
                                  None if anc is None else (index, here, anc[i])))


class _Prologue(GraphRunner):
    """A replaying backend's runner with the handles' defaults written first at each launch."""

    __slots__ = ("runner", "prologue")

    def __init__(self, runner: GraphRunner, prologue: tuple) -> None:
        self.runner = runner
        self.prologue = prologue

    def op_launch(self, queue: Any, events: tuple = ()) -> tuple[Callable[..., Any], tuple]:
        fn, args = self.runner.op_launch(queue, events)
        return _prologued, (self.prologue, fn, args)

    def upload(self, queue: Any) -> None:
        self.runner.upload(queue)

    def update(self, node: Node) -> bool:
        return self.runner.update(node)

    def set_enabled(self, node: Node, enabled: bool) -> bool:
        return self.runner.set_enabled(node, enabled)


def _prologued(prologue: tuple, fn: Callable[..., Any], args: tuple) -> None:
    """Stream operation: the defaults, then the graph."""
    prologue[0](*prologue[1])
    fn(*args)


def _node_call(meta: tuple, fn: Any, args: tuple) -> None:
    """An instrumented node: its own OpInfo, nested in the launch, with its DAG ancestry."""
    index, label, kind, name, ancestors, accesses, site = meta
    nest = conditional.NEST.get()
    if nest is not None:  # a body node: its place in the launch is below its conditional node's
        ancestors = Nested(nest[0], nest[1], ancestors)
    parent = instrument.current()  # the launch (replays run nodes in a copy of its context)
    op = instrument.OpInfo(None, kind, name, {}, accesses, site=site)  # (site: see OpInfo.site)
    op.parent = parent
    op.index, op.node, op.ancestors = index, label, ancestors
    instrument.run(op, fn, args)


setattr(_node_call, WRAPPER, True)  # failure labels name the node's own operation


# a node's place in its flattened graph's DAG, for the sanitizer: (its chain, its index in the
# chain, what it knows of the other chains: chain -> the highest index among its ancestors)
Reach = tuple[int, int, dict[int, int]]
_NOTHING: dict[int, int] = {}


def reach(deps: list[list[int]]) -> list[Reach]:
    """Every node's :data:`Reach` in a flattened graph (``deps``: its dependencies' indices, in
    topological order): ``reaches(r[a], r[x])`` tells whether a is an ancestor of x.

    The nodes are covered by chains, each a path (a node extends the chain whose tail is one of
    its dependencies); a node knows, per other chain, the furthest node of it among its
    ancestors, as a vector clock. Knowledge is shared, not copied: a node extending its one
    dependency's chain shares that dependency's dict, and the other children of a node share
    one dict made for them. A chain whose tail a join covers is free for the join's
    descendants to take up again, so a fork/join graph needs as many chains as it is wide, and
    its memory grows with its nodes times its width, never with its nodes squared."""
    out: list[Reach] = []
    tails: list[int] = []  # chain -> the node at its tail
    free: list[list[tuple[int, int]]] = []  # node -> chains free below it: (chain, its tail)
    known: dict[int, dict[int, int]] = {}  # node -> its dict and its own place, made when asked

    def knowledge(d: int) -> dict[int, int]:
        k = known.get(d)
        if k is None:
            c, i, b = out[d]
            k = known[d] = {**b, c: i}
        return k

    for i, ds in enumerate(deps):
        chain, idx = -1, 0
        for d in ds:
            c = out[d][0]
            if tails[c] == d:  # d is its chain's tail: i extends that chain
                chain, idx = c, out[d][1] + 1
                break
        if not ds:
            base = _NOTHING
            mine: list[tuple[int, int]] = []
        elif len(ds) == 1:
            d = ds[0]
            base = out[d][2] if chain == out[d][0] else knowledge(d)
            mine = free[d]  # shared: the chains free below d are free below i
        else:
            base = {}
            merged: set[int] = set()
            for d in ds:
                c, k, b = out[d]
                if id(b) not in merged:
                    merged.add(id(b))
                    for cc, kk in b.items():
                        if base.get(cc, -1) < kk:
                            base[cc] = kk
                if base.get(c, -1) < k:
                    base[c] = k
            # the deps' chains end here (their tails are ancestors of i): free below i
            mine = [(out[d][0], d) for d in ds if tails[out[d][0]] == d and out[d][0] != chain]
        if chain < 0:
            while mine:
                c, t = mine.pop()
                if tails[c] == t:  # still ending at that ancestor: i continues it
                    chain, idx = c, out[t][1] + 1
                    break
            else:
                chain = len(tails)
                tails.append(-1)
        tails[chain] = i
        out.append((chain, idx, base))
        free.append(mine)
    return out


class Nested(NamedTuple):
    """A body node's place in its launch: its conditional node's place (``outer``, a
    :data:`Reach` or a Nested), the number of the body execution it ran in (``run``: those of one
    conditional node run one after another, in that order) and its place in its body."""

    outer: Any
    run: int
    inner: Reach


def reaches(a: Reach | Nested, x: Reach | Nested) -> bool:
    """Whether the node at ``a`` is an ancestor of the node at ``x`` (see :func:`reach`)."""
    if a.__class__ is Nested or x.__class__ is Nested:
        return _nested_reaches(a, x)
    if a[0] == x[0]:
        return a[1] < x[1]
    return x[2].get(a[0], -1) >= a[1]  # type: ignore[union-attr]


def _depth(r: Any) -> int:
    d = 0
    while r.__class__ is Nested:
        r = r.outer
        d += 1
    return d


def _nested_reaches(a: Any, x: Any) -> bool:
    """:func:`reaches` where a body node is involved: a body node is ordered as its conditional
    node is against nodes outside it; inside one conditional node, an earlier body execution
    precedes a later one whole, and within one execution the body's DAG orders."""
    da, dx = _depth(a), _depth(x)
    while da > dx:  # a lies deeper: compare the conditional node execution it is in
        if a.outer is x:
            return True  # a runs inside x (only a conditional node holds bodies)
        a, da = a.outer, da - 1
    while dx > da:
        if x.outer is a:
            return False
        x, dx = x.outer, dx - 1
    if da == 0:
        return reaches(a, x)
    if a.outer is x.outer:  # one conditional node execution
        if a.run != x.run:
            return a.run < x.run  # type: ignore[no-any-return]
        return reaches(a.inner, x.inner)
    return reaches(a.outer, x.outer)


def _ops_for(stream: Stream, conds: frozenset = frozenset(),
             cond_op: Callable[[int, Node], NodeOp] | None = None) -> Any:
    """``op_of`` for a replaying backend: ``conds`` the handles kernels may set
    (``ctx.set_condition``), ``cond_op`` the operation of a conditional node."""
    q = stream._q
    impl = stream.device._impl

    def op_of(i: int, n: Node) -> NodeOp:
        p = n._params
        t = n.type
        if t is NodeType.KERNEL:
            # the node runs on the device it was made for (cudaGraphKernelNodeParams: the
            # context at creation), whichever device's stream launches the graph
            ctx = KernelContext(p["grid"], p["block"], p["device"], stream,
                                p.get("shared_mem", 0))
            if conds:
                ctx._conds = conds
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
        if t is NodeType.CONDITIONAL and cond_op is not None:
            return cond_op(i, n)
        return None  # EMPTY and memory nodes (handled at launch on the host); event nodes
        # are the backend's own (bound at launch: eventnodes.py)

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
