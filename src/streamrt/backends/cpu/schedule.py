"""One parallel graph replay's state, and the helper threads that take ready chains from it.

State and invariants (per :class:`Run`, one per replay of a graph with branches):
- ``claimed``: chain -> False (the stream's worker runs it) or a helper's token. A chain is
  claimed with one ``dict.setdefault``, a single C call under the GIL, so exactly one thread
  runs it. The worker claims every chain in order (after a failure, without running the
  rest), so once it has walked them all (``over``) no helper can start one.
- ``done[c]`` becomes True once chain ``c`` ran (or failed); it never goes back. A helper
  claims only a chain whose predecessors are all done; the worker, once a helper took any
  chain, waits for each predecessor that is not done before running a chain.
- ``pos`` is the worker's place in the order: chains before it are claimed; helpers look for
  ready chains from there on, among the next ``WINDOW`` (a topological walk's frontier).
- Helpers: the worker wakes one as the replay starts; a helper that claims a chain wakes the
  next while none is idle, so blocking branches get a thread each, up to ``LIMIT``. An idle
  helper looks again after a sleep that doubles up to ``IDLE_MAX_S`` (reset when it finds a
  chain): while the worker runs tiny nodes it holds the GIL, so a helper gets in about once
  per switch interval and tiny nodes stay on the worker; once the worker releases the GIL (a
  large numpy call, a blocking host function) a helper gets it at once and takes a sibling.
"""

from __future__ import annotations

import contextvars
import functools
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from . import queues

WINDOW = 1024  # chains after the worker's place that a helper looks at
LIMIT = max(2, os.cpu_count() or 2)  # helper threads (and helpers of one run)
IDLE_MIN_S, IDLE_MAX_S = 20e-6, 2e-3  # an idle helper's sleeps between looks

_jobs: queue.SimpleQueue[Callable[[], Any]] = queue.SimpleQueue()
_threads: list[threading.Thread] = []
_threads_lock = threading.Lock()


def _helper() -> None:
    queues.in_operations.on = True  # graph nodes run here: kernels must not synchronize
    get = _jobs.get
    while True:
        job = get()
        try:
            job()
        except BaseException:  # noqa: S110 - a chain's failure is its run's, never this thread's
            pass
        job = None  # type: ignore[assignment]  # the last job must not keep its run alive


def _submit(job: Callable[[], Any]) -> None:
    if len(_threads) < LIMIT:
        with _threads_lock:
            if len(_threads) < LIMIT:
                t = threading.Thread(target=_helper, name=f"streamrt-graph-{len(_threads)}",
                                     daemon=True)
                t.start()
                _threads.append(t)
    _jobs.put(job)


class Run:
    """The state of one replay: which chains are claimed and done, and its helpers."""

    __slots__ = ("chains", "preds", "run_chain", "claimed", "done", "errors", "pos", "over",
                 "idle", "helpers", "waiting", "_cond")

    def __init__(self, chains: list[list[tuple]], preds: list[list[int]],
                 run_chain: Callable[[Run, int], None]) -> None:
        self.chains = chains
        self.preds = preds
        self.run_chain = run_chain
        self.claimed: dict[int, object] = {}
        self.done = [False] * len(chains)
        self.errors: list[BaseException] = []
        self.pos = 0
        self.over = False  # the worker walked every chain: nothing is left to take
        self.idle = 0  # helpers woken or looking for a chain (under _cond's lock)
        self.helpers = 0  # helpers of this run, idle or running a chain
        self.waiting = False  # the worker sleeps in wait_for: finished() must notify it
        self._cond = threading.Condition(threading.Lock())

    def wake(self) -> None:
        """Wake a helper for this run (in a copy of the calling thread's context)."""
        with self._cond:
            if self.idle or self.helpers >= LIMIT:
                return
            self.idle += 1
            self.helpers += 1
        _submit(functools.partial(contextvars.copy_context().run, self.help))

    def help(self) -> None:
        """A helper: take ready chains until the worker has walked them all."""
        me = object()  # this helper's claim (truthy: the worker's is False)
        pause = IDLE_MIN_S
        try:
            while not self.over and not self.errors:
                c = self._steal(me)
                if c is None:
                    time.sleep(pause)
                    pause = min(pause * 2, IDLE_MAX_S)
                    continue
                pause = IDLE_MIN_S
                with self._cond:
                    self.idle -= 1
                self.wake()  # the next helper (if none is idle), should this chain block
                self.run_chain(self, c)
                with self._cond:
                    self.idle += 1
        finally:
            with self._cond:
                self.idle -= 1
                self.helpers -= 1

    def _steal(self, me: object) -> int | None:
        """Claim a ready chain near the worker's place, or None."""
        done, preds, claimed = self.done, self.preds, self.claimed
        claim = claimed.setdefault
        start = self.pos
        for c in range(start, min(start + WINDOW, len(done))):
            if c in claimed:
                continue
            for p in preds[c]:
                if not done[p]:
                    break
            else:
                if claim(c, me) is me:
                    if self.errors:  # claimed, so the worker waits for it: done, not run
                        self.finished(c)
                        return None
                    return c
        return None

    def finished(self, c: int) -> None:
        """Chain ``c`` ran on a helper: tell the worker if it waits."""
        self.done[c] = True
        if self.waiting:
            with self._cond:
                self._cond.notify_all()

    def wait_for(self, c: int) -> None:
        """On the worker: block until chain ``c`` (a helper's) is done."""
        with self._cond:
            self.waiting = True
            try:
                while not self.done[c]:
                    self._cond.wait()
            finally:
                self.waiting = False
