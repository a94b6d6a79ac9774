"""Forced interleavings of host threads (see tests/contract/test_stream_threads.py): a thread that runs
an action and says when it settled, hooks at the points where the runtime can switch threads
(a call into ``Stream._snapshot``, a read of an attribute, a lock that another thread waits
for), and kernels that fail at once or when released."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import streamrt as srt


@srt.kernel
def fail_kernel(ctx, why):
    """Fails at once."""
    raise RuntimeError(why)


@srt.kernel
def fail_after_kernel(ctx, go, why):
    """Fails once ``go`` is set."""
    if not go.wait(timeout=30):
        raise TimeoutError("never released")
    raise RuntimeError(why)


class Background:
    """``fn()`` on a thread; ``settled`` is set when it returns or raises."""

    def __init__(self, fn: Callable[[], Any], settled: threading.Event) -> None:
        self.exc: BaseException | None = None

        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # re-raised by join, or inspected
                self.exc = exc
            finally:
                settled.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self) -> BaseException | None:
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()
        return self.exc


def blocked_on(q: Any, settled: threading.Event, monkeypatch) -> threading.Event:
    """Set ``settled`` (and the event returned) when a thread asks ``q`` for a position it has
    not reached: that thread is blocked on q's pending work (a host thread's synchronize and a
    worker's wait op both wait in ``q._wait``; a wait op binds it when enqueued: patch before)."""
    blocked = threading.Event()
    real = q._wait

    def wait(pos: int) -> None:
        if q.done < pos:
            blocked.set()
            settled.set()
        real(pos)

    monkeypatch.setattr(q, "_wait", wait)
    return blocked


def before_snapshot(monkeypatch, s: srt.Stream, action: Callable[[], None]) -> list[bool]:
    """Run ``action`` once, at the next call of ``s._snapshot()``, before it reads anything: what
    another thread does while the caller switches out there. Returns ``[armed]``."""
    real = srt.Stream._snapshot
    armed = [True]

    def snapshot(self: srt.Stream) -> dict[int, int]:
        if armed[0] and self is s:
            armed[0] = False
            action()
        return real(self)

    monkeypatch.setattr(srt.Stream, "_snapshot", snapshot)
    return armed


def on_read(monkeypatch, name: str, s: Any, action: Callable[[], None], skip: int = 0) -> list[bool]:
    """Run ``action`` once, at the read of the slot ``s.<name>`` (a stream's or an event's) after
    the next ``skip`` ones, before the value is returned. Returns ``[armed]``."""
    cls = type(s)
    member = cls.__dict__[name]
    armed, left = [True], [skip]

    def get(self: Any) -> Any:
        if armed[0] and self is s:
            if left[0]:
                left[0] -= 1
            else:
                armed[0] = False
                action()
        return member.__get__(self, cls)

    monkeypatch.setattr(cls, name, property(get, member.__set__))
    return armed


class Contended:
    """A lock that sets ``waiting`` when a thread has to wait for it."""

    def __init__(self, lock: Any, waiting: threading.Event) -> None:
        self.lock, self.waiting = lock, waiting

    def __enter__(self) -> Contended:
        if not self.lock.acquire(blocking=False):
            self.waiting.set()
            self.lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


# -- capture while other threads use its streams ----------------------------------------------
@srt.kernel
def note_kernel(ctx, out, what):
    """Appends ``what`` to ``out`` where it runs."""
    out.append(what)
