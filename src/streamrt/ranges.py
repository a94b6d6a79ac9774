"""User ranges: ``with srt.range("name"):`` marks a span of host work in traces (as NVTX).

Ranges nest per host thread; each is a slice on its thread's track of the trace's host process.
A range object keeps no state of its own (the open ranges are a per-thread stack), so one object
may be entered again while open (a recursive or threaded function it decorates). With no tracer
listening when a range is entered, it costs a stack push and pop and is not recorded.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from . import instrument
from .errors import InvalidTypeError, InvalidValueError

__all__ = ["Range", "check_name"]

F = TypeVar("F", bound=Callable[..., Any])
_tl = threading.local()  # ``open``: the thread's stack of entered ranges' start times (or None)


def check_name(name: Any, what: str) -> str:
    """``name`` (of a range or stream) if a non-empty str, else the error saying why not."""
    if type(name) is not str:
        raise InvalidTypeError(f"a {what} name must be a str, not {type(name).__name__}")
    if not name:
        raise InvalidValueError(f"a {what} name must not be empty")
    return name


def _stack() -> list[float | None]:
    try:
        return _tl.open  # type: ignore[no-any-return]
    except AttributeError:
        st: list[float | None] = []
        _tl.open = st
        return st


class Range:
    """``with srt.range("name"):`` or ``@srt.range("name")``: a named span of host work in traces."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = check_name(name, "range")

    def __repr__(self) -> str:
        return f"<range {self.name!r}>"

    def __enter__(self) -> Range:
        _stack().append(time.perf_counter() if instrument.listeners else None)
        return self

    def __exit__(self, *exc: object) -> None:
        st = _stack()
        t0 = st.pop() if st else None
        if t0 is not None and instrument.listeners:  # (a trace that ended meanwhile: nothing)
            instrument.notify("range", self.name, t0, time.perf_counter(), len(st))

    def __call__(self, fn: F) -> F:
        """Decorate ``fn``: each call runs inside this range."""
        if not callable(fn):
            raise InvalidTypeError(f"range decorates a callable, not {type(fn).__name__}")

        @functools.wraps(fn)
        def ranged(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return ranged  # type: ignore[return-value]
