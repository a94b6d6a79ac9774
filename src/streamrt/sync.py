"""Host synchronization (vector clocks' host side): what a synchronize proves, reports, releases.

A synchronize of a stream, an event or a device waits for its queue positions, records on every
stream it covers the position the host saw complete (``_host``: pools reuse such frees whatever
their flags), lets the pools apply their release threshold, then raises the first failure of the
work it covers (``LaunchError``, or the sanitizer's first finding). ``streams`` maps stream ids
to live streams, for clocks that name them.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import instrument
from .errors import LaunchError
from .validate import env_flag
from .weak import members

if TYPE_CHECKING:
    from .device import Device
    from .stream import Stream

__all__ = ["synchronize_device"]

streams: weakref.WeakValueDictionary[int, Stream] = weakref.WeakValueDictionary()
# called as ``fn(device)`` after every host synchronize (pools apply their release threshold,
# retired graph memory goes): modules above this one observe synchronizes without a cycle
sync_listeners: list[Callable[[Any], None]] = []
# called as ``fn(device)`` before a device synchronize, which may refuse it (capture.py: a
# synchronize of a device one of whose streams captures)
device_sync_checks: list[Callable[[Any], None]] = []
_launch_blocking = env_flag("STREAMRT_LAUNCH_BLOCKING")


def set_launch_blocking(on: bool) -> bool:
    """Make every enqueue synchronous (``STREAMRT_LAUNCH_BLOCKING``); returns the previous value."""
    global _launch_blocking
    prev, _launch_blocking = _launch_blocking, bool(on)
    for fn in instrument.on_change:  # the streams' process-wide slow-path switch
        fn()
    return prev


def launch_blocking() -> bool:
    """Whether every enqueue is synchronous (a synchronize follows it)."""
    return _launch_blocking


def retire(device: Device, q: Any) -> None:
    """A stream is gone: its queue drains and stops; its failures stay reportable by the device."""
    q.close()
    retired = device._retired
    # a program that never synchronizes its device retires streams for days: drop the queues
    # with nothing left to drain (finished first: a running worker may still fail)
    _drop_reported(retired, [r for r in retired if r.finished()])
    if q not in retired:
        retired.append(q)


def _drop_reported(retired: list[Any], done: list[Any]) -> None:
    """Remove from ``retired`` the queues of ``done`` (all their work ran) with no failure left
    to report, in place."""
    for q in done:
        if not q.errors:
            with contextlib.suppress(ValueError):  # another thread removed it first
                retired.remove(q)


def covered(clock: dict[int, int]) -> list[tuple[Stream, int]]:
    out = []
    for sid, p in clock.items():
        s = streams.get(sid)
        if s is not None:
            out.append((s, p))
    return out


def proved(stream: Stream, pos: int, clock: dict[int, int]) -> None:
    """Record that the host saw ``stream`` reach ``pos`` (and so everything ``clock`` covers)."""
    if pos > stream._host:
        stream._host = pos
    for sid, p in clock.items():
        s = streams.get(sid)
        if s is not None and p > s._host:
            s._host = p
    if instrument.listeners:  # work enqueued from now on is ordered after what the host saw
        instrument.prove(stream.id, pos, clock)


def ran(stream: Stream) -> int:
    """The position up to which ``stream``'s work has run: ``done``, or past it the run of
    operations doing nothing that follows it (a free's marker, a wait for work that had run:
    eager.py), which need no worker pass to count as run (``_nops``: their positions, read once)."""
    done = stream._q.done
    first, last = stream._nops
    return last if first - 1 <= done < last else done


def reach(stream: Stream, pos: int, clock: dict[int, int]) -> tuple[int, dict[int, int]]:
    """Block until ``stream`` has completed ``pos`` operations and record what the host saw;
    returns the position and clock proved. ``clock`` must be read, then ``pos``, before the call
    (see ``Stream._snapshot``). Less is proved when another thread has counted an operation
    before ``pos`` but is still handing it to CUDA: the backend proved only what came before."""
    q = stream._q
    q.wait_done(pos)
    if q.done < pos:
        pos, clock = q.done, {}
    proved(stream, pos, clock)
    return pos, clock


def after_sync(device: Device, covered: list[tuple[Stream, int]], extra: list | None = None) -> None:
    """Tell the pools a synchronize happened, then raise the first failure it covers."""
    for fn in sync_listeners:
        fn(device)
    if instrument.listeners:
        instrument.notify("sync", device)
    errors: list[tuple[int, BaseException, str, str]] = []
    for s, upto in covered:
        for pos, exc, what in s._q.take_errors(upto):
            site = s._site_of(pos)
            errors.append((pos, exc, what, f"{s.name} (launched at {site})" if site else s.name))
    for q in extra or ():
        for pos, exc, what in q.take_errors():
            errors.append((pos, exc, what, q.name))
    for lst in list(instrument.listeners):  # an observer may report failures its own way
        hook = getattr(lst, "sync_failures", None)
        if hook is not None:
            errors = hook(errors)
    if errors:
        pos, exc, what, where = errors[0]
        more = f" (and {len(errors) - 1} more failure(s))" if len(errors) > 1 else ""
        raise LaunchError(
            f"{what} on stream {where} raised {type(exc).__name__}: {_text(exc)}{more}"
        ) from exc


def _text(exc: BaseException, limit: int = 2000) -> str:
    """``str(exc)`` for a message, cut to ``limit`` characters; never raises: a failing
    ``__str__`` would replace the failure being reported (and lose it: it was taken)."""
    try:
        text = str(exc)
    except BaseException as err:
        return f"<str() of the exception raised {type(err).__name__}>"
    if len(text) > limit:
        text = f"{text[:limit]}... ({len(text)} characters)"
    return text


def synchronize_device(device: Device, *, skip_capturing: bool = False) -> None:
    """``cudaDeviceSynchronize``: wait for every stream of ``device``, then report failures.

    ``skip_capturing`` (the implicit synchronize of ``srt.free``, which mode gating allowed):
    capturing streams have no work to wait for, so they are left alone instead of refused.
    """
    if not skip_capturing:
        for check in device_sync_checks:
            check(device)
    streams = [s for s in members(device._streams)
               if not (skip_capturing and s._capture is not None)]
    # each stream's clock, then position, read before waiting (see Stream.synchronize): work
    # other threads enqueue meanwhile is not proved
    live = [(s, s._clock.copy(), s._pos) for s in streams]
    dead = [(s, s._clock.copy(), s._pos) for s in members(device._dead)]
    reached = [(s, *reach(s, pos, clock)) for s, clock, pos in live]  # what each proved
    seen = [(s, pos) for s, pos, _clock in reached]
    retired = device._retired
    drained = list(retired)  # destroyed streams' queues: all their work
    for q in drained:
        q.drain()
    for s, clock, pos in dead:
        proved(s, pos, clock)
    # in place: a queue another thread retires meanwhile was not drained and stays
    _drop_reported(retired, drained)
    for s, _pos, clock in reached:
        _forget_gone(s, clock)
    after_sync(device, seen, extra=drained)


def _forget_gone(s: Stream, proven: dict[int, int]) -> None:
    """Drop from ``s``'s clock the streams gone for good (destroyed or collected) whose entry
    ``proven`` (a clock this synchronize proved, and told the sanitizer) still holds: a host
    proof orders later work after theirs now. A clock names every stream it was ever ordered
    after, and a program making streams for days copied an ever larger one at every record."""
    gone = [sid for sid in proven if sid != s.id and _gone(sid)]
    if not gone:
        return
    with s._lock:  # instrumented enqueues merge waits into the clock under it
        mine = s._clock
        s._cv += 1
        for sid in gone:
            if mine.get(sid) == proven[sid]:  # not raised by a wait another thread enqueued
                del mine[sid]


def _gone(sid: int) -> bool:
    t = streams.get(sid)
    return t is None or t._destroyed
