"""Chrome/Perfetto trace writer: one track per stream, a slice per operation, flows, counters.

Open the file in https://ui.perfetto.dev or chrome://tracing. Each device is a process, each
stream a named thread track; every operation is a slice (kernel name, bytes, arguments) and a
graph launch contains its nodes as nested slices (nodes run by graph workers get a track of
their own). A wait enqueued on another stream's work is a flow arrow from the operation it
waits for (whether or not it had to block there); pool reserved/used bytes are counters;
capture begin/end are instant markers.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from . import instrument
from .device import devices
from .errors import InvalidValueError, NotReadyError, StreamRTError
from .instrument import OpInfo
from .pool import MemPoolAttr, find_pool
from .validate import as_path
from .weak import members

__all__ = ["trace", "Tracer"]

_WORKER_TIDS = 1 << 20  # graph worker tracks are numbered from here, past any stream id
_HOST_PID = 0  # the host process: a track per host thread, with its user ranges (devices: 1+)


class Tracer:
    """Collects trace events while active; :meth:`write` saves them as Chrome JSON."""

    wants_sites = False

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = as_path(path, "trace path")
        try:  # now, not after the traced program ran: a path it cannot write is an error here
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a"):
                pass
        except OSError as exc:
            raise InvalidValueError(f"cannot write a trace to {str(path)!r}: {exc}") from None
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()
        self.events: list[dict] = []
        self._tracks: dict[tuple[int, Any], str] = {}
        self._procs: dict[int, str] = {}
        # graph worker tracks: integer tids after every stream's (Perfetto names only int tids)
        self._workers: dict[tuple[int, str], int] = {}
        self._ends: dict[tuple[int, int], tuple[int, Any, float]] = {}  # (stream id, pos) -> end
        self._flow = 0
        self._pool_names: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._pools_seen = 0  # numbers pools (not len(_pool_names): collected ones leave it)
        # cuda: operations whose stamps are read once they completed, and per device the first
        # stamp with the host time of its enqueue (the device's clock is placed from it)
        self._pending: list[OpInfo] = []
        self._base: dict[Any, tuple[Any, float]] = {}
        self._event_nos: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._events_seen = 0
        self._host_tids: dict[int, int] = {}  # host thread ident -> its track's tid

    def _us(self, t: float) -> float:
        return round((t - self._t0) * 1e6, 3)

    def _pid(self, device: Any) -> int:
        pid = device.index + (1 if device.backend == "cpu" else 1001)
        self._procs.setdefault(pid, f"device {device.name}")
        return pid

    @staticmethod
    def _stream_track(s: Any) -> str:
        kind = "legacy default" if s._legacy else ("non-blocking" if s.non_blocking else "blocking")
        if s.name != s._q.name:  # named by the user: the name, then the stream it is
            return f"stream {s.name!r} ({s._q.name}, {kind})"
        return f"stream {s.name} ({kind})"

    def _track(self, op: OpInfo) -> tuple[int, Any]:
        top = op.parent if op.parent is not None else op
        s = top.stream  # None once the stream is gone (a stamped op placed later)
        pid = self._pid(top.device)
        if op.parent is not None and not op.thread.startswith("streamrt-cpu"):
            key = (top.sid, op.thread)  # a graph worker thread: a track of its own
            tid = self._workers.get(key)
            if tid is None:
                tid = self._workers[key] = _WORKER_TIDS + len(self._workers)
            self._tracks.setdefault((pid, tid), f"stream {top.sname} graph worker {op.thread}")
        else:
            tid = top.sid
            self._tracks.setdefault((pid, tid), self._stream_track(s) if s is not None
                                    else f"stream {top.sname}")
        return pid, tid

    # -- listener interface ------------------------------------------------------------------
    def op_start(self, op: OpInfo) -> None:
        pass

    def op_end(self, op: OpInfo) -> None:
        with self._lock:
            if op.stamps is None:
                self._slice(op, self._us(op.t0), self._us(op.t1))
            else:
                self._base.setdefault(op.device, (op.stamps[1], op.t0))
                self._pending.append(op)

    def _resolve(self) -> None:
        """Place the completed stamped operations on the device's clock (in enqueue order)."""

        left = []
        for op in self._pending:
            q, start, end = op.stamps  # type: ignore[misc]
            base, t = self._base[op.device]
            try:
                ms0, ms1 = q.elapsed_ms(base, start), q.elapsed_ms(base, end)
            except NotReadyError:
                left.append(op)  # still running: placed by a later write
                continue
            except StreamRTError:  # a failed stream (or device reset): the host's times, then
                ms0, ms1 = (op.t0 - t) * 1e3, (op.t1 - t) * 1e3
            self._slice(op, self._us(t + ms0 / 1e3), self._us(t + ms1 / 1e3))
        self._pending = left

    def _slice(self, op: OpInfo, ts: float, end: float) -> None:
        """One operation's slice (and the flow arrow of a wait); called holding ``_lock``."""
        pid, tid = self._track(op)
        args = {k: _plain(v) for k, v in op.args.items() if not k.startswith("_")}
        args["position"] = op.pos if op.parent is None else f"node {op.node or op.index}"
        name = op.name
        on = op.args.get("on")
        if op.kind == "wait" and on is not None:
            name = self._wait_name(on[0], op.args.get("_why"))
            args["on"] = f"{on[0].name}@{on[1]}"
        self.events.append({"name": name, "cat": op.kind, "ph": "X", "ts": ts,
                            "dur": max(end - ts, 0.001), "pid": pid, "tid": tid,
                            "args": args})
        if op.parent is None:
            self._ends[(op.sid, op.pos)] = (pid, tid, end)
            if len(self._ends) > 100000:
                self._ends.clear()
        if op.kind == "wait" and on is not None:
            src = self._ends.get((on[0].id, on[1]))
            if src is not None:  # arrow from the awaited operation to the wait
                self._flow += 1
                spid, stid, sts = src
                self.events.append({"name": "wait", "cat": "flow", "ph": "s", "id": self._flow,
                                    "ts": max(sts - 0.001, 0), "pid": spid, "tid": stid})
                # bound at the wait's end, when the awaited work is done: at its start the arrow
                # pointed back in time whenever the wait had to block
                self.events.append({"name": "wait", "cat": "flow", "ph": "f", "bp": "e",
                                    "id": self._flow, "ts": max(end - 0.001, ts), "pid": pid,
                                    "tid": tid})

    def _wait_name(self, other: Any, why: Any) -> str:
        """``wait event 2 (recorded on stream 'copy')``, ``wait for stream 'x' (pool reuse)``."""
        if why is not None and not isinstance(why, str):  # an Event
            n = self._event_nos.get(why)  # numbered as this trace first saw it (as pools are)
            if n is None:
                self._events_seen += 1
                n = self._event_nos[why] = self._events_seen
            return f"wait event {n} (recorded on stream {other.name!r})"
        return f"wait for stream {other.name!r}" + (f" ({why})" if why else "")

    # -- host threads: user ranges -------------------------------------------------------------
    def on_range(self, name: str, t0: float, t1: float, depth: int) -> None:
        th = threading.current_thread()
        with self._lock:
            tid = self._host_tids.get(th.ident or 0)
            if tid is None:
                tid = self._host_tids[th.ident or 0] = len(self._host_tids) + 1
                self._tracks[(_HOST_PID, tid)] = f"host thread {th.name}"
                self._procs.setdefault(_HOST_PID, "host")
            ts = max(self._us(t0), 0.0)  # (a range entered before the trace began starts with it)
            self.events.append({"name": name, "cat": "range", "ph": "X", "ts": ts,
                                "dur": max(self._us(t1) - ts, 0.001), "pid": _HOST_PID,
                                "tid": tid, "args": {"depth": depth}})

    def on_alloc(self, stream: Any, ptr: int, nbytes: int) -> None:
        self._pool_counter(ptr)

    def on_freed(self, stream: Any, pool: Any) -> None:
        self._count(pool)

    def on_sync(self, device: Any) -> None:
        for pool in members(device._pools):
            self._count(pool)

    def _pool_counter(self, ptr: int) -> None:

        pool = find_pool(ptr)
        if pool is not None:
            self._count(pool)

    def _count(self, pool: Any) -> None:

        reserved = pool.get_attr(MemPoolAttr.RESERVED_MEM_CURRENT)  # a cudaMemPool's too
        used = pool.get_attr(MemPoolAttr.USED_MEM_CURRENT)
        with self._lock:
            self.events.append({"name": self.pool_name(pool), "ph": "C",
                                "ts": self._us(time.perf_counter()), "pid": self._pid(pool.device),
                                "args": {"reserved": reserved, "used": used}})

    def pool_name(self, pool: Any) -> str:
        """A pool's counter track: "pool 3 (cpu:0)", numbered as this trace first saw it (an
        ``id()`` could repeat once a pool is collected, merging two pools' tracks)."""
        name = self._pool_names.get(pool)
        if name is None:
            self._pools_seen += 1
            kind = "default pool" if pool._is_default else f"pool {self._pools_seen}"
            name = self._pool_names[pool] = f"{kind} ({pool.device.name})"
        return name

    def on_capture(self, stream: Any, what: str) -> None:
        with self._lock:
            pid = self._pid(stream.device)
            self._tracks.setdefault((pid, stream.id), self._stream_track(stream))
            self.events.append({"name": f"capture {what}", "ph": "i", "s": "t",
                                "ts": self._us(time.perf_counter()), "pid": pid,
                                "tid": stream.id})

    # -- output ------------------------------------------------------------------------------
    def to_json(self) -> dict:
        """The trace as a Chrome trace-event JSON object."""
        with self._lock:
            self._resolve()
            meta: list[dict] = [{"name": "process_name", "ph": "M", "pid": pid,
                                 "args": {"name": name}} for pid, name in self._procs.items()]
            for (pid, tid), name in self._tracks.items():
                meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                             "args": {"name": name}})
            return {"traceEvents": meta + list(self.events), "displayTimeUnit": "ms",
                    "otherData": {"generator": "streamrt"}}

    def write(self) -> Path:
        """Write the JSON file; returns its path."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.to_json()))
        return self.path


def _plain(v: Any) -> Any:
    return v if isinstance(v, int | float | str | bool) or v is None else str(v)


def _drain() -> None:
    """Wait (without raising) for every stream's queued work, so its slices are recorded."""

    for dev in devices():
        for s in members(dev._streams):
            s._q.wait_done(s._pos)


class trace:  # noqa: N801 - used like a function
    """``with srt.trace("out.json"):`` records a Chrome/Perfetto trace of what runs inside."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.tracer = Tracer(path)

    def __enter__(self) -> Tracer:
        instrument.add(self.tracer)
        return self.tracer

    def __exit__(self, *exc: object) -> None:
        try:
            _drain()
        finally:
            instrument.remove(self.tracer)
            self.tracer.write()


def _start_from_env() -> None:
    path = os.environ.get("STREAMRT_TRACE")
    if not path:
        return
    try:
        tracer = Tracer(path)
    except InvalidValueError as exc:
        raise InvalidValueError(f"environment variable STREAMRT_TRACE: {exc.args[0]}") from None
    instrument.add(tracer)


_EXIT_WAIT_S = 2.0  # at exit, how long queued work may still take to be traced


def _write_open() -> None:
    """At exit, write every trace still recording (``STREAMRT_TRACE``, a ``trace`` never left).
    Queued work gets a short while to run and be traced; work blocked for good (behind a host
    function waiting on an event nobody sets) must not hang the exit, which in CUDA does not
    wait for streams either."""
    tracers = [x for x in instrument.listeners if isinstance(x, Tracer)]
    if not tracers:
        return
    waiter = threading.Thread(target=_drain_quietly, name="streamrt-trace-exit", daemon=True)
    waiter.start()
    waiter.join(_EXIT_WAIT_S)
    for tracer in tracers:
        instrument.remove(tracer)
        tracer.write()


def _drain_quietly() -> None:
    with contextlib.suppress(Exception):  # a failure is the program's, reported elsewhere
        _drain()


atexit.register(_write_open)
_start_from_env()
