"""Graphviz text of a graph (``cudaGraphDebugDotPrint``): nodes by creation index, child
graphs and conditional nodes' bodies as clusters."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InvalidValueError
from ..validate import as_path
from .node import NodeType

if TYPE_CHECKING:
    from .graph import Graph

__all__ = ["render"]


def render(graph: Graph, path: str | Path | None) -> str:
    """The DOT text of ``graph``; written to ``path`` if given."""
    lines = [f"digraph streamrt_graph_{graph.id} {{", "  node [shape=box, fontname=monospace];"]
    _body(graph, lines, "n", "  ")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    if path is not None:
        p = as_path(path, "to_dot path")
        try:
            p.write_text(text)
        except OSError as exc:  # as srt.trace: a path it cannot write is a bad argument
            raise InvalidValueError(f"cannot write the graph to {str(p)!r}: {exc}") from None
    return text


def _body(graph: Graph, lines: list[str], prefix: str, indent: str) -> None:
    for n in graph._nodes:
        name = f"{prefix}{n.index}"
        if n.type is NodeType.GRAPH:
            lines.append(f"{indent}subgraph cluster_{name} {{")
            lines.append(f'{indent}  label="child graph #{n.index}";')
            lines.append(f'{indent}  {name} [label="GRAPH", shape=point];')
            _body(n._params["graph"], lines, f"{name}_", indent + "  ")
            lines.append(f"{indent}}}")
        elif n.type is NodeType.CONDITIONAL:  # the node, then each body as a cluster under it
            label = n.label().replace('"', "'").replace(" ", "\\n", 1)
            lines.append(f'{indent}{name} [label="#{n.index} {label}", shape=diamond];')
            for k, body in enumerate(n._params["bodies"]):
                lines.append(f"{indent}subgraph cluster_{name}_b{k} {{")
                lines.append(f'{indent}  label="body {k} of #{n.index}";')
                lines.append(f'{indent}  {name}_b{k} [label="body {k}", shape=point];')
                _body(body, lines, f"{name}_b{k}_", indent + "  ")
                lines.append(f"{indent}}}")
                lines.append(f"{indent}{name} -> {name}_b{k} [style=dashed];")
        else:
            label = n.label().replace('"', "'").replace(" ", "\\n", 1)
            lines.append(f'{indent}{name} [label="#{n.index} {label}"];')
    for d, n in graph.edges():
        lines.append(f"{indent}{prefix}{d.index} -> {prefix}{n.index};")
