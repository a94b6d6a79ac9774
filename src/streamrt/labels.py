"""Human labels of queued operations, made when one fails: a helper the backends may import.

It imports no other streamrt module (backends import only data types and helpers like this
one). A label never raises: a worker thread makes it, and an error escaping there would stop
its stream for good.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import FunctionType, MethodType
from typing import Any

__all__ = ["WRAPPER", "describe", "fn_label", "host_call", "labelled", "site_line"]

# set on a callable ``w(info, fn, args)`` that runs ``fn(*args)`` for an observer (the
# sanitizer's and tracer's wrapper): the label is the wrapped operation's
WRAPPER = "_streamrt_wraps"
NODE_NOTE = "in graph node: "  # the note a graph replay adds to a failing node's exception
# runtime functions the runtime enqueues as host functions -> what traces and failures call them
# ("executor release"), not their Python names (``labelled``; a dict: fn_label runs on every
# host-function enqueue, and a missed getattr costs several times a lookup here)
_LABELS: dict[Any, str] = {}


def labelled(text: str) -> Callable[[Any], Any]:
    """Decorator: traces and failure messages call this runtime host function ``text``."""

    def mark(fn: Any) -> Any:
        _LABELS[fn] = text
        return fn

    return mark


def fn_label(fn: Any) -> str:
    """How labels name a host callable: the runtime's label, its qualified name (less
    ``<locals>.``: ``outer.note``), else its repr; never raises."""
    try:
        t = type(fn)  # (only functions are looked up: another callable may be unhashable)
        name = _LABELS.get(fn.__func__ if t is MethodType else fn) if (
            t is MethodType or t is FunctionType) else None
        if name is not None:
            return name
        name = getattr(fn, "__qualname__", None)
        if not isinstance(name, str):
            return repr(fn)
        return name.replace("<locals>.", "") if "<" in name else name
    except Exception:
        return f"<{type(fn).__name__} object>"


def host_call(fn: Callable[..., Any], args: tuple) -> None:
    """Queue operation: run a host function."""
    fn(*args)


def describe(fn: Callable[..., Any], args: tuple, exc: BaseException | None = None) -> str:
    """A human label for a queued operation (used only when it failed, raising ``exc``)."""
    try:
        return _describe(fn, args, exc)
    except BaseException:  # a user object's repr or notes failed: the label is only cosmetic
        return getattr(fn, "__name__", "operation")


def _describe(fn: Callable[..., Any], args: tuple, exc: BaseException | None) -> str:
    if getattr(fn, WRAPPER, False) and len(args) >= 3:  # an observer's wrapper: the op inside
        return describe(args[1], args[2], exc)
    node = [n for n in getattr(exc, "__notes__", ())
            if isinstance(n, str) and n.startswith(NODE_NOTE)]
    if node:  # a graph launch: the node that failed
        return f"graph launch ({node[-1][3:]})"
    label = getattr(fn, "__self__", None)
    if label is not None and hasattr(label, "name"):  # a bound Kernel method
        return f"kernel {label.name!r}"
    if fn is host_call and args:
        return f"host function {fn_label(args[0])!r}"
    return getattr(fn, "__name__", repr(fn))


def site_line(code: Any, lasti: int) -> str:
    """``file:line`` of the instruction at byte offset ``lasti`` of ``code`` (a frame's
    ``f_code`` and ``f_lasti``, kept instead of the line: working the line out costs more)."""
    try:
        line = next((ln for start, end, ln in code.co_lines() if start <= lasti < end), None)
        name = code.co_filename
        try:
            name = os.path.relpath(name)
        except ValueError:  # another drive (Windows)
            pass
        return f"{name}:{line}" if line is not None else name
    except Exception:  # noqa: BLE001 - a label never raises
        return ""
