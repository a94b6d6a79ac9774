"""Host functions on the cuda backend (``cudaLaunchHostFunc`` and graph host nodes).

The driver calls a ctypes trampoline on its own thread, which hands the Python callable to one
Python worker thread and blocks until it returns: stream order holds, and the callable may call
CUDA, which the driver's thread must never do. A job is the callable, its arguments and where
its exception goes, named by the ``userData`` the driver passes back. While host functions are
pending, the backend polls instead of making blocking CUDA calls (:func:`block`), and CUDA
release calls a finalizer makes on the driver's thread wait for the next enqueue (:func:`release`).
"""

from __future__ import annotations

import ctypes
import itertools
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .errors import check
from .runtime import NOT_READY, rt

__all__ = ["HOST_FN", "add", "add_repeating", "block", "count", "deferred", "drop", "jobs",
           "on_driver_thread", "on_worker", "outstanding", "release", "run_deferred"]

_HOSTFN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_ONE_SHOT_END = 1 << 40  # job ids below: one host function; above: a graph's host node
jobs: dict[int, tuple] = {}  # job id -> (fn, args, sink(exc))
_one_shot_ids = itertools.count(1)
_repeating_ids = itertools.count(_ONE_SHOT_END)
_work: queue.SimpleQueue = queue.SimpleQueue()
outstanding = [0]  # host functions enqueued and not yet returned (any stream); read inline
_outstanding_lock = threading.Lock()
_driver = threading.local()  # ``on`` while a thread runs the trampoline (the driver's thread)
deferred: deque[tuple[Callable[..., Any], tuple]] = deque()  # read inline before enqueues
_worker: threading.Thread | None = None
_worker_started = threading.Lock()


def count(delta: int) -> None:
    """``delta`` more (or fewer) host functions enqueued and not yet returned."""
    with _outstanding_lock:
        outstanding[0] += delta


def add(fn: Callable[..., Any], args: tuple, sink: Callable[[BaseException], Any]) -> int:
    """A job run once (``cudaLaunchHostFunc``), counted as outstanding: its ``userData``."""
    _ensure_worker()
    job = next(_one_shot_ids)
    jobs[job] = (fn, args, sink)
    count(1)
    return job


def add_repeating(fn: Callable[..., Any], args: tuple, sink: Callable[[BaseException], Any]) -> int:
    """A job run at every launch of a graph (a host node) until :func:`drop`; each launch counts
    its jobs as outstanding (:func:`count`)."""
    _ensure_worker()
    job = next(_repeating_ids)
    jobs[job] = (fn, args, sink)
    return job


def drop(job: int, *, counted: bool = False) -> None:
    """Forget a job (``counted``: a one-shot job whose enqueue failed, no longer outstanding)."""
    jobs.pop(job, None)
    if counted:
        count(-1)


def on_worker() -> bool:
    """Whether the calling thread runs host functions (every one runs on this one thread)."""
    return threading.current_thread() is _worker


def on_driver_thread() -> bool:
    """Whether the calling thread is the driver's, inside the trampoline (no CUDA calls here)."""
    return getattr(_driver, "on", False)


def block(query: Callable[[], Any], wait: Callable[[], Any], *, settle: bool = False) -> None:
    """Wait for a stream or event. While host functions are pending, poll instead of making
    the blocking call: the driver thread running a host function needs the GIL, and a
    blocking call that kept it would never return. ``settle`` (an event, which cannot gain
    work) makes the blocking call once the poll saw completion: it returns at once, and it is
    a synchronize, where the driver releases pool memory down to the release threshold."""
    if not outstanding[0]:
        check(wait())
        return
    delay = 1e-6
    while True:
        err = query()[0]
        if err != NOT_READY:
            check((err,))
            if settle:
                check(wait())
            return
        time.sleep(delay)
        delay = min(delay * 2, 1e-3)


def release(fn: Callable[..., Any], *args: Any) -> None:
    """Run a CUDA release call now or, on the driver's thread, at the next enqueue or wait: a
    finalizer the garbage collector runs in the trampoline must not call CUDA there."""
    if getattr(_driver, "on", False):
        deferred.append((fn, args))
    else:
        fn(*args)


def run_deferred() -> None:
    """Run the release calls deferred from the driver's thread."""
    while deferred:
        try:
            fn, args = deferred.popleft()
        except IndexError:  # another thread took the last one
            return
        try:
            fn(*args)
        except Exception:  # noqa: S110 - a release of a handle already gone (device reset)
            pass


def _host_worker() -> None:
    while True:
        fn, args, sink, finished = _work.get()
        try:
            fn(*args)
        except BaseException as exc:  # reported at the next synchronize, as on cpu
            sink(exc)
        finally:
            count(-1)
            finished.set()


def _trampoline(user_data: int | None) -> None:
    # On the driver's thread: never call CUDA here; run the callable on a Python thread.
    _driver.on = True
    key = user_data or 0
    job = jobs.pop(key, None) if key < _ONE_SHOT_END else jobs.get(key)
    if job is None:
        return
    finished = threading.Event()
    _work.put((*job, finished))
    finished.wait()


_trampoline_c = _HOSTFN(_trampoline)  # kept alive for the life of the process
HOST_FN = rt.cudaHostFn_t(ctypes.cast(_trampoline_c, ctypes.c_void_p).value)


def _ensure_worker() -> None:
    global _worker
    if _worker is None:
        with _worker_started:
            if _worker is None:
                _worker = threading.Thread(target=_host_worker, name="streamrt-cuda-host", daemon=True)
                _worker.start()
