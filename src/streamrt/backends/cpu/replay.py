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
- Event nodes act where they sit (API.md §9.1), bound per launch (``op_launch``'s ``events``:
  a :class:`_Launch` holds the launch's copies of the chains they are in). A record node is a
  call of its mark's ``record``, made again as the launch ends, however it ends (a failure
  stops the replay before later nodes, and a stream waiting for the mark would wait forever).
  A wait node starts a chain of its own, gated (schedule.py): its chain runs once the queue
  it waits for got there, and until then the worker runs what else is ready.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...graph.node import NodeType
from ...labels import NODE_NOTE, WRAPPER, describe
from ..base import GraphRunner, Queue
from . import queues
from .schedule import Run

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from ...graph.node import Node
    from ..base import Flat, Mark, NodeOp

# an event node's place: (its chain, its index there, its index in ``single`` or -1, the mark of
# a record node or None for a wait node)
_Slot = tuple[int, int, int, "Mark | None"]


class Replay(GraphRunner):
    """The compiled replay of one graph for one stream."""

    __slots__ = ("chains", "preds", "single", "slots", "gated")
    gates: list | None = None  # (a _Launch's: see schedule.Run)
    finish: tuple = ()

    def __init__(self, chains: list[list[tuple]], preds: list[list[int]],
                 slots: list[_Slot] | None = None, gated: dict[int, int] | None = None) -> None:
        self.chains = chains
        self.preds = preds  # a chain's predecessors all have lower numbers
        # one chain, or chains that form a single line: replay is one loop
        line = all(p == [c - 1] for c, p in enumerate(preds) if c) and len(preds[0]) == 0
        self.single = [op for ch in chains for op in ch] if line else None
        self.slots = slots or []  # the event nodes, in flat order
        self.gated = gated  # chain -> the event node (its index in slots) its wait node is
        if line and self.slots:
            starts = [0] * len(chains)
            for c in range(1, len(chains)):
                starts[c] = starts[c - 1] + len(chains[c - 1])
            self.slots = [(c, t, starts[c] + t, m) for c, t, _, m in self.slots]

    def op_launch(self, queue: Queue, events: tuple = ()) -> tuple[Callable[..., Any], tuple]:
        if self.slots:
            return run_bound, (self._bind(events),)
        if self.single is not None and len(self.single) == 1:
            return _run_one, self.single[0]  # one node: its call, without the loop
        return run_replay, (self,)

    def _bind(self, events: tuple) -> _Launch:
        """This launch's replay: the chains holding event nodes copied, each node's call bound."""
        single = None if self.single is None else list(self.single)
        chains = self.chains if single is not None else list(self.chains)
        copied: set[int] = set()
        finish = []
        for (c, t, st, mark), e in zip(self.slots, events, strict=True):
            if mark is not None:
                op: tuple = (mark.record, e)  # e: (k, stamp)
                finish.append(op)
            else:
                op = (_pass, ()) if e is None else (e[0]._wait, (e[1],))
            if single is not None:
                single[st] = op
                continue
            if c not in copied:
                chains[c] = list(chains[c])
                copied.add(c)
            chains[c][t] = op
        gates = None
        if self.gated and single is None:
            gates = [None] * len(chains)
            for c, j in self.gated.items():
                gates[c] = events[j]
        return _Launch(chains, self.preds, single, gates, finish)


class _Launch:
    """One launch of a graph with event nodes: what :func:`run_replay` reads of a Replay, bound."""

    __slots__ = ("chains", "preds", "single", "gates", "finish")

    def __init__(self, chains: list[list[tuple]], preds: list[list[int]],
                 single: list[tuple] | None, gates: list | None, finish: list[tuple]) -> None:
        self.chains, self.preds, self.single, self.gates, self.finish = (
            chains, preds, single, gates, finish)


def _pass() -> None:
    """A wait node with nothing to wait for."""


def build(flat: Flat, op_of: Callable[[int, Node], NodeOp], marks: dict[int, Mark]) -> Replay:
    """Cut a flattened graph into chains of the operations ``op_of`` makes for its nodes; a
    wait node starts a chain (the replay tests its wait before it runs the chain)."""
    ops: list[tuple[NodeOp, list[int]]] = []
    kinds: dict[int, bool] = {}  # event node -> is a record node
    for i, (n, deps, on) in enumerate(flat):
        t = None if n is None else n.type
        if t is NodeType.EVENT_RECORD or t is NodeType.WAIT_EVENT:
            kinds[i] = t is NodeType.EVENT_RECORD
            ops.append(((_pass, ()), deps))  # bound at each launch (Replay._bind)
        else:
            ops.append((op_of(i, n) if n is not None and on else None, deps))
    n = len(ops)
    dependents = [0] * n
    for _, deps in ops:
        for d in deps:
            dependents[d] += 1
    chain_of = [0] * n
    chains: list[list[tuple]] = []
    preds: list[list[int]] = []
    slots: list[_Slot] = []
    gated: dict[int, int] = {}
    for i, (op, deps) in enumerate(ops):  # flat is topologically ordered, so are the chains
        wait = kinds.get(i) is False
        if len(deps) == 1 and dependents[deps[0]] == 1 and not wait:
            c = chain_of[deps[0]]
        else:
            c = len(chains)
            chains.append([])
            preds.append(list(dict.fromkeys(chain_of[d] for d in deps)))
            if wait:
                gated[c] = len(slots)
        chain_of[i] = c
        if i in kinds:
            slots.append((c, len(chains[c]), -1, marks[i] if kinds[i] else None))
        if op is not None:
            chains[c].append(op)
    if not chains:
        return Replay([[]], [[]])
    return Replay(chains, preds, slots, gated or None)


def run_bound(launch: _Launch) -> None:
    """Stream operation: replay a graph with event nodes, bound for this launch. Its record
    nodes' marks reach this launch's count however the replay ends."""
    try:
        if launch.gates is not None:
            _run_gated(launch)
        else:
            run_replay(launch)  # type: ignore[arg-type]
    finally:
        for fn, args in launch.finish:
            fn(*args)


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
    notes = getattr(exc, "__notes__", None)
    if isinstance(notes, list) and any(isinstance(n, str) and n.startswith(NODE_NOTE)
                                       for n in notes):
        return exc  # a node inside a conditional node's body named itself: the innermost fails
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


def _run_gated(replay: _Launch) -> None:
    """:func:`_run_parallel` for a launch with wait nodes: a chain whose gate is closed, or
    after one put off, is put off rather than waited for (the worker runs what else is ready: a
    record node another stream waits for, say), then run once ready (``Run.wait_ready``)."""
    gates = replay.gates
    assert gates is not None
    run = Run(replay.chains, replay.preds, run_chain, gates)
    preds, done, errors = replay.preds, run.done, run.errors
    claim = run.claimed.setdefault
    chains: Iterable[Iterable[tuple]] = replay.chains
    if queues.delay_us():
        chains = _delaying(replay.chains)
    theirs: list[int] = []
    later: list[tuple[int, Iterable[tuple]]] = []  # put off: (chain, its operations)
    off: set[int] = set()
    run.start()
    fn: Any = None
    args: tuple = ()
    c = 0
    try:
        for c, ops in enumerate(chains):
            if errors:
                break
            run.pos = c
            if claim(c, False) is not False:
                theirs.append(c)
                continue
            g = gates[c]
            if (g is not None and g[0].done < g[1]) or (off and not off.isdisjoint(preds[c])):
                later.append((c, ops))
                off.add(c)
                continue
            if theirs:
                for p in preds[c]:
                    if not done[p]:
                        run.wait_for(p)
            try:
                for fn, args in ops:
                    fn(*args)
            except BaseException as exc:
                errors.append(_in_node(exc, fn, args))
            done[c] = True
        while later and not errors:
            i = run.wait_ready([k for k, _ in later])
            if i is None:
                break
            k, ops = later.pop(i)
            try:
                for fn, args in ops:
                    fn(*args)
            except BaseException as exc:
                errors.append(_in_node(exc, fn, args))
            done[k] = True
    finally:
        for k in range(c, len(done)):
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
