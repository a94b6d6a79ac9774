"""The cpu backend's graph runner: a flattened graph replayed as one stream operation.

State and invariants:
- A :class:`Replay` is the DAG cut into chains (maximal runs of single-dependency nodes) of
  precomputed ``(fn, args)`` operations (the frontend made them with the queue's ``op_*``
  methods), with each chain's successors and predecessor count. It never changes once made:
  an update or an enable makes a new one, and a launch holds the one it was enqueued with.
- Replaying one chain (or chains that form a single line) is one loop of calls on the stream's
  worker. Independent chains run concurrently on a shared thread pool, each started by the
  thread that finished its last predecessor; each chain runs in a copy of the launching
  thread's context (an observer's current operation goes with it). After a failure no new
  node starts; the first failure is raised to the stream, naming its node.
"""

from __future__ import annotations

import contextvars
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ...labels import NODE_NOTE, WRAPPER, describe
from ..base import GraphRunner, Queue
from . import queues

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from ...graph.node import Node
    from ..base import Flat, NodeOp

_workers: ThreadPoolExecutor | None = None
_workers_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _workers
    if _workers is None:
        with _workers_lock:
            if _workers is None:
                _workers = ThreadPoolExecutor(max(2, os.cpu_count() or 2),
                                              thread_name_prefix="streamrt-graph",
                                              initializer=_in_operations)
    return _workers


def _in_operations() -> None:
    queues.in_operations.on = True  # graph nodes run here: kernels must not synchronize


class Replay(GraphRunner):
    """The compiled replay of one graph for one stream."""

    __slots__ = ("chains", "succ", "npred", "roots", "single")

    def __init__(self, chains: list[list[tuple]], succ: list[list[int]], npred: list[int]) -> None:
        self.chains = chains
        self.succ = succ
        self.npred = npred
        self.roots = [i for i, n in enumerate(npred) if n == 0]
        # one chain, or chains that form a single line: replay is one loop
        self.single = [op for ch in chains for op in ch] if len(chains) == 1 else None

    def op_launch(self, queue: Queue) -> tuple[Callable[..., Any], tuple]:
        return run_replay, (self,)


def build(flat: Flat, op_of: Callable[[int, Node], NodeOp]) -> Replay:
    """Cut a flattened graph into chains of the operations ``op_of`` makes for its nodes."""
    ops = [(op_of(i, n) if n is not None and on else None, deps)
           for i, (n, deps, on) in enumerate(flat)]
    n = len(ops)
    dependents: list[list[int]] = [[] for _ in range(n)]
    for i, (_, deps) in enumerate(ops):
        for d in deps:
            dependents[d].append(i)
    chain_of = [0] * n
    chains: list[list[tuple]] = []
    heads: list[int] = []
    for i, (op, deps) in enumerate(ops):  # flat is topologically ordered
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
        for d in dict.fromkeys(chain_of[d] for d in ops[head][1]):
            succ[d].append(c)
            npred[c] += 1
    if not chains:
        return Replay([[]], [[]], [0])
    return Replay(chains, succ, npred)


def run_replay(replay: Replay) -> None:
    """Stream operation: replay a graph (inline when it is one chain)."""
    ops = replay.single
    if ops is None:
        return _run_parallel(replay)
    for fn, args in (_delayed(ops) if queues.delay_us() else ops):
        try:
            fn(*args)
        except BaseException as exc:
            _in_node(exc, fn, args)
            raise


def _in_node(exc: BaseException, fn: Any, args: tuple) -> BaseException:
    """Name the failing node: the stream reports the whole launch as the operation."""
    if getattr(fn, WRAPPER, False):  # wrapped for an observer: the node's own call
        fn, args = args[1], args[2]
    if fn is not None:
        try:
            exc.add_note(NODE_NOTE + describe(fn, args))
        except Exception:  # ``__notes__`` is not a list: the failure matters, not its label
            pass
    return exc


def _delayed(ops: list[tuple]) -> Iterable[tuple]:
    """Delay injection reaches graph nodes too: a missing edge shows up as a wrong result."""
    for op in ops:
        queues.delay()
        yield op


def _run_parallel(replay: Replay) -> None:
    chains, succ = replay.chains, replay.succ
    remaining = list(replay.npred)
    left = [len(chains)]
    lock = threading.Lock()
    finished = threading.Event()
    errors: list[BaseException] = []
    pool = _pool()

    def run(i: int | None) -> None:
        while i is not None:
            if not errors:
                fn, args = None, ()  # (named in the error only once a node ran)
                try:
                    chain = _delayed(chains[i]) if queues.delay_us() else chains[i]
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
                pool.submit(contextvars.copy_context().run, run, j)
            i = ready[0] if ready else None

    for r in replay.roots[1:]:
        pool.submit(contextvars.copy_context().run, run, r)
    run(replay.roots[0])
    finished.wait()
    if errors:
        raise errors[0]
