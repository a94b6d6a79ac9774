"""The cpu backend's queues: one worker thread per stream, running ``(fn, args)`` in order.

State and invariants (per queue):
- ``ops`` holds submitted operations not yet started, flat: two items per operation, ``fn``
  then ``args``, run as ``fn(*args)`` (a kernel's ``fn`` is its body bound to its context, so
  ``args`` is the launch's own argument tuple). Each operation goes in with one ``extend`` of a
  pair: a C call that runs no Python code, so neither the worker nor another submitter ever
  sees half of one. No tuple per operation holds ``fn`` or the context: the collector untracks
  a launch's tuple of numbers at its first pass, so a backlog never grows its old generations
  (whose collections would traverse the whole backlog, again and again as it grows).
- The worker pops operations in order and
  counts ``done`` after each (only the worker writes it). It sleeps only when ``ops`` is
  empty, with ``idle`` set first; a submitter wakes it only when ``idle`` is set (the common
  enqueue is one deque extend). The bell is a ``SimpleQueue``: ringing takes no lock, so a
  stream's finalizer closing the queue on any thread, even inside this queue's lock, never
  deadlocks.
- Host threads blocked in ``wait_done`` register their target positions; the worker notifies
  them once ``done`` reaches the smallest (``_wake_at``), so a busy queue does not notify per
  operation. A graph replay waiting for several positions at once registers callbacks instead
  (``watch``), called by the worker (outside the lock) once ``done`` reaches theirs.
- A failing operation is appended to ``errors`` with its position and label; it never stops
  the worker.
- Delay injection: ``STREAMRT_CPU_DELAY_US=N`` (or :func:`set_delay_us`) makes each worker
  sleep a random 0..N microseconds before each operation, so that a missing ``wait`` in a
  program turns into a wrong result instead of passing by luck.
- ``in_operations.on`` is set in threads that run nothing but stream operations (workers,
  graph replay workers): a wait for stream work from there is a kernel or host function
  synchronizing, which CUDA forbids, and is refused.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from types import MethodType
from typing import Any

import numpy as np

from ...errors import InvalidTypeError, InvalidValueError, NotPermittedError, NotReadyError
from ...labels import describe, host_call
from ...validate import env_int, is_int
from ..base import InlineQueue, Mark, Queue

_NEVER = 1 << 62  # past any position: an int, so the worker's test compares two ints
_delay_us = env_int("STREAMRT_CPU_DELAY_US", 0)
in_operations = threading.local()


def set_delay_us(us: int) -> int:
    """Set the worker delay injection (0 = off); returns the previous value."""
    global _delay_us
    if not is_int(us):
        raise InvalidTypeError(f"the delay must be an int of microseconds, not {us!r}")
    if us < 0:
        raise InvalidValueError(f"the delay must be >= 0 microseconds, got {us}")
    prev, _delay_us = _delay_us, int(us)
    return prev


def delay_us() -> int:
    """Current worker delay injection in microseconds (0 = off)."""
    return _delay_us


def delay() -> None:
    """Sleep as delay injection asks before an operation (workers and graph replay alike)."""
    time.sleep(random.random() * _delay_us * 1e-6)


class CpuQueue(InlineQueue):
    """A worker thread running ``(fn, args)`` operations in order."""

    def __init__(self, name: str) -> None:
        self.done = 0
        self.name = name
        self.ops = deque()
        self._bell: queue.SimpleQueue = queue.SimpleQueue()
        self._progress = threading.Condition(threading.Lock())
        self.idle = False
        self._targets: list[int] = []  # positions host threads wait for in wait_done, watched
        self._watchers: list[tuple[int, Callable[[], None]]] = []  # (position, callback)
        self._wake_at = _NEVER  # the smallest of them
        self._closed = False
        self.errors: list[tuple[int, BaseException, str]] = []
        self._thread = threading.Thread(target=self._run, name=f"streamrt-{name}", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], args: tuple) -> None:
        self.ops.extend((fn, args))  # one operation, atomically (see the module docstring)
        if self.idle:
            self.wake()

    def drain(self) -> None:
        assert self._closed, "only a retired (closed) queue is drained"
        # the worker exits once closed and empty, so nothing is left running or queued then;
        # (done + queued would miss an op the worker has popped and is running)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    # -- operations: the work itself, run later by the worker ------------------------------
    def op_launch(self, kernel: Any, ctx: Any, args: tuple) -> tuple[Callable[..., Any], tuple]:
        return kernel.fn, (ctx,) + args

    def op_copy(self, dst: Any, src: Any, nbytes: int) -> tuple[Callable[..., Any], tuple]:
        return copy_op, (dst, src)

    def op_fill(self, dst: Any, value: int, nbytes: int) -> tuple[Callable[..., Any], tuple]:
        return fill_op, (dst, value)

    def op_host(self, fn: Callable[..., Any], args: tuple) -> tuple[Callable[..., Any], tuple]:
        return host_call, (fn, args)

    def op_wait(self, other: Queue | Mark, pos: int) -> tuple[Callable[..., Any], tuple]:
        assert isinstance(other, CpuQueue | CpuMark)
        return other._wait, (pos,)  # the queue's own wait: not a call from a kernel

    def op_stamp(self) -> tuple[Callable[..., Any], tuple, Any]:
        slot: list = [None]
        return _stamp, (slot,), slot

    def elapsed_ms(self, start: Any, end: Any) -> float:
        if start[0] is None or end[0] is None:
            raise NotReadyError("the event has not completed yet")
        return float(end[0] - start[0]) * 1000.0

    def wake(self) -> None:
        """Wake the idle worker (once: it may take a while to get the GIL)."""
        self.idle = False
        self._bell.put(None)

    def _run(self) -> None:
        in_operations.on = True  # this thread runs nothing but operations (see wait_done)
        ops = self.ops
        pop = ops.popleft
        done = self.done  # only this thread writes ``done``; keep it in a local too
        while True:
            try:
                fn = pop()
            except IndexError:
                fn = args = None  # the last operation's arguments may be all that keeps its stream
                # idle first, then look again: a submit either lands before the look or sees
                # ``idle`` and rings (a ring left over only makes one more empty pass)
                self.idle = True
                if not ops:
                    if self._closed:
                        return
                    self._bell.get()
                self.idle = False
                continue
            args = pop()  # there: it came in with ``fn``, in one extend
            if _delay_us:
                delay()
            try:
                fn(*args)
            except BaseException as exc:  # reported at the next synchronize, never lost
                self.errors.append((done + 1, exc, _label(fn, args, exc)))
            done += 1
            self.done = done
            if self._targets and done >= self._wake_at:  # (an empty list: no one waits)
                fire = None
                with self._progress:
                    if self._watchers:
                        fire = _due(self._watchers, self._targets, done)
                    self._wake_at = min((t for t in self._targets if t > done), default=_NEVER)
                    self._progress.notify_all()
                for call in fire or ():
                    call()

    def wait_done(self, pos: int) -> None:
        if self.done >= pos:
            return
        if getattr(in_operations, "on", False):  # a kernel or host function waiting
            raise NotPermittedError(
                f"{self.name}: a kernel or host function waited for stream work (position {pos}, "
                f"done {self.done}); the work may be queued behind it, and it would wait forever. "
                "Kernels and host functions must not synchronize (srt.malloc, srt.free, "
                "srt.memcpy and the other synchronous helpers do): CUDA forbids API calls in them")
        self._wait(pos)

    def _wait(self, pos: int) -> None:
        """Block until ``pos`` operations have completed (a wait operation runs this)."""
        if self.done >= pos:
            return
        with self._progress:
            self._targets.append(pos)
            if pos < self._wake_at:
                self._wake_at = pos
            try:
                while self.done < pos:
                    self._progress.wait()
            finally:
                self._targets.remove(pos)

    def watch(self, pos: int, call: Callable[[], None]) -> bool:
        """Have the worker call ``call()`` once ``done >= pos``; False (and no call) when it
        already is."""
        return _watch(self, pos, call)

    def finished(self) -> bool:
        return self._closed and not self._thread.is_alive()

    def close(self) -> None:
        self._closed = True  # before the ring: the worker looks at it once the queue is empty
        self._bell.put(None)


class CpuMark(Mark):
    """The completions of a graph's EVENT_RECORD node (see :class:`~..base.Mark`): the replay
    calls :meth:`record` where the node sits, and once more as the launch ends. State: ``done``
    (written under ``_progress``, only ever raised), the host threads and replays waiting for
    it, as a queue's (``_targets``, ``_watchers``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.done = 0
        self.errors: list[tuple[int, BaseException, str]] = []
        self._progress = threading.Condition(threading.Lock())
        self._targets: list[int] = []
        self._watchers: list[tuple[int, Callable[[], None]]] = []

    def record(self, k: int, stamp: list | None) -> None:
        """The node of launch ``k`` ran (or its launch ended): stamp it, then count it."""
        if stamp is not None and stamp[0] is None:
            stamp[0] = time.perf_counter()  # before ``done``: a reader of done finds the stamp
        if self.done >= k:
            return  # (again, as the launch ends)
        with self._progress:
            if k > self.done:
                self.done = k
            fire = _due(self._watchers, self._targets, k) if self._watchers else None
            self._progress.notify_all()
        for call in fire or ():
            call()

    def _wait(self, pos: int) -> None:
        """Block until launch ``pos``'s node ran (a stream's or a replay's wait runs this)."""
        if self.done >= pos:
            return
        with self._progress:
            while self.done < pos:
                self._progress.wait()

    def wait_done(self, pos: int) -> None:
        if self.done >= pos:
            return
        if getattr(in_operations, "on", False):
            raise NotPermittedError(
                f"{self.name}: a kernel or host function waited for an event recorded by a graph "
                "node; kernels and host functions must not synchronize")
        self._wait(pos)

    def watch(self, pos: int, call: Callable[[], None]) -> bool:
        """As :meth:`CpuQueue.watch`."""
        return _watch(self, pos, call)

    def op_stamp(self) -> list:
        return [None]

    def elapsed_ms(self, start: Any, end: Any) -> float:
        if start[0] is None or end[0] is None:
            raise NotReadyError("the event has not completed yet")
        return float(end[0] - start[0]) * 1000.0


def _watch(q: CpuQueue | CpuMark, pos: int, call: Callable[[], None]) -> bool:
    """Register ``call`` for ``q.done >= pos`` (see :meth:`CpuQueue.watch`)."""
    with q._progress:
        if q.done >= pos:
            return False
        q._watchers.append((pos, call))
        q._targets.append(pos)
        if isinstance(q, CpuQueue) and pos < q._wake_at:
            q._wake_at = pos
        # ``done`` is raised without the lock: had it reached pos before the worker saw the
        # entry, nothing would call back (the worker looked at the targets before the append)
        if q.done >= pos:
            q._watchers.remove((pos, call))
            q._targets.remove(pos)
            return False
    return True


def _due(watchers: list[tuple[int, Callable[[], None]]], targets: list[int], done: int
         ) -> list[Callable[[], None]]:
    """Take the callbacks of ``watchers`` due at ``done`` (and their ``targets``); call holding
    the queue's lock, call them after releasing it."""
    due = [w for w in watchers if w[0] <= done]
    for w in due:
        watchers.remove(w)
        targets.remove(w[0])
    return [call for _pos, call in due]


def _label(fn: Callable[..., Any], args: tuple, exc: BaseException) -> str:
    """The label of a failed operation: a kernel's body bound to its context (a method of a
    kernel context, which has ``array``) is labelled as the body's call."""
    if type(fn) is MethodType and hasattr(fn.__self__, "array"):
        return describe(fn.__func__, (fn.__self__, *args), exc)
    return describe(fn, args, exc)


def copy_op(dst: np.ndarray, src: Any) -> None:
    """Queue op: copy bytes between two resolved ``uint8`` views."""
    dst[:] = src


def fill_op(dst: np.ndarray, value: int) -> None:
    """Queue op: memset."""
    dst.fill(value)


def _stamp(slot: list) -> None:
    slot[0] = time.perf_counter()
