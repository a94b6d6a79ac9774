"""cuda backend streams and events, bugs found on the fake CUDA runtime (``tests/cuda/fake``): the legacy
stream of a device not current, synchronize vs. work enqueued meanwhile, stream flags and priority,
marker events kept while waited on. Each test fails without its fix; they need a usable cuda
device (a GPU, or ``STREAMRT_CUDA_FAKE=1``)."""

from __future__ import annotations

import threading

import pytest

import streamrt as srt

pytestmark = pytest.mark.cuda


WINDOW = 0.25  # seconds a correct runtime keeps something blocked; only a failing one is faster


def test_legacy_stream_of_a_device_that_is_not_current(cuda0, cuda1, gate):
    # the legacy stream handle names the *current* device's legacy stream: querying or
    # synchronizing cuda:0's default stream while cuda:1 is current must still mean cuda:0's
    leg0 = cuda0.default_stream
    g = gate(leg0)
    p = srt.malloc(16, cuda1)  # makes cuda:1 the thread's current CUDA device
    assert not leg0.query()
    done = threading.Event()

    def synchronize_with_cuda1_current():
        q = srt.malloc(16, cuda1)
        leg0.synchronize()
        done.set()
        srt.free(q)

    t = threading.Thread(target=synchronize_with_cuda1_current)
    t.start()
    assert not done.wait(timeout=WINDOW)  # held by cuda:0's gate
    g.open()
    t.join(timeout=30)
    assert done.is_set()
    srt.free(p)


def test_synchronize_does_not_cover_work_enqueued_during_it(cuda0, gate, monkeypatch):
    # work enqueued (by another thread) while a synchronize waits is not proven by it
    from streamrt.backends import cuda

    s = srt.Stream(cuda0, non_blocking=True)
    p = srt.malloc(16, cuda0)
    later = []
    real = cuda.rt.cudaStreamSynchronize

    def synchronize_then_enqueue(stream):
        res = real(stream)
        if not later:
            later.append(gate(s))  # as if another thread enqueued just before the wait returned
        return res

    monkeypatch.setattr(cuda.rt, "cudaStreamSynchronize", synchronize_then_enqueue)
    s.memset(p, 0, 16)
    s.synchronize()  # no host function pending: the blocking cudaStreamSynchronize
    monkeypatch.undo()
    assert later and not s.query() and not s.record().query()  # the gate is still closed
    later[0].open()
    s.synchronize()
    assert s.query()
    srt.free(p)


def _advance_on_another_thread(s: srt.Stream) -> None:
    """``s.synchronize()`` on a thread of its own: it proves the stream's tail and so frees the
    marker events before it."""
    t = threading.Thread(target=s.synchronize)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive()


def test_marker_event_kept_while_another_thread_waits_on_it(cuda0, gate, monkeypatch):
    # a host thread waits on an event's marker while another proves the stream passed it: the
    # marker must outlive the wait (its handle was destroyed in use: invalid resource handle)
    from streamrt.backends import cuda as backend

    s = srt.Stream(cuda0, non_blocking=True)
    p = srt.malloc(64, cuda0)
    g = gate(s)
    e = s.record()
    s.memset(p, 0, 64)  # work after the record: the event's wait uses its marker, not the tail
    assert s._q.pos > e._pos
    real = backend.rt.cudaEventSynchronize

    def synchronize(ev):
        g.open()
        _advance_on_another_thread(s)
        return real(ev)

    monkeypatch.setattr(backend.rt, "cudaEventSynchronize", synchronize)
    e.synchronize()
    monkeypatch.undo()
    assert not s._q._markers and not s._q._dead  # released once nobody used them
    srt.free(p)


def test_marker_event_kept_while_another_stream_is_made_to_wait_on_it(cuda0, gate, monkeypatch):
    # the same for a cross-stream wait: the marker is read, then cudaStreamWaitEvent is called
    from streamrt.backends import cuda as backend

    s, t = srt.Stream(cuda0, non_blocking=True), srt.Stream(cuda0, non_blocking=True)
    p = srt.malloc(64, cuda0)
    g = gate(s)
    e = s.record()
    s.memset(p, 0, 64)
    assert s._q.pos > e._pos
    real = backend.rt.cudaStreamWaitEvent

    def wait_event(stream, ev, flags):
        g.open()
        _advance_on_another_thread(s)
        return real(stream, ev, flags)

    monkeypatch.setattr(backend.rt, "cudaStreamWaitEvent", wait_event)
    t.wait(e)
    monkeypatch.undo()
    t.synchronize()
    assert not s._q._markers and not s._q._dead
    srt.free(p)


@pytest.mark.parametrize(("kw", "non_blocking", "priority"), [
    ({"non_blocking": True, "priority": -3}, True, -3),
    ({"priority": -1}, False, -1),
    ({}, False, 0),
])
def test_streams_are_created_with_their_flags_and_priority(cuda0, kw, non_blocking, priority):
    # The frontend orders blocking streams after the legacy stream itself, so a CUDA stream
    # created with the wrong flags or priority passed every contract test; CUDA must still be
    # told: the legacy stream also carries other libraries' work, and the scheduler reads priority
    from streamrt.backends import cuda as backend

    s = srt.Stream(cuda0, **kw)
    flags = backend.check(backend.rt.cudaStreamGetFlags(s._q.stream))
    assert bool(int(flags) & backend.rt.cudaStreamNonBlocking) is non_blocking
    # CUDA clamps a priority into the device's range (Hopper's is [-5, 0]; older GPUs' narrower)
    least, greatest = backend.check(backend.rt.cudaDeviceGetStreamPriorityRange())
    expected = min(max(priority, greatest), least)
    assert backend.check(backend.rt.cudaStreamGetPriority(s._q.stream)) == expected


@pytest.mark.parametrize("how", ["query", "synchronize", "event"])
def test_an_operation_being_handed_to_cuda_is_not_proven_by_an_idle_stream(cuda0, gate,
                                                                             monkeypatch, how):
    # Another thread asks how far a stream got while this one has counted an operation but not
    # yet handed it to CUDA: the stream is idle in CUDA, which proves only the operations before
    # it (the answer used to cover the operation being enqueued, so its stream read as done)
    from streamrt.backends import cuda as backend

    s, other = srt.Stream(cuda0, non_blocking=True), srt.Stream(cuda0, non_blocking=True)
    p = srt.malloc(16, cuda0)
    g = gate(other)
    held = other.record()
    real = backend.rt.cudaMemsetAsync

    def memset(dst, value, nbytes, stream):
        ask = (lambda: s.record().synchronize()) if how == "event" else getattr(s, how)
        t = threading.Thread(target=ask)
        t.start()
        t.join(timeout=30)
        assert not t.is_alive()
        assert s._host < s._pos  # nor does the host claim to have seen it
        with other._q._pinned():  # the memset lands behind the gate, as if it took that long
            ev = other._q._event_at(held._pos)
            backend.check(backend.rt.cudaStreamWaitEvent(stream, ev, 0))
        return real(dst, value, nbytes, stream)

    monkeypatch.setattr(backend.rt, "cudaMemsetAsync", memset)
    s.memset(p, 0, 16)
    monkeypatch.undo()
    assert not s.query()
    g.open()
    s.synchronize()
    assert s.query()
    srt.free(p)
