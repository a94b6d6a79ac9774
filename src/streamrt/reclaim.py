"""Finalizers' releases, run where they can neither deadlock nor corrupt what a lock guards."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["Reclaim"]


class Reclaim:
    """Finalizers' releases that take ``lock``, run where they can neither deadlock nor corrupt.

    The garbage collector runs a finalizer at whatever allocation starts a collection: possibly on
    a thread inside a section that ``lock`` guards, where taking the lock again would wait forever
    (and a re-entrant lock would let the release change the guarded structure halfway through an
    update). So a release runs at once only while the lock is free; else it waits here until the
    lock's next holder calls :meth:`drain` on leaving.
    """

    __slots__ = ("lock", "later")

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock
        self.later: deque[tuple[Callable[..., Any], tuple]] = deque()

    def __call__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.later.append((fn, args))
        if not self.lock.locked():  # held (maybe by this very thread): its holder drains
            self.drain()

    def drain(self) -> None:
        """Run the releases left so far (call with ``lock`` free; nothing to do is cheap)."""
        while self.later:
            try:
                fn, args = self.later.popleft()
            except IndexError:  # another thread took the last one
                return
            try:
                fn(*args)
            except Exception:  # noqa: S110 - a finalizer's release never fails its drainer
                pass
