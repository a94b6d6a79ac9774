"""Per-operator counters and the plan log (the seed's "log and count during development").

Each op owns one :class:`OpStats`; phase 1 counts a plan and its workspace size (histogram
buckets are powers of two: the key is the smallest power of two >= the size, 0 for 0), phase 2
counts a call and, from an executor's second run on, a reuse; ``ops.run`` counts cache hits.
``STREAMRT_OPS_LOG=1`` (or :func:`set_log`) logs every plan on the ``streamrt.ops`` logger, so
that an op that rebuilds its executor on every call stands out.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import TYPE_CHECKING, Any

from ..validate import env_flag

if TYPE_CHECKING:
    from .executor import Executor

__all__ = ["OpStats", "set_log", "log_enabled", "bucket", "logger"]

logger = logging.getLogger("streamrt.ops")
_log = False


def set_log(on: bool) -> bool:
    """Log every plan (op, shapes, dtype, implementation, workspace bytes); returns the old flag."""
    global _log
    prev, _log = _log, bool(on)
    if _log and not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        logger.addHandler(handler)
    if _log and logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    return prev


def log_enabled() -> bool:
    """Whether plans are logged."""
    return _log


def bucket(nbytes: int) -> int:
    """Histogram bucket of a workspace size: 0, or the smallest power of two >= ``nbytes``."""
    return 0 if nbytes <= 0 else 1 << (nbytes - 1).bit_length()


class OpStats:
    """Counters of one operator (updated under ``lock``: ops run on many threads)."""

    __slots__ = ("calls", "plans", "cache_hits", "reuses", "hist", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Zero every counter."""
        self.calls = 0
        self.plans = 0
        self.cache_hits = 0
        self.reuses = 0
        self.hist: dict[int, int] = {}

    def planned(self, ex: Executor) -> None:
        """Count one phase-1 plan and log it when logging is on."""
        b = bucket(ex._ws)
        with self.lock:
            self.plans += 1
            self.hist[b] = self.hist.get(b, 0) + 1
        if _log:
            shapes = ", ".join("None" if d is None else f"{d.shape}" for d in ex.descs)
            dtypes = ",".join(sorted({d.dtype.name for d in ex.descs if d is not None}))
            logger.info("plan %s shapes=[%s] dtype=%s impl=%s workspace=%d bytes",
                        ex.op_name, shapes, dtypes, ex.impl, ex._ws)

    def snapshot(self) -> dict[str, Any]:
        """The counters as a dict (a copy)."""
        with self.lock:
            return {
                "calls": self.calls, "plans": self.plans, "cache_hits": self.cache_hits,
                "reuses": self.reuses, "workspace_hist": dict(sorted(self.hist.items())),
            }


if env_flag("STREAMRT_OPS_LOG"):
    set_log(True)
