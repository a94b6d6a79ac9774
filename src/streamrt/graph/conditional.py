"""Conditional nodes (CUDA 12.4+ ``cudaGraphConditionalHandle``, ACL ``aclmdlRICond*``):
handles, the body rules, and how a replaying backend runs a conditional node.

State and invariants:
- A handle belongs to the graph it was made for (``graph``) and holds one device ``uint64`` at
  ``ptr`` (ACL's ``aclmdlRICondHandleGetCondPtr``: any kernel or copy may write it;
  ``ctx.set_condition`` does, as ``cudaGraphSetConditional``). The storage is the handle's
  own, shared by every exec of the graph, and freed when the handle is collected: the nodes
  of graphs and the operations of plans that use it hold the handle.
- A handle is used by at most one conditional node: in its own graph or in a body inside it
  (``Graph._cond_used``, kept by clones). Instantiate refuses a graph holding a handle no
  conditional node uses (CONDITIONAL_HANDLE_UNUSED).
- ``default`` (None: none) is written at the start of every launch (``cudaGraphCondAssignDefault``),
  in stream order, before any node runs: a replaying backend runs the frontend's prologue
  (:func:`defaults_op`), a backend with conditional nodes of its own sets it natively.
- A body (``node.bodies``) is a graph of its own, ``_body`` set: it takes kernel, empty,
  memcpy, memset, child (of those kinds) and conditional nodes only (:data:`BODY_KINDS`).
- Replays (:func:`run`): IF runs body 0 when the value is not 0, else body 1 if there is one;
  WHILE runs body 0 while the value is not 0, tested before each iteration; SWITCH runs body
  ``value`` when it is below the node's size. The value is read when the node runs.
- The sanitizer sees body nodes as nodes of the launch: their place in the DAG is
  :class:`~streamrt.graph.compile.Nested` (the conditional node's place, the body execution's
  number, the node's place in the body); ``NEST`` carries the body execution being run.
"""

from __future__ import annotations

import contextvars
import itertools
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import instrument
from ..errors import InvalidTypeError, InvalidValueError, NamedIntEnum, NotSupportedError, StreamRTError
from .node import NodeType

if TYPE_CHECKING:
    from ..device import Device
    from .graph import Graph

__all__ = ["BODY_KINDS", "RULE", "ConditionalHandle", "ConditionalType", "NEST", "body_refusal",
           "defaults_op", "node_args", "refuse_unused", "run", "tree_handles"]


class ConditionalType(NamedIntEnum):
    """``cudaGraphConditionalNodeType``."""

    IF = 0
    WHILE = 1
    SWITCH = 2


BODY_KINDS = frozenset((NodeType.KERNEL, NodeType.EMPTY, NodeType.MEMCPY, NodeType.MEMSET,
                        NodeType.GRAPH, NodeType.CONDITIONAL))

_U64 = np.dtype(np.uint64)
_ids = itertools.count(1)


class ConditionalHandle:
    """A conditional node's condition (``cudaGraphConditionalHandle``): a device ``uint64``."""

    __slots__ = ("id", "graph", "default", "device", "ptr", "_cell", "__weakref__")

    def __init__(self, graph: Graph, default: int | None, device: Device) -> None:
        self.id = next(_ids)
        self.graph = graph  # the graph it was made for (a body's handle: that body)
        self.default = default
        self.device = device
        from ..host_memory import device_alloc  # (host_memory builds on graphs)

        self.ptr = device_alloc(8, device)
        self._cell: np.ndarray | None = None  # a host view of the value, where the backend has one
        # released as other finalizers release device memory: never inside the lock it takes
        weakref.finalize(self, device._impl.reclaim, _release, device._impl, self.ptr)
        if default is not None:  # the value before any launch, as a launch would set it
            try:
                self.cell()[0] = default
            except NotSupportedError:  # no host view (cuda): a synchronous copy, as srt.write
                from ..host_memory import write

                write(self.ptr, np.array([default], np.uint64))

    def __repr__(self) -> str:
        d = "" if self.default is None else f" default={self.default}"
        return f"<ConditionalHandle #{self.id} of graph #{self.graph.id}{d}>"

    def cell(self) -> np.ndarray:
        """A one-element ``uint64`` host view of the value (replaying backends: the memory is
        the host's); made once."""
        c = self._cell
        if c is None:
            c = self._cell = self.device._impl.view(self.ptr, (1,), _U64, False)
        return c


def _release(impl: Any, ptr: int) -> None:
    """A collected handle's value goes (every plan and launch reading it held the handle);
    a finalizer's release: no observer is told (their locks may be held where it runs)."""
    from ..pool import registry

    if registry._requested.get(ptr) == 8:  # (not a newer allocation's entry)
        del registry._requested[ptr]
    try:
        impl.free(ptr)
    except StreamRTError:  # the device was reset meanwhile: the memory is gone already
        pass


def check_value(value: Any, what: str) -> int:
    """A condition value: an int in ``[0, 2**64)``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidTypeError(f"{what} must be an int, not {type(value).__name__}")
    v = int(value)
    if not 0 <= v < 1 << 64:
        raise InvalidValueError(f"{what} must be in [0, 2**64), not {v}")
    return v


def node_args(graph: Graph, handle: Any, kind: Any, size: Any) -> tuple[ConditionalType, Graph]:
    """Check ``add_conditional_node``'s arguments on ``graph``: the kind, and the graph that
    owns the handle (``graph`` or a graph ``graph`` is a body inside)."""
    if not isinstance(handle, ConditionalHandle):
        raise InvalidTypeError(f"a conditional node needs a ConditionalHandle, not "
                               f"{type(handle).__name__}")
    if not isinstance(kind, ConditionalType):
        if isinstance(kind, bool) or not isinstance(kind, int):
            raise InvalidTypeError(f"kind must be a srt.ConditionalType, not {type(kind).__name__}")
        try:
            kind = ConditionalType(kind)
        except ValueError:
            raise InvalidValueError(f"{kind} is not a srt.ConditionalType") from None
    if isinstance(size, bool) or not isinstance(size, int):
        raise InvalidTypeError(f"size must be an int, not {type(size).__name__}")
    most = {ConditionalType.IF: 2, ConditionalType.WHILE: 1}.get(kind)
    if size < 1 or (most is not None and size > most):
        many = {2: "1 or 2 bodies", 1: "1 body"}.get(most or 0, "at least 1 body")
        raise InvalidValueError(f"a {kind.name} node has {many}, not {size}")
    owner = handle.graph
    g: Graph | None = graph
    while g is not None and g is not owner:
        g = g._parent
    if g is None:
        raise InvalidValueError(f"{handle!r} belongs to {owner!r}: a conditional node of "
                                f"{graph!r} cannot use it")
    if handle in owner._cond_used:
        raise InvalidValueError(f"{handle!r} is already used by a conditional node: a handle "
                                "serves one conditional node")
    return kind, owner


def tree_handles(graph: Graph) -> tuple[list[ConditionalHandle], set[ConditionalHandle]]:
    """The handles made for ``graph`` and the graphs inside it (child graphs, bodies), and
    those a conditional node among them uses."""
    made, used = list(graph._handles), set(graph._cond_used)
    for i in graph._marks:
        n = graph._nodes[i]
        inner = (n._params["graph"],) if n.type is NodeType.GRAPH else \
            n._params["bodies"] if n.type is NodeType.CONDITIONAL else ()
        for g in inner:
            m, u = tree_handles(g)
            made += m
            used |= u
    return made, used


def refuse_unused(graph: Graph) -> None:
    """Instantiate's CONDITIONAL_HANDLE_UNUSED: a handle of the graph no conditional node uses."""
    from .instantiate import GraphInstantiateResult, refuse

    made, used = tree_handles(graph)
    for h in made:
        if h not in used:
            raise refuse(GraphInstantiateResult.CONDITIONAL_HANDLE_UNUSED, None,
                         f"{h!r} is used by no conditional node")


def body_refusal(graph: Graph) -> str | None:
    """Why ``graph`` (a child graph being added to a body) cannot be in a body, or None."""
    for n in graph._nodes:
        if n.type not in BODY_KINDS:
            return f"{n!r}: {RULE}"
        if n.type is NodeType.GRAPH:
            why = body_refusal(n._params["graph"])
            if why is not None:
                return why
    return None


# the body rule, as refusals state it
RULE = "a conditional body takes kernel, empty, memcpy, memset, child graph and conditional nodes only"


# -- replaying ------------------------------------------------------------------------------------
# the body execution being run, for the sanitizer: (the conditional node's place in the DAG, the
# execution's number); None outside bodies
NEST: contextvars.ContextVar[tuple[Any, int] | None] = contextvars.ContextVar(
    "streamrt_nest", default=None)
_runs = itertools.count(1)  # body executions: numbers only compared within one conditional node


def run(h: ConditionalHandle, cell: np.ndarray, kind: int, bodies: tuple, meta: Any) -> None:
    """Stream operation (a replaying backend's conditional node): read the value, run the body
    it selects (``bodies``: each body's ``(fn, args)``), as often as the kind says. ``meta``
    (instrumented plans): the node's index in the launch, its label and its place in the DAG,
    for its reads of the value and its body nodes' places."""
    reach = None
    if meta is not None:
        reach = meta[2]
        nest = NEST.get()
        if nest is not None:  # a conditional node inside a body: its place in that execution
            from .compile import Nested

            reach = Nested(nest[0], nest[1], reach)
        meta = (meta[0], meta[1], reach)
    if kind == 1:  # WHILE
        fn, args = bodies[0]
        while _value(h, cell, meta):
            _body(fn, args, reach)
        return
    v = _value(h, cell, meta)
    # IF: body 0 when not 0, else body 1 if there is one; SWITCH: body v
    k = (0 if v else 1 if len(bodies) == 2 else -1) if kind == 0 else v if v < len(bodies) else -1
    if k >= 0:
        _body(*bodies[k], reach)


def _value(h: ConditionalHandle, cell: np.ndarray, meta: Any) -> int:
    """The value, read now; observed (``meta``), the read is an access of the node's, after
    the body executions before it and before those after it."""
    if meta is not None:
        from .compile import Nested

        index, label, reach = meta
        op = instrument.OpInfo(None, "conditional", label, {}, ((h.ptr, 8, False),))
        op.parent = instrument.current()
        op.index, op.node, op.ancestors = index, label, Nested(reach, next(_runs), None)
        instrument.run(op, _nothing, ())
    return int(cell[0])


def _nothing() -> None:
    """(A read of the value is the whole operation: its access.)"""


def _body(fn: Any, args: tuple, reach: Any) -> None:
    if reach is None:
        fn(*args)
        return
    token = NEST.set((reach, next(_runs)))
    try:
        fn(*args)
    finally:
        NEST.reset(token)


def defaults_op(handles: list[ConditionalHandle], observed: bool = False
                ) -> tuple[Any, tuple] | None:
    """The operation writing the handles' defaults (those that have one), or None; ``observed``:
    the writes are accesses of the launch, before every node of it."""
    writes = [(h.cell(), h.default, h) for h in handles if h.default is not None]
    if not writes:
        return None
    return (_set_defaults_observed if observed else _set_defaults, (writes,))


# a place in a launch's DAG before every node (``compile.reaches``: chain -1 is no chain, and a
# node knowing nothing of it has it at -1 >= -1)
_FIRST = (-1, -1, {})


def _set_defaults_observed(writes: list[tuple[np.ndarray, int, ConditionalHandle]]) -> None:
    """:func:`_set_defaults`, each write an access ordered before the launch's nodes."""
    op = instrument.OpInfo(None, "conditional", "default", {},
                           tuple((h.ptr, 8, True) for _, _, h in writes))
    op.parent = instrument.current()
    op.index, op.node, op.ancestors = -1, "handle defaults", _FIRST
    instrument.run(op, _set_defaults, (writes,))


def _set_defaults(writes: list[tuple[np.ndarray, int, ConditionalHandle]]) -> None:
    """Stream operation: ``cudaGraphCondAssignDefault`` at the start of a launch."""
    for cell, value, _ in writes:
        cell[0] = value
