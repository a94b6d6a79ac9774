"""What every demo section uses: tables, checks, and steps a backend cannot do."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..device import Device
from ..errors import ExecutorError, NotSupportedError, StreamRTError

__all__ = ["NA", "Section", "check", "guarded", "not_available", "table", "unsupported"]

Section = Callable[[Device, Callable[[str], None]], list[str]]


def table(rows: list[tuple], header: tuple, out: Callable[[str], None]) -> None:
    """Print ``rows`` under ``header`` as an aligned text table."""
    cells = [tuple(str(c) for c in header)] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for n, r in enumerate(cells):
        out("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)))
        if n == 0:
            out("  " + "  ".join("-" * w for w in widths))


def check(cond: bool, what: str, failures: list[str], out: Callable[[str], None]) -> None:
    """Print a check's outcome; a failed one is added to ``failures``."""
    out(f"  [{'ok' if cond else 'FAILED'}] {what}")
    if not cond:
        failures.append(what)


NA = "  [n/a]"  # the prefix of a step the backend cannot do; run() counts these lines
# ExecutorError code ops.executor.INNER_FIND_KERNEL: the operator has no kernel for this backend.
# Not imported from there: cli imports this package for its --only choices, and importing ops
# would load every operator for `streamrt info` too.
_FIND_KERNEL = 561003


def unsupported(exc: BaseException) -> bool:
    """True when ``exc`` says the backend lacks a feature (not that a result came out wrong)."""
    return isinstance(exc, NotSupportedError) or (
        isinstance(exc, ExecutorError) and exc.code == _FIND_KERNEL)


def not_available(what: str, why: str, out: Callable[[str], None]) -> None:
    """Print that ``what`` cannot be shown on this backend, and why."""
    out(f"{NA} {what}: {why}")


@contextmanager
def guarded(what: str, failures: list[str], out: Callable[[str], None]) -> Iterator[None]:
    """Run a step; a runtime error ends the step only (reported as n/a or as a failed check),
    so one missing feature on a backend does not hide the rest of the demo."""
    try:
        yield
    except TimeoutError as exc:  # a host-side wait that gave up: the step hung
        check(False, f"{what}: {exc}", failures, out)
    except StreamRTError as exc:
        if unsupported(exc):
            not_available(what, f"not supported here ({type(exc).__name__}: {exc})", out)
        else:
            check(False, f"{what}: raised {type(exc).__name__}: {exc}", failures, out)
