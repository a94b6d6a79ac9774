"""Stream-order sanitizer: a happens-before checker over the accesses every operation declares.

The package: ``order`` (the happens-before relation: events, host proofs), ``generation`` (an
allocation's lifetime and its shadow: the last accesses of each byte range), ``finding``,
``checker`` (the state machine, :class:`Sanitizer`), and here the switch.

State and invariants: the one checker is ``_SAN``. While the sanitizer is on (``_on``), ``_SAN``
is an instrumentation listener and ``KernelContext.array`` / ``strided`` are
:func:`_checked_array` / :func:`_checked_strided`; off, the listener is gone and views are made
unchecked. ``STREAMRT_SANITIZE`` switches it on when this
package is imported (``streamrt`` imports it last for that reason).
"""

from __future__ import annotations

import atexit
import math
import sys
from typing import Any

import numpy as np

from .. import instrument
from ..backends import get_backend
from ..errors import InvalidValueError, SanitizerError
from ..kernel import KernelContext
from ..ops.executor import live_executors
from ..validate import check_bool, env_flag, is_int
from .checker import UNTRACKED, Sanitizer
from .emulated import EmulatedChecker
from .finding import KINDS, Finding, _finding  # noqa: F401 (KINDS: the kinds a finding has)
from .order import _HostFree, op_before_op  # noqa: F401 (op_before_op: the relation)

_MAX_RUNS = 4096  # byte runs a strided view declares one by one; past it, its whole span

__all__ = ["enable", "disable", "enabled", "report", "clear", "check_leaks", "Finding"]

_SAN = Sanitizer()
_access = _SAN.access
_lock, _at_get = _SAN._lock, _SAN._at.get  # (never replaced: _restart clears them)
_current_op = instrument._current.get
_on = False


def enable(mode: str = "raise", *, leaks: bool = False) -> None:
    """Turn the sanitizer on: ``mode`` "raise" (synchronize raises) or "collect"."""
    global _on
    if not isinstance(mode, str) or mode not in ("raise", "collect"):
        raise InvalidValueError(f"sanitizer mode must be 'raise' or 'collect', not {mode!r}")
    check_bool(leaks, "leaks")
    with _SAN._lock:
        if mode == "raise" and _SAN.mode == "collect":
            _SAN._raised = len(_SAN.findings)  # collected findings were reported by report()
        _SAN.mode = mode
    if not _on:
        _SAN._restart()
        KernelContext.array = _checked_array  # views declare their accesses
        KernelContext.strided = _checked_strided
        KernelContext.emu_checker = _EMU  # emulated CUDA C launches record what they touch
        _on = True
        instrument.add(_SAN)
    if leaks:
        atexit.register(_report_leaks_at_exit)


def disable() -> None:
    """Turn the sanitizer off (findings are kept until :func:`clear`)."""
    global _on
    if _on:
        KernelContext.array = KernelContext._fast_array
        KernelContext.strided = KernelContext._fast_strided
        KernelContext.emu_checker = None
        _on = False
        instrument.remove(_SAN)


def enabled() -> bool:
    """Whether the sanitizer is on."""
    return _on


def report() -> list[Finding]:
    """Every finding so far, in order."""
    with _SAN._lock:
        return list(_SAN.findings)


def clear() -> None:
    """Forget the findings (and what was raised)."""
    with _SAN._lock:
        _SAN.findings.clear()
        _SAN._seen.clear()
        _SAN._raised = 0


def _checked_array(ctx: Any, ptr: int, shape: Any, dtype: Any, *, readonly: bool = False) -> Any:
    """``KernelContext.array`` while the sanitizer is on: check the access, then make the view."""
    try:  # the view last made at this address, if it matches: its bytes, and the view itself
        e = ctx._last[ptr]  # (this device's: see DeviceImpl.last_views)
    except (KeyError, TypeError):
        e = None
    if e is not None and e[0] == shape and e[1] is dtype:
        view = e[3] if readonly else e[2]
        if view is not None:
            op = _current_op()
            if op is not None and op.parent is None:
                with _lock:  # a stream's streak of whole accesses (generation.py): replace
                    hist = _at_get(ptr)
                    if hist is not None:
                        x = hist[-1]
                        if x.streak == op.sid and x.free is None and x.hi - x.lo == view.nbytes:
                            w, r = x.states[0]
                            if op not in w and op not in r:  # (its second access: in full)
                                if not readonly:
                                    w.clear()
                                    w.append(op)
                                r.clear()
                                if readonly:
                                    r.append(op)
                                return view
            found = _access(op, ptr, view.nbytes, not readonly)
            if found is not None:
                _judged(ctx, op, ptr, view.nbytes, found)
            return view
    try:
        nbytes = _NBYTES[shape, dtype]
    except KeyError:
        nbytes = _nbytes(shape, dtype)
        if nbytes is not None and len(_NBYTES) < 4096:
            _NBYTES[shape, dtype] = nbytes
    except TypeError:  # an unhashable shape (a list) or dtype
        nbytes = _nbytes(shape, dtype)
    if nbytes is not None and (type(ptr) is int or is_int(ptr)):
        p = int(ptr)
        op = _current_op()
        found = _access(op, p, nbytes, not readonly)
        if found is not None:
            _judged(ctx, op, p, nbytes, found)
    return _view(ctx, ptr, shape, dtype, readonly=readonly)


_view = KernelContext._fast_array  # the unchecked view, its cache of the views made last


_NBYTES: dict[tuple[Any, Any], int] = {}  # (shape, dtype) as a view is asked for -> its bytes


def _nbytes(shape: Any, dtype: Any) -> int | None:
    """The bytes of a view of ``shape`` and ``dtype`` (None: not a valid view; the view maker
    refuses it)."""
    try:
        dt = np.dtype(dtype)
        shp = (shape,) if isinstance(shape, int | np.integer) else tuple(int(d) for d in shape)
        return math.prod(shp) * dt.itemsize
    except (TypeError, ValueError):
        return None


def _checked_strided(ctx: Any, ptr: int, shape: tuple, dtype: Any, bstrides: tuple, extent: int,
                     readonly: bool) -> Any:
    """``KernelContext.strided`` while the sanitizer is on: the elements the strides reach are
    checked (two streams writing two columns of one matrix share no byte), then the view."""
    dt = np.dtype(dtype)
    runs = _runs(shape, bstrides, dt.itemsize)
    _check(ctx, int(ptr), extent * dt.itemsize, not readonly,
           None if runs is None else [(ptr + a, ptr + b) for a, b in runs])
    span = ctx._view(ptr, (extent,), dtype, readonly)
    return np.ndarray(shape, dtype, span, 0, bstrides)


def _runs(shape: tuple, bstrides: tuple, itemsize: int) -> list[tuple[int, int]] | None:
    """The byte runs ``[a, b)`` (from the view's start, sorted, disjoint) a strided view's
    elements cover; None past ``_MAX_RUNS`` runs (then its whole span is declared)."""
    dims = sorted((st, n) for n, st in zip(shape, bstrides) if n > 1)
    run, k = itemsize, 0
    while k < len(dims) and dims[k][0] == run:  # dimensions contiguous with the element
        run *= dims[k][1]
        k += 1
    outer = dims[k:]
    if math.prod(n for _, n in outer) > _MAX_RUNS:
        return None
    offs = np.zeros(1, np.int64)
    for st, n in outer:
        offs = (offs[:, None] + np.arange(n, dtype=np.int64) * st).ravel()
    out: list[tuple[int, int]] = []
    for o in np.unique(offs).tolist():
        if out and o <= out[-1][1]:  # touching or overlapping runs: one
            out[-1] = (out[-1][0], max(out[-1][1], o + run))
        else:
            out.append((o, o + run))
    return out


def _check(ctx: Any, p: int, nbytes: int, write: bool, runs: list | None) -> None:
    op = _current_op()
    found = _access(op, p, nbytes, write, runs)
    if found is not None:
        _judged(ctx, op, p, nbytes, found)


def _judged(ctx: Any, op: Any, p: int, nbytes: int, found: Any) -> None:
    """An access the checker did not pass: raise where the kernel must stop."""
    if found is UNTRACKED:
        found = None
        if op is not None and get_backend(ctx.device.backend).range_of(p) is None:
            with _SAN._lock:
                found = _SAN._find("invalid-address", p, nbytes, op, None,
                                   f"{op.describe()} touches {hex(p)}+{nbytes}, which is inside "
                                   "no allocation")
    if found is not None and (found.kind in ("out-of-bounds", "invalid-address")
                              or get_backend(ctx.device.backend).range_of(p) is None):
        # stop the kernel before it writes (as compute-sanitizer aborts it), in collect mode
        # too: the synchronize reports no LaunchError for it (see sync)
        raise SanitizerError(str(found), found)



def _stop(ctx: Any, found: Any) -> None:
    raise SanitizerError(str(found), found)


_EMU = EmulatedChecker(_SAN, _current_op, _check, _stop)


class check_host_free:  # noqa: N801 (used as a function: ``with check_host_free(p): ...``)
    """Around the host free of the allocation at ``ptr`` made inside the block: judge it as
    ACL's ``what`` (``aclrtFree``), ordered after only the stream work the host had synchronized
    when the block began, not after all work enqueued before it (``srt.free``'s order, as
    ``cudaFree``'s). An access of that allocation the host had not seen complete then is a
    use-after-free, found at the free (the free's device synchronize has run it by then) and
    raised as the block ends in raise mode. Off, the block runs alone."""

    __slots__ = ("ptr", "what")

    def __init__(self, ptr: int, what: str = "aclrtFree") -> None:
        self.ptr, self.what = int(ptr), what

    def __enter__(self) -> None:
        if _on:  # (an event made here: its site is the program's line, this frame being ours)
            ev = _HostFree(f"{self.what} of {hex(self.ptr)}")  # the host's proofs now
            with _SAN._lock:
                if self.ptr in _SAN._live:
                    _SAN._host_frees[self.ptr] = ev

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if _on:
            with _SAN._lock:  # a free that failed (or never came) leaves no announcement
                _SAN._host_frees.pop(self.ptr, None)
            if exc_type is None:
                raise_pending()

def raise_pending() -> None:
    """Called by every synchronize: raise the first new finding (raise mode)."""
    f = _SAN.pending()
    if f is not None:
        raise SanitizerError(f"{f.kind}: {f.message}", f)


def check_leaks() -> list[Finding]:
    """Findings for what is still alive: executors, stream-ordered and synchronous allocations.
    Returned only: what is alive now may be freed later, so none is raised at a synchronize."""
    found = []
    with _SAN._lock:
        n = live_executors()
        if n:
            found.append(_finding("leak", 0, 0, None, None,
                                  f"{n} operator executor(s) never released (destroy them, or "
                                  "let ops.run manage them)"))
        for ptr, g in sorted(_SAN._live.items()):
            found.append(_finding("leak", ptr, g.hi - g.lo, None, g.alloc,
                                  f"{g.label} {hex(ptr)} ({g.hi - g.lo} B) never freed: "
                                  f"{g.alloc.describe()}"))
    return found


def _report_leaks_at_exit() -> None:
    for f in check_leaks():
        print(f"streamrt sanitizer: {f}", file=sys.stderr)


# STREAMRT_SANITIZE: on (raise mode), or the mode by name
_MODE = env_flag("STREAMRT_SANITIZE", {"raise": "raise", "collect": "collect"})
if _MODE:
    enable("raise" if _MODE is True else _MODE)
