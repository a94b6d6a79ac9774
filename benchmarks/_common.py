"""Shared timing helper of the benchmark scripts (best of several repetitions, in one process)."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from typing import Any

SMOKE_ENV = "STREAMRT_BENCH_SMOKE"
SMOKE_HELP = (f"{SMOKE_ENV}=1: a smoke run (every count cut to a few, one repetition, on top of "
              "--quick) that only checks the script runs end to end, e.g. on tests/cuda/fake; its "
              "figures mean nothing")


def smoke() -> bool:
    """``STREAMRT_BENCH_SMOKE=1``: cut every count to a few (a run that checks the script works)."""
    return os.environ.get(SMOKE_ENV) == "1"


def smoke_size(n: int, few: int) -> int:
    """``n``, or at most ``few`` in a smoke run."""
    return min(n, few) if smoke() else n


def fmt_size(n: int) -> str:
    """``512 B``, ``64 KiB``, ``1 MiB``."""
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20} MiB"
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return f"{n >> 10} KiB"
    return f"{n} B"


def best_us(fn: Callable[[int], Any], n: int, repeat: int,
            between: Callable[[], Any] | None = None) -> float:
    """Microseconds per item of the fastest of ``repeat`` calls ``fn(n)`` (``between`` runs
    untimed before each)."""
    best = float("inf")
    for _ in range(repeat):
        if between is not None:
            between()
        t0 = time.perf_counter()
        fn(n)
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e6


def interleaved(fns: dict[str, Callable[[], float]], rounds: int, *, collect: bool = False
                ) -> dict[str, list[float]]:
    """Run each of ``fns`` (each returns its time per item) once per round, the order rotating
    from round to round (drift on a shared machine hits every contender alike); the figures.
    ``collect``: a full garbage collection before each (the previous one's garbage is not the
    next one's cost)."""
    names = list(fns)
    out: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            if collect:
                gc.collect()
            out[name].append(fns[name]())
    return out
