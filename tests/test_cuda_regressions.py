"""cuda backend bugs found by running it on the fake CUDA runtime (``tests/cuda/fake``); each test
fails without its fix. They need a usable cuda device (a GPU, or ``STREAMRT_CUDA_FAKE=1``)."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import streamrt as srt

from .conftest import cuda_reason

pytestmark = pytest.mark.cuda


@pytest.fixture
def cuda0():
    reason = cuda_reason()
    if reason is not None:
        pytest.skip(f"no usable CUDA device here: {reason}")
    d = srt.Device("cuda:0")
    yield d
    d.synchronize()


@pytest.fixture
def cuda1(cuda0):
    if srt.device_count("cuda") < 2:
        pytest.skip("needs two CUDA devices")
    d = srt.Device("cuda:1")
    yield d
    d.synchronize()


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


@pytest.mark.parametrize("what", ["malloc", "pool", "host"])
def test_sizes_past_size_t_are_out_of_memory(cuda0, what):
    s = srt.Stream(cuda0, non_blocking=True)
    call = {"malloc": lambda: srt.malloc(2**70, cuda0), "pool": lambda: s.malloc(2**70),
            "host": lambda: srt.malloc_host(2**70)}[what]
    with cuda0, pytest.raises(srt.OutOfMemoryError):
        call()
    pool = srt.MemPool(cuda0, max_size=2**70, release_threshold=2**70)  # no OverflowError
    pool.trim_to(2**70)
    pool.destroy()


def test_peer_copy_between_devices(cuda0, cuda1):
    a, b = srt.malloc(256, cuda0), srt.malloc(256, cuda1)
    srt.write(a, np.arange(256, dtype=np.uint8))
    srt.memcpy(b, a, 256)
    s = srt.Stream(cuda1, non_blocking=True)
    s.memcpy(a, b, 128)  # a stream of one device copying into the other's memory
    s.synchronize()
    assert srt.read(b, (256,), np.uint8).tolist() == list(range(256))
    srt.free(a)
    srt.free(b)


def test_graph_with_host_node_is_released_and_completes_in_flight(cuda0, gate):
    from streamrt.backends import cuda_hostfn

    gc.collect()
    before = len(cuda_hostfn.jobs)
    s = srt.Stream(cuda0, non_blocking=True)
    ran = []
    g = srt.Graph()
    g.add_host_node(ran.append, "in flight")
    ge = g.instantiate()
    hold = gate(s)
    ge.launch(s)
    ge.destroy()  # while its launch waits behind the gate: CUDA completes it
    del ge, g
    gc.collect()
    hold.open()
    s.synchronize()
    assert ran == ["in flight"]
    for i in range(3):
        g = srt.Graph()
        g.add_host_node(ran.append, i)
        ge = g.instantiate()
        ge.launch(s)
        s.synchronize()
        ge.destroy()
        del ge, g
    gc.collect()
    assert ran == ["in flight", 0, 1, 2]
    assert len(cuda_hostfn.jobs) == before  # no host-node job (nor its graph exec) kept alive


def test_device_reset_frees_pool_memory(cuda0):
    s = srt.Stream(cuda0, non_blocking=True)
    free_before, _ = cuda0.memory_info()
    pool = srt.MemPool(cuda0)
    ptrs = [s.malloc(4 << 20, pool) for _ in range(4)] + [s.malloc(4 << 20)]  # and the default's
    s.synchronize()
    assert cuda0.memory_info()[0] <= free_before - 20 * (1 << 20)
    cuda0.reset()  # live pool allocations and the created pool go with the reset
    # cudaMemGetInfo counts the whole GPU: the driver may keep a little for itself meanwhile (page
    # tables of the mappings it made), never a whole granule (2 MiB) of the 20 MiB freed here
    assert cuda0.memory_info()[0] > free_before - (2 << 20)
    assert ptrs and pool.reserved_mem_current == 0


def test_destroyed_pool_keeps_its_attributes_readable(cuda0):
    pool = srt.MemPool(cuda0, release_threshold=1 << 20)
    pool.destroy()
    assert pool.release_threshold == 1 << 20 and pool.stats()["used_mem_current"] == 0
    with pytest.raises(srt.InvalidHandleError):
        pool.release_threshold = 0


def test_pool_out_of_memory_says_how_much(cuda0):
    s = srt.Stream(cuda0, non_blocking=True)
    pool = srt.MemPool(cuda0, max_size=4 << 20)
    # far past the limit: a driver may round maxSize up to its own allocation granularity
    with pytest.raises(srt.OutOfMemoryError, match=r"of 67108864 bytes failed: the pool reserves"):
        s.malloc(64 << 20, pool)
    pool.destroy()


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


def test_synchronize_with_a_host_function_pending_releases_pool_memory(cuda0, monkeypatch):
    # With a host function pending, synchronize polls (the driver's thread running it needs the
    # GIL); it must still end in a synchronize call, where the driver releases pool memory
    # down to the threshold. It used to end in a query: the memory stayed reserved.
    from streamrt.backends import cuda as backend

    pool = srt.MemPool(cuda0, release_threshold=0)
    s = srt.Stream(cuda0, non_blocking=True)
    opened = threading.Event()
    s.launch_host_func(opened.wait, 30)
    p = s.malloc(1 << 20, pool)
    s.free(p)
    def polled(name: str) -> None:
        real = getattr(backend.rt, name)

        def query(handle):
            opened.set()  # the first poll lets the host function finish
            return real(handle)

        monkeypatch.setattr(backend.rt, name, query)

    polled("cudaEventQuery")
    polled("cudaStreamQuery")
    s.synchronize()
    monkeypatch.undo()
    assert opened.is_set()  # the synchronize polled
    assert pool.get_attr(srt.MemPoolAttr.RESERVED_MEM_CURRENT) == 0
    pool.destroy()


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


def test_kernel_named_unlike_its_cuda_function_is_a_clear_error(cuda0):
    # CUDA_ERROR_NOT_FOUND (500) from cuModuleGetFunction: the Python name and the extern "C"
    # name differ, the likeliest first mistake; it names the kernel, and nothing was enqueued
    src = 'extern "C" __global__ void other_name(int* p) { *p = 1; }'

    @srt.kernel(cuda=src, signature="ptr")
    def my_kernel(ctx, p):
        pass

    s = srt.Stream(cuda0, non_blocking=True)
    p = srt.malloc(4, cuda0)
    srt.memset(p, 0, 4)
    with pytest.raises(srt.InvalidValueError, match="my_kernel.*extern") as ei:
        s.launch(my_kernel, p)
    assert ei.value.code == 500
    s.synchronize()
    assert srt.read(p, (1,), np.int32)[0] == 0
    srt.free(p)
