"""A graph's edges (``cudaGraphAddDependencies`` / ``cudaGraphRemoveDependencies``): a batch
of edges applies wholly or not at all, and an edge that would close a cycle is refused."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import InvalidValueError

if TYPE_CHECKING:
    from .graph import Graph
    from .node import Node

__all__ = ["Edges"]


class Edges:
    """What :class:`~streamrt.graph.graph.Graph` does with edges between its nodes."""

    def _pairs(self: Graph, frm: Any, to: Any) -> list[tuple[Node, Node]]:
        a = self._as_nodes(frm, "frm")
        b = self._as_nodes(to, "to")
        if len(a) != len(b):
            raise InvalidValueError(f"frm and to must have equal lengths ({len(a)} != {len(b)})")
        pairs = list(zip(a, b))
        # a batch applies wholly or not at all: per-edge checks see one edge at a time, so a
        # repeat inside the batch is refused here, before any edge changes
        if len(set(pairs)) != len(pairs):
            raise InvalidValueError("the same edge is listed more than once")
        return pairs

    def add_dependencies(self: Graph, frm: Any, to: Any) -> None:
        """Add edges ``frm[i] -> to[i]`` (``cudaGraphAddDependencies``); refuses cycles."""
        self._check_alive()
        pairs = self._pairs(frm, to)
        for f, t in pairs:
            if f in t._deps:
                raise InvalidValueError(f"edge {f!r} -> {t!r} already exists")
        added: list[tuple[Node, Node]] = []
        for f, t in pairs:
            if f is t or self._reaches(t, f):
                for af, at in added:  # all or nothing
                    at._deps.remove(af)
                    af._dependents.remove(at)
                raise InvalidValueError(f"edge {f!r} -> {t!r} would create a cycle")
            t._deps.append(f)
            f._dependents.append(t)
            added.append((f, t))

    def remove_dependencies(self: Graph, frm: Any, to: Any) -> None:
        """Remove edges ``frm[i] -> to[i]`` (``cudaGraphRemoveDependencies``)."""
        self._check_alive()
        pairs = self._pairs(frm, to)
        for f, t in pairs:
            if f not in t._deps:
                raise InvalidValueError(f"there is no edge {f!r} -> {t!r}")
        for f, t in pairs:
            t._deps.remove(f)
            f._dependents.remove(t)

    @staticmethod
    def _reaches(start: Node, goal: Node) -> bool:
        seen = {id(start)}
        stack = [start]
        while stack:
            n = stack.pop()
            if n is goal:
                return True
            for d in n._dependents:
                if id(d) not in seen:
                    seen.add(id(d))
                    stack.append(d)
        return False
