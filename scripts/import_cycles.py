"""Module-level import cycles of src/streamrt, and how many imports are made inside functions.

Reads the source as text (nothing is imported): an import at module level, outside an
``if TYPE_CHECKING:`` block, is an edge; the strongly connected components of more than one
module are the cycles. Usage: ``python scripts/import_cycles.py [src/streamrt]``; exits 1 if
there is a cycle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package)."""
    out = {}
    for f in sorted(root.rglob("*.py")):
        parts = list(f.relative_to(root.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if package else parts)] = (f, package)
    return out


def edges(name: str, path: Path, package: bool, known: set[str]) -> tuple[set[str], int]:
    """The modules ``name`` imports at module level, and its count of imports in functions."""
    base = name if package else name.rpartition(".")[0]
    deps: set[str] = set()
    inner = 0

    def target(level: int, module: str | None) -> str:
        parts = base.split(".")
        parts = parts[: len(parts) - (level - 1)]
        return ".".join(parts + ([module] if module else []))

    def visit(body: list[ast.stmt]) -> None:
        nonlocal inner
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                inner += sum(isinstance(n, ast.Import | ast.ImportFrom) for n in ast.walk(node))
                continue
            if isinstance(node, ast.ImportFrom) and node.level:
                mod = target(node.level, node.module)
                for alias in node.names:
                    sub = f"{mod}.{alias.name}"
                    deps.add(sub if sub in known else mod)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("streamrt"))
            if isinstance(node, ast.If | ast.Try | ast.With):
                for field in ("body", "orelse", "finalbody"):
                    visit(getattr(node, field, []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(ast.parse(path.read_text()).body)
    return {d for d in deps if d in known and d != name}, inner


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def main() -> int:
    """Print the cycles and the count of imports inside functions."""
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "src/streamrt")
    mods = modules(root)
    graph, inner = {}, 0
    for name, (path, package) in mods.items():
        graph[name], n = edges(name, path, package, set(mods))
        inner += n
    found = cycles(graph)
    print(f"module-level import cycles: {len(found)}")
    for comp in found:
        print("  " + " -> ".join(comp))
    print(f"imports inside functions and classes: {inner}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
