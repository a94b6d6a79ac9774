"""``streamrt demo``: the seed scenarios, run end to end with what happened printed as tables.

Each section returns a list of failed checks; the command exits non-zero if any failed. A step
a backend cannot do (``NotSupportedError``, an operator without a kernel for it) is shown as
``[n/a]`` with the reason and is not a failure; any other runtime error in a step is a failed
check, and the demo goes on with the next step.
"""

from __future__ import annotations

from collections.abc import Callable

from ..device import Device
from .graphs import demo_graphs
from .ops import demo_ops
from .pools import demo_pools
from .report import NA, Section, check, guarded, not_available, table, unsupported
from .streams import demo_streams

__all__ = ["NA", "SECTION_NAMES", "check", "guarded", "not_available", "run", "sections", "table",
           "unsupported"]

def sections() -> dict[str, Section]:
    """The demo sections in the order they run."""
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
