"""``streamrt demo``: the seed scenarios, run end to end with what happened printed as tables.

Each section returns a list of failed checks; the command exits non-zero if any failed.
"""

from __future__ import annotations

from collections.abc import Callable

from ..device import Device

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
    out(f"streamrt demo on {dev.name}")
    failures: list[str] = []
    for name, section in sections().items():
        if only and name != only:
            continue
        failures += section(dev, out)
        out("")
    out("all checks passed" if not failures else f"{len(failures)} check(s) FAILED: {failures}")
    return len(failures)
