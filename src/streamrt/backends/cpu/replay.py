"""The cpu backend's graph runner: a flattened graph replayed as one stream operation.

State and invariants:
- A :class:`Replay` is the DAG cut into chains (maximal runs of single-dependency nodes) of
  precomputed ``(fn, args)`` operations (the frontend made them with the queue's ``op_*``
  methods), numbered in a topological order, with each chain's predecessor chains. It never
  changes once made: an update or an enable makes a new one, and a launch holds the one it was
  enqueued with.
- Replaying one chain (or chains that form a single line) is one loop of calls on the stream's
  worker. Otherwise the worker walks the chains in their order and runs each inline (tiny nodes
  cost what a chain costs); helper threads (schedule.py) may take ready chains meanwhile,
  which they get to as soon as the worker releases the GIL: in a GIL-releasing or blocking
  node, so heavy and blocking branches overlap, while tiny ones stay on the worker.
- Each helper runs in a copy of the launching thread's context (an observer's current
  operation goes with it). After a failure no new chain starts; the first failure is raised
  to the stream, naming its node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...labels import NODE_NOTE, WRAPPER, describe
from ..base import GraphRunner, Queue
from . import queues
from .schedule import Run

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from ...graph.node import Node
    from ..base import Flat, NodeOp


class Replay(GraphRunner):
    """The compiled replay of one graph for one stream."""

    __slots__ = ("chains", "preds", "single")

    def __init__(self, chains: list[list[tuple]], preds: list[list[int]]) -> None:
        self.chains = chains
        self.preds = preds  # a chain's predecessors all have lower numbers
        # one chain, or chains that form a single line: replay is one loop
        line = all(p == [c - 1] for c, p in enumerate(preds) if c) and len(preds[0]) == 0
        self.single = [op for ch in chains for op in ch] if line else None

    def op_launch(self, queue: Queue) -> tuple[Callable[..., Any], tuple]:
        if self.single is not None and len(self.single) == 1:
            return _run_one, self.single[0]  # one node: its call, without the loop
        return run_replay, (self,)


def build(flat: Flat, op_of: Callable[[int, Node], NodeOp]) -> Replay:
    """Cut a flattened graph into chains of the operations ``op_of`` makes for its nodes."""
    ops = [(op_of(i, n) if n is not None and on else None, deps)
           for i, (n, deps, on) in enumerate(flat)]
    n = len(ops)
    dependents = [0] * n
    for _, deps in ops:
        for d in deps:
            dependents[d] += 1
    chain_of = [0] * n
    chains: list[list[tuple]] = []
    preds: list[list[int]] = []
    for i, (op, deps) in enumerate(ops):  # flat is topologically ordered, so are the chains
        if len(deps) == 1 and dependents[deps[0]] == 1:
            c = chain_of[deps[0]]
        else:
            c = len(chains)
            chains.append([])
            preds.append(list(dict.fromkeys(chain_of[d] for d in deps)))
        chain_of[i] = c
        if op is not None:
            chains[c].append(op)
    if not chains:
        return Replay([[]], [[]])
    return Replay(chains, preds)


def run_replay(replay: Replay) -> None:
    """Stream operation: replay a graph (inline when it is one chain)."""
    ops = replay.single
    if ops is None:
        return _run_parallel(replay)
    fn: Any = None
    args: tuple = ()
    try:  # the loop variables name the failing node
        for fn, args in (_delayed(ops) if queues.delay_us() else ops):
            fn(*args)
    except BaseException as exc:
        _in_node(exc, fn, args)
        raise


def _run_one(fn: Callable[..., Any], args: tuple) -> None:
    """Stream operation: replay a graph of one node (delay injection as for every node)."""
    if queues._delay_us:  # (read directly: this is a launch's whole cost on the worker)
        queues.delay()
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


def run_chain(run: Run, c: int) -> None:
    """Run chain ``c`` (on a helper: see schedule.py), recording a failure; mark it done."""
    fn: Any = None
    args: tuple = ()
    ops = run.chains[c]
    try:
        for fn, args in (_delayed(ops) if queues.delay_us() else ops):
            fn(*args)
    except BaseException as exc:  # stop the replay; reported by the stream
        run.errors.append(_in_node(exc, fn, args))
    run.finished(c)


def _run_parallel(replay: Replay) -> None:
    """The worker's walk: every chain in order, inline, unless a helper took it first."""
    run = Run(replay.chains, replay.preds, run_chain)
    preds, done, errors = replay.preds, run.done, run.errors
    claim = run.claimed.setdefault  # one C call: the worker and a helper never both win
    chains: Iterable[Iterable[tuple]] = replay.chains
    if queues.delay_us():
        chains = _delaying(replay.chains)
    theirs: list[int] = []  # chains a helper took
    run.start()  # helpers may take chains, should a branch release the GIL or block
    fn: Any = None  # (the failing node's, named in the error; a chain fails only once it ran)
    args: tuple = ()
    c = 0
    try:
        for c, ops in enumerate(chains):
            if errors:
                break
            run.pos = c
            if claim(c, False) is not False:  # a helper's token
                theirs.append(c)
                continue
            if theirs:  # a predecessor may be a helper's, still running
                for p in preds[c]:
                    if not done[p]:
                        run.wait_for(p)
            try:
                for fn, args in ops:
                    fn(*args)
            except BaseException as exc:
                errors.append(_in_node(exc, fn, args))
            done[c] = True
    finally:
        for k in range(c, len(done)):  # after a failure: claimed, so that no helper starts them
            claim(k, False)
        for k in theirs:
            if not done[k]:
                run.wait_for(k)
        run.end()
    if errors:
        raise errors[0]


def _delaying(chains: list[list[tuple]]) -> Iterable[Iterable[tuple]]:
    """Each chain's operations, each after an injected delay."""
    for ops in chains:
        yield _delayed(ops)
