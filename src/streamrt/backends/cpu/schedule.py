"""Parallel graph replays in progress, and the helper threads that take ready chains from them.

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
- ``gates`` (a launch of a graph with wait nodes): chain -> the ``(queue, pos)`` its first
  node, a wait node, waits for, or None. A chain is ready only once its gate is open
  (``queue.done >= pos``); the worker puts off a chain whose gate is closed (and the chains
  after it) instead of waiting in it, and waits (``wait_ready``) only when nothing else is
  ready: for a helper's chain to finish, or for a gate to open (the gate's queue calls back).

Process state: ``_active`` lists the runs in progress (the worker adds its run as it starts
and removes it once over). Helpers *linger*: a helper looks through the active runs for a
ready chain, and sleeps between looks (doubling from ``IDLE_MIN_S`` up to ``IDLE_MAX_S``)
until none has been active for ``LINGER_S``; ``_lingering`` counts those looking (and those
woken, not started yet). A run wakes a helper only while none lingers, and a helper that takes
a chain wakes the next while none lingers, so blocking branches get a thread each, up to
``LIMIT``. While the worker runs tiny nodes it holds the GIL, so a helper gets in about once
per switch interval and tiny nodes stay on the worker; once the worker releases the GIL (a
large numpy call, a blocking host function) a helper gets it at its next look and takes a
sibling. A burst of launches wakes a helper once, not once per launch.
"""

from __future__ import annotations

import contextvars
import os
import queue
import threading
import time
from collections.abc import Callable

from . import queues

WINDOW = 1024  # chains after the worker's place that a helper looks at
LIMIT = max(2, os.cpu_count() or 2)  # helper threads
IDLE_MIN_S, IDLE_MAX_S = 20e-6, 1e-3  # a lingering helper's sleeps between looks
LINGER_S = 0.05  # how long helpers keep looking once no run is active

_active: list[Run] = []
_bell: queue.SimpleQueue[None] = queue.SimpleQueue()
_threads: list[threading.Thread] = []
_lock = threading.Lock()  # _lingering and _threads
_lingering = 0


def _wake() -> None:
    """Wake a helper (starting a thread while fewer than LIMIT exist) unless one lingers."""
    global _lingering
    with _lock:
        if _lingering:
            return
        _lingering += 1  # counted now: a second waker must not wake another for the same need
        if len(_threads) < LIMIT:
            t = threading.Thread(target=_helper, name=f"streamrt-graph-{len(_threads)}",
                                 daemon=True)
            _threads.append(t)
            t.start()
    _bell.put(None)


def _helper() -> None:
    queues.in_operations.on = True  # graph nodes run here: kernels must not synchronize
    me = object()  # this helper's claim (truthy: the worker's is False)
    while True:
        _bell.get()
        try:
            _linger(me)
        except BaseException:  # noqa: S110 - a chain's failure is its run's, never this thread's
            pass


def _linger(me: object) -> None:
    """Look for ready chains in the active runs until none has been active for LINGER_S."""
    global _lingering
    pause = IDLE_MIN_S
    quiet = time.monotonic()
    try:
        while True:
            for run in list(_active):
                c = run.steal(me)
                if c is not None:
                    break
            else:
                now = time.monotonic()
                if _active:
                    quiet = now
                elif now - quiet > LINGER_S:
                    return
                time.sleep(pause)
                pause = min(pause * 2, IDLE_MAX_S)
                continue
            with _lock:
                _lingering -= 1
            _wake()  # the next helper, should this chain block
            try:
                run.ctx.copy().run(run.run_chain, run, c)  # in the launching thread's context
            finally:
                with _lock:
                    _lingering += 1
            pause = IDLE_MIN_S
    finally:
        with _lock:
            _lingering -= 1


class Run:
    """The state of one replay: which chains are claimed and done."""

    __slots__ = ("chains", "preds", "run_chain", "gates", "claimed", "done", "errors", "pos",
                 "over", "waiting", "ctx", "_cond", "_watched")

    def __init__(self, chains: list[list[tuple]], preds: list[list[int]],
                 run_chain: Callable[[Run, int], None], gates: list | None = None) -> None:
        self.chains = chains
        self.preds = preds
        self.run_chain = run_chain
        self.gates = gates
        self.claimed: dict[int, object] = {}
        self.done = [False] * len(chains)
        self.errors: list[BaseException] = []
        self.pos = 0
        self.over = False  # the worker walked every chain: nothing is left to take
        self.waiting = False  # the worker sleeps in wait_for: finished() must notify it
        self.ctx = contextvars.copy_context()  # the worker's: helpers run chains in copies
        self._cond: threading.Condition | None = None  # made by the worker's first wait
        self._watched: set[int] = set()  # chains whose closed gate calls back (wait_ready)

    def start(self) -> None:
        """On the worker: make the run visible to helpers (waking one if none lingers)."""
        _active.append(self)
        if not _lingering:
            _wake()

    def end(self) -> None:
        """On the worker, once it walked every chain and the helpers' are done."""
        self.over = True
        _active.remove(self)
        self.chains = []  # a helper still looking must not keep the operations (and what
        # their arguments hold) alive

    def steal(self, me: object) -> int | None:
        """Claim a ready chain near the worker's place, or None."""
        if self.over or self.errors:
            return None
        done, preds, claimed, gates = self.done, self.preds, self.claimed, self.gates
        claim = claimed.setdefault
        start = self.pos
        for c in range(start, min(start + WINDOW, len(done))):
            if c in claimed:
                continue
            if gates is not None:
                g = gates[c]
                if g is not None and g[0].done < g[1]:
                    continue  # its wait node's event is not there yet
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
        cond = self._cond
        if self.waiting and cond is not None:  # (made before ``waiting`` was set)
            with cond:
                cond.notify_all()

    def wait_ready(self, cands: list[int]) -> int | None:
        """On the worker: the index in ``cands`` (chains it put off) of the first one whose
        predecessors are done and whose gate is open, waiting until one is; None after a
        failure. Every closed gate among them calls back when it opens, and helpers finishing
        a chain notify: whichever comes first wakes the worker."""
        cond = self._cond
        if cond is None:
            cond = self._cond = threading.Condition(threading.Lock())
        gates, watched = self.gates, self._watched
        while True:
            i = self._first_ready(cands)
            if i is not None or self.errors:
                return i
            fresh = False
            for c in cands:
                g = gates[c] if gates is not None else None
                if g is not None and c not in watched:
                    watched.add(c)
                    g[0].watch(g[1], self._poke)  # (False: open already, seen at the next look)
                    fresh = True
            if fresh:
                continue  # a gate may have opened while the callbacks were registered: look again
            with cond:
                self.waiting = True
                try:
                    if self._first_ready(cands) is None and not self.errors:
                        cond.wait()
                finally:
                    self.waiting = False

    def _first_ready(self, cands: list[int]) -> int | None:
        done, preds, gates = self.done, self.preds, self.gates
        for i, c in enumerate(cands):
            g = gates[c] if gates is not None else None
            if (g is None or g[0].done >= g[1]) and all(done[p] for p in preds[c]):
                return i
        return None

    def _poke(self) -> None:
        """A gate opened (called by the queue it waits for, from that queue's thread)."""
        cond = self._cond
        if cond is not None:
            with cond:
                cond.notify_all()

    def wait_for(self, c: int) -> None:
        """On the worker: block until chain ``c`` (a helper's) is done."""
        cond = self._cond
        if cond is None:
            cond = self._cond = threading.Condition(threading.Lock())
        with cond:
            self.waiting = True
            try:
                while not self.done[c]:
                    cond.wait()
            finally:
                self.waiting = False
