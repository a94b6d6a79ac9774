"""Replay plans: a graph flattened, compiled for one stream, and run as one stream operation.

A plan is the DAG with child graphs inlined, cut into chains (maximal runs of single-dependency
nodes); every kernel context, memory view and argument tuple is precomputed, so replaying a
chain is one loop of ``fn(*args)`` calls. Independent chains run concurrently on a small thread
pool, each chain started when its last predecessor finished. With a sanitizer or tracer active,
every node is wrapped with its index, DAG ancestry and creation site.
"""

from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import instrument
from ..backends import cpu
from ..backends.cpu import SPACE, copy_op, fill_op, host_call
from ..errors import InvalidValueError
from ..kernel import KernelContext
from ..validate import host_view, is_int
from .node import Node, NodeType

if TYPE_CHECKING:
    from ..stream import Stream
    from .graph import Graph

__all__ = ["Plan", "compile_plan", "flatten", "run_plan", "topo"]

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _workers() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(max(2, os.cpu_count() or 2),
                                           thread_name_prefix="streamrt-graph",
                                           initializer=_in_operations)
    return _pool


def _in_operations() -> None:
    cpu.in_operations.on = True  # graph nodes run here: kernels must not synchronize


class Plan:
    """The compiled replay of one exec for one stream."""

    __slots__ = ("chains", "succ", "npred", "roots", "single", "mem")

    def __init__(self, chains: list[list[tuple]], succ: list[list[int]], npred: list[int]) -> None:
        # instrumented: id(memory node) -> (its index in the launch, bitset of its ancestors,
        # its label)
        self.mem: dict[int, tuple[int, int, str]] = {}
        self.chains = chains
        self.succ = succ
        self.npred = npred
        self.roots = [i for i, n in enumerate(npred) if n == 0]
        # one chain, or chains that form a single line: replay is one loop
        self.single = [op for ch in chains for op in ch] if len(chains) == 1 else None


def run_plan(plan: Plan) -> None:
    """Stream operation: replay a plan (inline when it is one chain)."""
    ops = plan.single
    if ops is not None:
        if instrument.listeners:
            _launch_tls.parent = instrument.current()
        if cpu.delay_us():
            ops = _delayed(ops)
        for fn, args in ops:
            try:
                fn(*args)
            except BaseException as exc:
                _in_node(exc, fn, args)
                raise
        return
    _run_parallel(plan)


def _in_node(exc: BaseException, fn: Any, args: tuple) -> BaseException:
    """Name the failing node: the stream reports the whole launch as the operation."""
    if fn is _node_call:  # instrumented: the node's own call
        fn, args = args[1], args[2]
    if fn is not None:
        try:
            exc.add_note(f"in graph node: {cpu.describe(fn, args)}")
        except Exception:  # ``__notes__`` is not a list: the failure matters, not its label
            pass
    return exc


def _delayed(ops: list[tuple]) -> Any:
    """Delay injection reaches graph nodes too: a missing edge shows up as a wrong result."""
    for op in ops:
        time.sleep(random.random() * cpu.delay_us() * 1e-6)
        yield op


_launch_tls = threading.local()  # the graph launch an instrumented node belongs to


def _node_call(meta: tuple, fn: Any, args: tuple) -> None:
    """An instrumented node: its own OpInfo, nested in the launch, with its DAG ancestry."""
    index, label, kind, name, ancestors, accesses, site = meta
    parent = getattr(_launch_tls, "parent", None)
    if parent is not None and parent.site:
        site = f"{site}, launched at {parent.site}" if site else f"launched at {parent.site}"
    op = instrument.OpInfo(None, kind, name, {}, accesses, site=site)
    op.parent = parent
    op.index, op.node, op.ancestors = index, label, ancestors
    instrument.run(op, fn, args)


def _run_parallel(plan: Plan) -> None:
    chains, succ = plan.chains, plan.succ
    remaining = list(plan.npred)
    left = [len(chains)]
    lock = threading.Lock()
    finished = threading.Event()
    errors: list[BaseException] = []
    pool = _workers()

    parent = instrument.current() if instrument.listeners else None

    def run(i: int) -> None:
        _launch_tls.parent = parent
        while i is not None:
            if not errors:
                fn, args = None, ()  # (named in the error only once a node ran)
                try:
                    chain = _delayed(chains[i]) if cpu.delay_us() else chains[i]
                    for fn, args in chain:
                        fn(*args)
                except BaseException as exc:  # stop the replay; reported by the stream
                    errors.append(_in_node(exc, fn, args))
            ready = []
            with lock:
                for j in succ[i]:
                    remaining[j] -= 1
                    if remaining[j] == 0:
                        ready.append(j)
                left[0] -= 1
                if left[0] == 0:
                    finished.set()
            for j in ready[1:]:
                pool.submit(run, j)
            i = ready[0] if ready else None

    for r in plan.roots[1:]:
        pool.submit(run, r)
    run(plan.roots[0])
    finished.wait()
    if errors:
        raise errors[0]


def flatten(template: Graph, disabled: set[int]) -> list[tuple[Node | None, list[int], bool]]:
    """The DAG with child graphs inlined, in dependency order: ``(node, deps, enabled)``.

    ``node`` is None for a child graph's exit (a join); ``deps`` are indices into the list.
    """
    flat: list[tuple[Node | None, list[int], bool]] = []

    def inline(graph: Graph, entry_deps: list[int], top: bool) -> list[int]:
        index: dict[int, int] = {}
        for n in topo(graph):
            deps = [index[d.index] for d in n._deps] or list(entry_deps)
            if n.type is NodeType.GRAPH:
                leaves = inline(n._params["graph"], deps, False)
                flat.append((None, leaves, True))
            else:
                flat.append((n, deps, not (top and n.index in disabled)))
            index[n.index] = len(flat) - 1
        dependents = {d for _, deps, _ in flat for d in deps}
        return [i for i in index.values() if i not in dependents] or list(entry_deps)

    inline(template, [], True)
    return flat


def compile_plan(template: Graph, disabled: set[int], stream: Stream) -> Plan:
    """Flatten ``template`` (child graphs inlined), precompute every node's op, cut chains."""
    nodes = flatten(template, disabled)
    flat: list[tuple[Any, list[int]]] = [
        (op_of(n, stream) if n is not None and on else None, deps) for n, deps, on in nodes]
    if not instrument.listeners:
        return chains_of(flat)
    flat, anc = instrumented(flat, [n for n, _, _ in nodes], template)
    plan = chains_of(flat)
    plan.mem = {id(n): (i, anc[i], node_label(n, template)) for i, (n, _, _) in enumerate(nodes)
                if n is not None and n.type in (NodeType.MEM_ALLOC, NodeType.MEM_FREE)}
    return plan


def topo(graph: Graph) -> list[Node]:
    """Kahn's order, ties by creation order; the builder guarantees acyclicity."""
    npred = {id(n): len(n._deps) for n in graph._nodes}
    ready = [n for n in graph._nodes if not n._deps]
    out: list[Node] = []
    i = 0
    while i < len(ready):
        n = ready[i]
        i += 1
        out.append(n)
        for d in n._dependents:
            npred[id(d)] -= 1
            if npred[id(d)] == 0:
                ready.append(d)
    if len(out) != len(graph._nodes):
        raise InvalidValueError(f"{graph!r} has a cycle")
    return out


def node_label(n: Node, top: Graph) -> str:
    """How findings and traces name a node: its creation index, as ``g.nodes()`` lists it."""
    return f"#{n.index}" if n.graph is top else f"#{n.index} of a child graph"


def instrumented(flat: list[tuple[Any, list[int]]], nodes: list[Node | None], top: Graph
                 ) -> tuple[list[tuple[Any, list[int]]], list[int]]:
    """Wrap every node op with its index, name, ancestors and declared memory (for the
    sanitizer and traces); also returns every node's ancestor bitset."""
    anc = [0] * len(flat)
    out = []
    for i, (op, deps) in enumerate(flat):
        acc = 0
        for d in deps:
            acc |= anc[d] | (1 << d)
        anc[i] = acc
        n = nodes[i]
        if op is not None and n is not None:
            kind, name, accesses = _describe(n)
            site = n.site
            op = (_node_call, ((i, node_label(n, top), kind, name, acc, accesses, site), *op))
        out.append((op, deps))
    return out, anc


def _describe(n: Node) -> tuple[str, str, tuple]:
    p = n._params
    if n.type is NodeType.MEMCPY:
        acc = tuple((int(x), p["nbytes"], w) for x, w in ((p["dst"], True), (p["src"], False))
                    if is_int(x))
        return "memcpy", f"memcpy {p['nbytes']} B", acc
    if n.type is NodeType.MEMSET:
        return "memset", f"memset {p['nbytes']} B", ((p["ptr"], p["nbytes"], True),)
    if n.type is NodeType.HOST:
        return "host", instrument.fn_label(p["fn"]), ()
    return "kernel", p["kernel"].name, ()


def op_of(n: Node, stream: Stream) -> tuple | None:
    p = n._params
    t = n.type
    if t is NodeType.KERNEL:
        # the node runs on the device it was made for (cudaGraphKernelNodeParams: the context
        # at creation), whichever device's stream launches the graph
        ctx = KernelContext(p["grid"], p["block"], p["device"], stream)
        k = p["kernel"]
        if k.bind is not None and not instrument.listeners:  # views made now, once
            return (k.bind(ctx, *p["args"]), ())
        return (k.fn, (ctx, *p["args"]))
    if t is NodeType.MEMCPY:
        k = p["nbytes"]
        if not k:
            return None
        return (copy_op, (_view(p["dst"], k, True), _view(p["src"], k, False)))
    if t is NodeType.MEMSET:
        return (fill_op, (SPACE.span(p["ptr"], p["nbytes"]), p["value"])) if p["nbytes"] else None
    if t is NodeType.HOST:
        return (host_call, (p["fn"], p["args"]))
    return None  # EMPTY, events and memory nodes: handled at launch on the host


def _view(end: Any, n: int, writable: bool) -> np.ndarray:
    if is_int(end):
        return SPACE.span(int(end), n)
    return host_view(end, n, writable=writable)  # by reference: read when the node runs


def chains_of(flat: list[tuple[Any, list[int]]]) -> Plan:
    n = len(flat)
    dependents: list[list[int]] = [[] for _ in range(n)]
    for i, (_, deps) in enumerate(flat):
        for d in deps:
            dependents[d].append(i)
    chain_of = [0] * n
    chains: list[list[tuple]] = []
    heads: list[int] = []
    for i, (op, deps) in enumerate(flat):  # flat is topologically ordered
        if len(deps) == 1 and len(dependents[deps[0]]) == 1:
            c = chain_of[deps[0]]
        else:
            c = len(chains)
            chains.append([])
            heads.append(i)
        chain_of[i] = c
        if op is not None:
            chains[c].append(op)
    succ: list[list[int]] = [[] for _ in chains]
    npred = [0] * len(chains)
    for c, head in enumerate(heads):
        for d in dict.fromkeys(chain_of[d] for d in flat[head][1]):
            succ[d].append(c)
            npred[c] += 1
    if not chains:
        return Plan([[]], [[]], [0])
    return Plan(chains, succ, npred)
