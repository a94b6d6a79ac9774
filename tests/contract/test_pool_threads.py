"""A device's current pool (``set_mem_pool``, ``mem_pool``) while another host thread destroys a
pool: "is it current?" and the change are one step, as ``cudaDeviceSetMemPool`` and
``cudaMemPoolDestroy`` are from any thread.

Interleavings are forced with hooks (see tests/contract/interleave.py): the other thread's call
runs at the hook until it has finished or blocked on the device's pool lock, never by time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import streamrt as srt
from tests.contract.interleave import Background, Contended


def pool_read_hook(monkeypatch, dev: srt.Device, action: Callable[[], None]) -> list[bool]:
    """Run ``action`` once, in the main thread, just after the next read of ``dev._pool`` there
    (the value read is returned: what a caller saw before another thread changed it)."""
    main = threading.current_thread()
    armed = [False]

    slot = srt.Device.__dict__["_pool"]  # the declared state's descriptor (Device.__slots__)

    def get(self: srt.Device) -> Any:
        value = slot.__get__(self, srt.Device)
        if armed[0] and self is dev and threading.current_thread() is main:
            armed[0] = False
            action()
        return value

    def put(self: srt.Device, value: Any) -> None:
        slot.__set__(self, value)

    monkeypatch.setattr(srt.Device, "_pool", property(get, put), raising=False)
    return armed


def in_background(dev: srt.Device, monkeypatch,
                  fn: Callable[[], None]) -> tuple[list[Background], Callable[[], None]]:
    """An action starting ``fn`` on a thread, returning once it has finished or is waiting for
    the device's pool lock (held by the main thread's call, where there is one); and the list
    that gets that thread."""
    settled = threading.Event()
    if hasattr(dev, "_pool_lock"):
        monkeypatch.setattr(dev, "_pool_lock", Contended(dev._pool_lock, settled))
    threads: list[Background] = []

    def action() -> None:
        threads.append(Background(fn, settled))
        assert settled.wait(timeout=30)

    return threads, action


@pytest.fixture
def dev(monkeypatch):
    d = srt.Device("cpu:0")
    monkeypatch.setattr(d, "_pool", None)  # the test's current pool goes with it
    yield d
    d.synchronize()


def test_pool_destroy_keeps_a_pool_another_thread_made_current(dev, monkeypatch):
    # Thread A destroys pool p, current; thread B makes pool q current meanwhile. A read "p is
    # current", B set q, then A reset the current pool to None: B's set_mem_pool was lost and
    # the device went back to its default pool.
    p, q = srt.MemPool(dev), srt.MemPool(dev)
    dev.set_mem_pool(p)
    threads, action = in_background(dev, monkeypatch, lambda: dev.set_mem_pool(q))
    armed = pool_read_hook(monkeypatch, dev, action)
    armed[0] = True
    p.destroy()
    assert not armed[0]
    assert threads[0].join() is None
    assert dev.mem_pool is q
    s = srt.Stream(dev, non_blocking=True)
    ptr = s.malloc(512)
    assert srt.pool.find_pool(ptr) is q
    s.free(ptr)
    s.synchronize()
    q.destroy()
    assert dev.mem_pool is dev.default_mem_pool


def test_set_mem_pool_of_a_pool_destroyed_meanwhile_leaves_it_not_current(dev, monkeypatch):
    # Thread A makes pool p current while thread B destroys it. A checked p alive, B destroyed it
    # (not current yet: nothing to reset), then A made it current: every later s.malloc without a
    # pool raised InvalidHandleError, until someone set another pool.
    p = srt.MemPool(dev)
    threads, action = in_background(dev, monkeypatch, p.destroy)
    real = srt.MemPool._check_alive
    main = threading.current_thread()
    armed = [True]

    def check_alive(self: srt.MemPool) -> None:
        real(self)
        if armed[0] and self is p and threading.current_thread() is main:
            armed[0] = False
            action()

    monkeypatch.setattr(srt.MemPool, "_check_alive", check_alive)
    dev.set_mem_pool(p)  # checked before the destroy: made current, then reset by it
    assert not armed[0]
    assert threads[0].join() is None
    assert dev.mem_pool is dev.default_mem_pool
    s = srt.Stream(dev, non_blocking=True)
    ptr = s.malloc(512)
    s.free(ptr)
    s.synchronize()
    with pytest.raises(srt.InvalidHandleError):
        dev.set_mem_pool(p)


def test_mem_pool_read_while_the_pool_is_destroyed_is_a_pool(dev, monkeypatch):
    # dev.mem_pool read the current pool twice: p, then (another thread destroyed p meanwhile)
    # None, which it returned.
    p = srt.MemPool(dev)
    dev.set_mem_pool(p)
    armed = pool_read_hook(monkeypatch, dev, p.destroy)
    armed[0] = True
    got = dev.mem_pool
    assert not armed[0]
    assert isinstance(got, srt.MemPool)
    assert dev.mem_pool is dev.default_mem_pool
