"""Stream-order sanitizer: a happens-before checker over the accesses every operation declares.

The package: ``order`` (the happens-before relation: events, host proofs), ``generation`` (an
allocation's lifetime and the accesses it remembers), ``finding``, ``checker`` (the state
machine, :class:`Sanitizer`), and here the switch.

State and invariants: the one checker is ``_SAN``. While the sanitizer is on (``_on``), ``_SAN``
is an instrumentation listener and ``KernelContext.array`` is :func:`_checked_array`; off, the
listener is gone and the view is made unchecked. ``STREAMRT_SANITIZE`` switches it on when this
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
from .checker import Sanitizer
from .finding import KINDS, Finding, _finding  # noqa: F401 (KINDS: the kinds a finding has)
from .generation import _MAX_ACCESSES  # noqa: F401 (the model test's cap on remembered accesses)
from .order import op_before_op  # noqa: F401 (the relation, beside the checker that uses it)

__all__ = ["enable", "disable", "enabled", "report", "clear", "check_leaks", "Finding"]

_SAN = Sanitizer()
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
        _on = True
        instrument.add(_SAN)
    if leaks:
        atexit.register(_report_leaks_at_exit)


def disable() -> None:
    """Turn the sanitizer off (findings are kept until :func:`clear`)."""
    global _on
    if _on:
        KernelContext.array = KernelContext._fast_array
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
    try:
        dt = np.dtype(dtype)
        shp = (shape,) if isinstance(shape, int | np.integer) else tuple(int(d) for d in shape)
        nbytes = math.prod(shp) * dt.itemsize
        p = int(ptr) if is_int(ptr) else None
    except (TypeError, ValueError):
        p = None
    if p is not None:
        op = instrument.current()
        unmapped = get_backend(ctx.device.backend).range_of(p) is None
        # a freed generation still names the free (use-after-free); else: no allocation at all
        found = _SAN.access(op, p, nbytes, not readonly)
        if found is None and unmapped and op is not None:
            with _SAN._lock:
                found = _SAN._find("invalid-address", p, nbytes, op, None,
                                   f"{op.describe()} touches {hex(p)}+{nbytes}, which is inside "
                                   "no allocation")
        if found is not None and (unmapped or found.kind in ("out-of-bounds", "invalid-address")):
            # stop the kernel before it writes (as compute-sanitizer aborts it), in collect mode
            # too: the synchronize reports no LaunchError for it (see sync)
            raise SanitizerError(str(found), found)
    return ctx._view(ptr, shape, dtype, readonly)  # type: ignore[no-any-return]


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
