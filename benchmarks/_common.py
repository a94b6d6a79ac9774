"""Shared timing helper of the benchmark scripts (best of several repetitions, in one process)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


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
