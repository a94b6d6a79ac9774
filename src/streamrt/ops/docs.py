"""Operator documentation, made from what each operator declares (``Op`` subclasses).

An operator class states its tensor slots (``inputs``, ``optional``, ``outputs``), attributes
(``Attr(check, default, doc)``), dtypes, a one-paragraph description (its own docstring), one
line per slot (``slot_docs``), what its workspace holds (``workspace_doc``) and how it treats
mixed dtypes (``dtype_doc``). :func:`compose` turns that into the class docstring, which is what
``help(ops.add)`` shows (``Op.__init_subclass__`` calls it), and :func:`summary` into the lines
``streamrt info --ops`` prints. Nothing is written twice, so the docs cannot drift from the
checks: an attribute without a ``doc`` still appears, with its type and default.
"""

from __future__ import annotations

import textwrap
from typing import Any

__all__ = ["compose", "summary", "signature", "attr_type", "attr_list"]

# an attribute's type, by the checker that validates it (framework's *_attr functions)
_TYPES = {
    "float_attr": "float",
    "bool_attr": "bool",
    "int_attr": "int",
    "optional_int_attr": "int or None",
    "axes_attr": "None, int or tuple of ints",
}


def attr_type(check: Any) -> str:
    """The type an attribute checker accepts, in words."""
    name = getattr(check, "__name__", "")
    if name in _TYPES:
        return _TYPES[name]
    doc = (getattr(check, "__doc__", None) or "").strip()
    return doc.splitlines()[0].rstrip(".") if doc else "any"


def signature(cls: Any) -> str:
    """``add(x, y) -> out``; an optional input reads ``weight=None``."""
    ins = ", ".join(f"{s}=None" if s in cls.optional else s for s in cls.inputs)
    return f"{cls.name}({ins}) -> {', '.join(cls.outputs)}"


def attr_list(cls: Any) -> str:
    """``alpha=1.0`` (or ``none``): the attributes with their defaults."""
    return ", ".join(f"{k}={a.default!r}" for k, a in cls.attrs.items()) or "none"


def _dtypes(cls: Any) -> str:
    return ", ".join(dt.name for dt in cls.dtypes)


def compose(cls: Any) -> str:
    """The full docstring of operator class ``cls``: description, inputs, outputs, attributes
    with types and defaults, dtypes, workspace, and the calling convention."""
    desc = _clean(cls.__dict__.get("_written_doc") or "")
    ind = "    "
    lines = [f"ops.{signature(cls)}", ""]
    for para in desc.split("\n\n") if desc else ():
        lines += [textwrap.fill(" ".join(para.split()), 96), ""]
    for title, slots in (("Inputs", cls.inputs), ("Outputs", cls.outputs)):
        lines.append(f"{title}:")
        for s in slots:
            opt = " Optional: None leaves it out." if s in cls.optional else ""
            lines.append(f"{ind}{s}: {cls.slot_docs.get(s, 'a tensor')}{opt}")
    lines.append("Attributes (keyword arguments of phase 1 and ops.run):")
    if not cls.attrs:
        lines.append(f"{ind}none")
    for k, a in cls.attrs.items():
        doc = f" {a.doc}" if a.doc else ""
        lines.append(f"{ind}{k} ({attr_type(a.check)}, default {a.default!r}):{doc}")
    lines.append(f"Dtypes: {_dtypes(cls)}. {cls.dtype_doc}".rstrip())
    lines.append(f"Workspace: {cls.workspace_doc} Its exact size is what phase 1 returns "
                 "(the cuda plan keeps the same kinds of values, sized for its own tiling).")
    lines.append("Tensors may be strided (any strides and offset); formats: "
                 f"{', '.join(cls.formats)}.")
    attrs = "".join(f", {k}={a.default!r}" for k, a in cls.attrs.items())
    slots = ", ".join(cls.inputs + cls.outputs)
    lines += [
        "",
        "Use:",
        f"{ind}ws_size, ex = ops.{cls.name}.get_workspace_size({slots}{attrs})  # phase 1",
        f"{ind}ops.{cls.name}(ws, ws_size, ex, stream)  # phase 2: enqueue only",
        f"{ind}ops.run(ops.{cls.name}, {slots}{attrs}, stream=s)  # both, workspace from the pool",
        "A non-repeatable executor is released after its one run; a repeatable one (or one never "
        "run) must be destroyed: ex.destroy(), or `with ex:` (see ops.Executor).",
    ]
    return "\n".join(_wrap(line) for line in lines)


def _clean(doc: str) -> str:
    """A docstring's text with the indentation of its continuation lines removed."""
    first, _, rest = doc.strip().partition("\n")
    return (first + ("\n" + textwrap.dedent(rest) if rest else "")).strip()


def _wrap(line: str, width: int = 96) -> str:
    if len(line) <= width or "\n" in line or line.startswith(("    ws_size", "    ops.")):
        return line
    indent = line[: len(line) - len(line.lstrip())]
    return textwrap.fill(line, width, subsequent_indent=indent + "    ")


def summary(op: Any) -> list[str]:
    """What ``streamrt info --ops`` prints of ``op``: signature, attributes, dtypes, workspace."""
    cls = type(op)
    first = _clean(cls.__dict__.get("_written_doc") or "").split("\n\n", 1)[0]
    out = [f"ops.{signature(cls)}"]
    if first:
        out += textwrap.wrap(" ".join(first.replace("``", "").split()), 92,
                             initial_indent="    ", subsequent_indent="    ")
    out.append(f"    attributes: {attr_list(cls)}")
    out.append(f"    dtypes:     {_dtypes(cls)}")
    out += textwrap.wrap(f"workspace:  {cls.workspace_doc}", 92, initial_indent="    ",
                         subsequent_indent="                ")
    return out
