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
    """Counters of one operator; ops run on many threads, and the counts stay exact.

    ``calls``, ``reuses`` and ``cache_hits`` are counted on the run path without a lock: each
    thread adds to its own list (``counters()``, one per thread, kept in ``_lists``), and only
    that thread ever writes it, so no increment is lost; a read sums the lists. A reset never
    writes another thread's list either: it moves ``_base`` (the sums at the reset), which reads
    subtract. Plans and the histogram are counted under ``lock`` (phase 1 is not the hot path).
    """

    __slots__ = ("plans", "hist", "lock", "_local", "_lists", "_base")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._local = threading.local()
        self._lists: list[list[int]] = []  # [calls, reuses, cache_hits] of each thread
        self._base = [0, 0, 0]
        self.plans = 0
        self.hist: dict[int, int] = {}

    def counters(self) -> list[int]:
        """The calling thread's ``[calls, reuses, cache_hits]``: only this thread adds to it."""
        try:
            return self._local.c  # type: ignore[no-any-return]
        except AttributeError:
            c = self._local.c = [0, 0, 0]
            with self.lock:
                self._lists.append(c)
            return c

    def _sums(self) -> list[int]:
        """[calls, reuses, cache_hits] since the last reset."""
        lists, base = self._lists, self._base
        return [sum(c[i] for c in lists) - base[i] for i in range(3)]

    def reset(self) -> None:
        """Zero every counter."""
        with self.lock:
            self._reset()

    def _reset(self) -> None:
        lists = self._lists
        self._base = [sum(c[i] for c in lists) for i in range(3)]
        self.plans = 0
        self.hist = {}

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

    def snapshot(self, *, reset: bool = False) -> dict[str, Any]:
        """The counters as a dict (a copy); ``reset``: zero them in the same step."""
        with self.lock:
            calls, reuses, hits = self._sums()
            out = {
                "calls": calls, "plans": self.plans, "cache_hits": hits,
                "reuses": reuses, "workspace_hist": dict(sorted(self.hist.items())),
            }
            if reset:
                self._reset()
        return out

    @property
    def calls(self) -> int:
        """Phase-2 runs counted."""
        return self._sums()[0]

    @property
    def reuses(self) -> int:
        """Runs of an executor after its first."""
        return self._sums()[1]

    @property
    def cache_hits(self) -> int:
        """``ops.run`` calls served by an executor cache."""
        return self._sums()[2]


if env_flag("STREAMRT_OPS_LOG"):
    set_log(True)
