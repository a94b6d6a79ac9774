"""The cuda backend names only functions, types and constants that cuda-bindings really has.

Runs wherever ``cuda-bindings`` is installed, GPU or not: a misspelt or removed name would
otherwise only show on a GPU machine.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

rt = pytest.importorskip("cuda.bindings.runtime", reason="cuda-bindings is not installed")
drv = pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed")

_CUDA = Path(__file__).resolve().parents[2] / "src" / "streamrt" / "backends" / "cuda"
SOURCES = [_CUDA / name for name in ("backend.py", "device.py", "graph.py", "mark.py", "pools.py",
                                          "queue.py")]


def _references(path: Path) -> set[tuple[str, ...]]:
    """Every dotted name under ``rt.`` or ``drv.`` in ``path`` (``rt.cudaMemcpyKind.X`` too)."""
    found: set[tuple[str, ...]] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            parts = []
            cur: ast.AST = node
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and cur.id in ("rt", "drv"):
                found.add((cur.id, *reversed(parts)))
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_cuda_backend_names_exist_in_cuda_bindings(path):
    refs = _references(path)
    assert len(refs) >= 3  # the walk found the backend's calls
    missing = []
    for ref in sorted(refs):
        obj = {"rt": rt, "drv": drv}[ref[0]]
        for part in ref[1:]:
            if not hasattr(obj, part):
                if part in ("x", "y", "z", "type", "id", "allocType", "maxSize", "location"):
                    break  # fields of values made at run time, not module attributes
                missing.append(".".join(ref))
                break
            obj = getattr(obj, part)
    assert not missing, f"not in the installed cuda-bindings: {missing}"


def _calls(path: Path) -> list[tuple[str, str, int, int]]:
    """``(module, function, positional args, line)`` of each direct ``rt.f(...)``/``drv.f(...)`` call."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id in ("rt", "drv")
                and not node.keywords and not any(isinstance(a, ast.Starred) for a in node.args)):
            out.append((node.func.value.id, node.func.attr, len(node.args), node.lineno))
    return out


def _arity(fn) -> int | None:
    """Parameters in the signature line that opens a cuda-bindings function's docstring."""
    if isinstance(fn, type):
        return None  # a type: constructor arguments are optional
    first = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
    name = getattr(fn, "__name__", "")
    if not first.startswith(f"{name}("):
        return None  # a type constructor, or no signature line
    inner = first[len(name) + 1 : first.rindex(")")].strip()
    return 0 if not inner else inner.count(",") + 1


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_cuda_backend_calls_pass_every_parameter(path):
    wrong = []
    checked = 0
    for mod, name, nargs, line in _calls(path):
        fn = getattr({"rt": rt, "drv": drv}[mod], name)
        want = _arity(fn)
        if want is None:
            continue
        checked += 1
        if want != nargs:
            wrong.append(f"line {line}: {mod}.{name} takes {want} arguments, called with {nargs}")
    assert checked > 3
    assert not wrong, wrong
