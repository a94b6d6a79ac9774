"""``streamrt demo``: the seed scenarios, run end to end with what happened printed as tables.

Each section returns a list of failed checks; the command exits non-zero if any failed. A step
a backend cannot do (``NotSupportedError``, an operator without a kernel for it) is shown as
``[n/a]`` with the reason and is not a failure; any other runtime error in a step is a failed
check, and the demo goes on with the next step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..device import Device
from ..errors import ExecutorError, NotSupportedError, StreamRTError

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


def sections() -> dict[str, Section]:
    """The demo sections in the order they run."""
    from .graphs import demo_graphs
    from .ops import demo_ops
    from .pools import demo_pools
    from .streams import demo_streams

    return {"streams": demo_streams, "pools": demo_pools, "ops": demo_ops, "graphs": demo_graphs}


SECTION_NAMES = ("streams", "pools", "ops", "graphs")


def run(device: str | None = None, only: str | None = None,
        out: Callable[[str], None] = print) -> int:
    """Run the demo sections; returns the number of failed checks."""
    dev = Device(device)
    skipped = 0

    def emit(line: str) -> None:
        nonlocal skipped
        skipped += line.startswith(NA)
        out(line)

    emit(f"streamrt demo on {dev.name}")
    failures: list[str] = []
    with dev:  # srt.* helpers (malloc_host, read) act on the current device: the demo's
        for name, section in sections().items():
            if only and name != only:
                continue
            with guarded(f"{name} section stopped", failures, emit):
                failures += section(dev, emit)
            emit("")
    na = f" ({skipped} step(s) n/a on {dev.name}, see above)" if skipped else ""
    emit(f"all checks passed{na}" if not failures else
         f"{len(failures)} check(s) FAILED{na}: {failures}")
    return len(failures)
