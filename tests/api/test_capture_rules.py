"""API.md §5 capture and DESIGN.md §5 (normative capture rules)."""
from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt

from .conftest import add_one, other_thread, sync, two_streams

pytestmark = [pytest.mark.api, pytest.mark.timeout(60)]
N = 256
CM = srt.CaptureMode


@pytest.fixture
def buf(dev):
    p = srt.malloc(N * 4)
    srt.write(p, np.zeros(N, np.float32))
    yield p
    srt.free(p)


def expect_invalidated(*streams):
    """Ending the capture fails with CaptureInvalidatedError; no stream is left capturing."""
    with pytest.raises(srt.CaptureInvalidatedError):
        streams[0].end_capture()
    assert not any(s.is_capturing() for s in streams)


def begin(s, mode=None):
    """begin_capture, in its default mode when mode is None."""
    if mode is None:
        s.begin_capture()
    else:
        s.begin_capture(mode)


def forked(buf):
    """s1 captures; s2 joins its capture through an event and launches add_one on buf."""
    s1, s2 = two_streams()
    s1.begin_capture()
    s2.wait(s1.record())
    s2.launch(add_one, buf, N)
    return s1, s2


def test_capture_info_and_status(buf):
    s = srt.Stream(non_blocking=True)
    assert not s.is_capturing()
    info = s.capture_info()
    assert info.status == srt.CaptureStatus.NONE
    s.begin_capture()
    assert s.is_capturing()
    s.launch(add_one, buf, N)
    info = s.capture_info()
    assert isinstance(info, srt.CaptureInfo)
    assert info.status == srt.CaptureStatus.ACTIVE and isinstance(info.capture_id, int)
    assert isinstance(info.graph, srt.Graph) and len(info.dependencies) == 1
    assert info.dependencies[0].type == srt.NodeType.KERNEL
    g = s.end_capture()
    assert not s.is_capturing() and len(g.nodes()) == 1
    assert (srt.read(buf, (N,), np.float32) == 0).all()   # captured work did not run


def test_capture_ids_differ(buf):
    s = srt.Stream(non_blocking=True)
    s.begin_capture()
    i1 = s.capture_info().capture_id
    s.end_capture()
    s.begin_capture()
    i2 = s.capture_info().capture_id
    s.end_capture()
    assert i1 != i2


def test_capture_context_manager(buf):
    s = srt.Stream(non_blocking=True)
    with srt.graph_capture(s, mode=CM.THREAD_LOCAL) as cap:
        s.launch(add_one, buf, N)
        s.launch(add_one, buf, N)
    g = cap.graph
    assert [n.type for n in g.nodes()] == [srt.NodeType.KERNEL] * 2
    ge = g.instantiate()
    ge.launch(s)
    sync(s)
    assert (srt.read(buf, (N,), np.float32) == 2).all()


def test_capture_legacy_stream_refused(dev):
    with pytest.raises(srt.CaptureUnsupportedError):
        dev.default_stream.begin_capture()
    assert not dev.default_stream.is_capturing()


def test_capture_begin_twice(dev):
    s = srt.Stream(non_blocking=True)
    s.begin_capture()
    with pytest.raises(srt.StreamRTError):
        s.begin_capture()
    s.end_capture()


def test_capture_end_without_begin(dev):
    s = srt.Stream(non_blocking=True)
    with pytest.raises(srt.StreamRTError):
        s.end_capture()


@pytest.mark.parametrize("joined", [False, True], ids=["sync_invalidates",
                                                     "invalidation_leaves_all_joined_streams"])
def test_capture_sync_invalidates(buf, joined):
    if joined:
        s1, s2 = forked(buf)       # s2 joined s1's capture; its synchronize invalidates it
    else:
        s1 = s2 = srt.Stream(non_blocking=True)
        s1.begin_capture()
        s1.launch(add_one, buf, N)
    with pytest.raises(srt.CaptureUnsupportedError):
        s2.synchronize()
    assert s1.capture_info().status == srt.CaptureStatus.INVALIDATED
    expect_invalidated(s1, s2)
    s2.launch(add_one, buf, N)   # usable afterwards, eager again
    sync(s2)
    assert (srt.read(buf, (N,), np.float32) == 1).all()


# Calls that are illegal while capturing: each raises its error and invalidates the capture.
# id: (capture mode (None: the default), on a blocking stream,
#      [(the call, made from (stream, device, buf) once the capture began, its error), ...])
UNSUPPORTED, CAPTURED_EVENT = srt.CaptureUnsupportedError, srt.CapturedEventError
ILLEGAL = {
    "query_illegal": (None, False, [(lambda s, dev, buf: s.query, UNSUPPORTED)]),
    "device_sync_illegal": (None, False, [(lambda s, dev, buf: dev.synchronize, UNSUPPORTED)]),
    "captured_event_sync_query": (None, False, [(lambda s, dev, buf: s.record().query, CAPTURED_EVENT),
                                                (lambda s, dev, buf: s.record().synchronize,
                                                 CAPTURED_EVENT)]),
    "thread_local_same_thread_refused": (CM.THREAD_LOCAL, False,
                                         [(lambda s, dev, buf: lambda: srt.malloc(16), UNSUPPORTED)]),
    "implicit_legacy": (CM.RELAXED, True,
                        [(lambda s, dev, buf: lambda: dev.default_stream.launch(add_one, buf, N),
                          srt.CaptureImplicitError)]),
}


@pytest.mark.parametrize("mode, blocking, rounds", ILLEGAL.values(), ids=ILLEGAL.keys())
def test_capture_illegal_call_invalidates(buf, dev, mode, blocking, rounds):
    s = srt.Stream(non_blocking=not blocking)
    for make, error in rounds:
        begin(s, mode)
        call = make(s, dev, buf)
        with pytest.raises(error):
            call()
        expect_invalidated(s)


def test_capture_fork_join(buf):
    s1, s2 = two_streams()
    other = srt.malloc(N * 4)
    srt.write(other, np.zeros(N, np.float32))
    s1.begin_capture()
    s1.launch(add_one, buf, N)
    s2.wait(s1.record())
    assert s2.is_capturing()
    assert s2.capture_info().capture_id == s1.capture_info().capture_id
    s2.launch(add_one, other, N)
    s1.launch(add_one, buf, N)
    s1.wait(s2.record())
    s1.launch(add_one, buf, N)
    g = s1.end_capture()
    assert not s2.is_capturing()
    nodes = g.nodes()
    assert len([n for n in nodes if n.type == srt.NodeType.KERNEL]) == 4
    last = [n for n in nodes if n.type == srt.NodeType.KERNEL][-1]
    assert len(last.dependencies) == 2
    ge = g.instantiate()
    ge.launch(s1)
    sync(s1)
    assert (srt.read(buf, (N,), np.float32) == 3).all()
    assert (srt.read(other, (N,), np.float32) == 1).all()
    srt.free(other)


def test_capture_unjoined(buf):
    s1, s2 = forked(buf)
    with pytest.raises(srt.CaptureUnjoinedError):
        s1.end_capture()
    assert not s2.is_capturing() and not s1.is_capturing()


def test_capture_unmatched(buf):
    s1, s2 = forked(buf)
    with pytest.raises(srt.CaptureUnmatchedError):
        s2.end_capture()
    try:
        s1.wait(s2.record())
        s1.end_capture()
    except srt.CaptureInvalidatedError:
        pass
    if s1.is_capturing():
        with pytest.raises(srt.CaptureInvalidatedError):
            s1.end_capture()
    assert not s1.is_capturing() and not s2.is_capturing()


def test_capture_wrong_thread(dev):
    s = srt.Stream(non_blocking=True)
    s.begin_capture(CM.GLOBAL)
    box = other_thread(s.end_capture)
    assert isinstance(box.get("e"), srt.CaptureWrongThreadError)
    assert s.is_capturing() or True
    try:
        s.end_capture()
    except srt.StreamRTError:
        pass


def test_capture_relaxed_end_from_other_thread(dev):
    s = srt.Stream(non_blocking=True)
    s.begin_capture(CM.RELAXED)
    box = other_thread(s.end_capture)
    assert isinstance(box.get("r"), srt.Graph), box


def test_capture_merge(buf):
    a, b = two_streams()
    a.begin_capture(CM.RELAXED)
    b.begin_capture(CM.RELAXED)
    ea = a.record()
    with pytest.raises(srt.CaptureMergeError):
        b.wait(ea)
    try:
        a.end_capture()       # whether a's capture is invalidated too is not specified
    except srt.CaptureInvalidatedError:
        pass
    with pytest.raises(srt.CaptureInvalidatedError):
        b.end_capture()


def test_capture_isolation(buf):
    a, b = two_streams()
    b.launch(add_one, buf, N)
    e = b.record()
    a.begin_capture()
    with pytest.raises(srt.CaptureIsolationError):
        a.wait(e)
    expect_invalidated(a)
    sync(b)


def test_capture_nonblocking_does_not_block_legacy(buf, dev):
    s = srt.Stream(non_blocking=True)
    s.begin_capture(CM.RELAXED)
    dev.default_stream.launch(add_one, buf, N)
    g = s.end_capture()
    assert len(g.nodes()) == 0
    sync(dev.default_stream)


@pytest.mark.parametrize("call", ["malloc", "free", "malloc_host", "memcpy", "memset"])
def test_capture_unsafe_calls_global_same_thread(call, dev):
    p = srt.malloc(64)
    host = np.zeros(16, np.float32)
    fns = {"malloc": lambda: srt.malloc(16), "free": lambda: srt.free(p),
           "malloc_host": lambda: srt.malloc_host(16), "memcpy": lambda: srt.memcpy(host, p, 64),
           "memset": lambda: srt.memset(p, 0, 64)}
    s = srt.Stream(non_blocking=True)
    s.begin_capture(CM.GLOBAL)
    with pytest.raises(srt.CaptureUnsupportedError):
        fns[call]()
    expect_invalidated(s)
    if call != "free":
        srt.free(p)


def test_capture_relaxed_allows_unsafe(dev):
    s = srt.Stream(non_blocking=True)
    s.begin_capture(CM.RELAXED)
    p = srt.malloc(16)
    srt.memset(p, 1, 16)
    srt.free(p)
    g = s.end_capture()
    assert isinstance(g, srt.Graph)


# Another thread's unsafe call (malloc, free) during this thread's capture, by capture mode:
# id: (mode (None: the default, GLOBAL), whether the call is refused)
OTHER_THREAD_UNSAFE = {
    "default_mode_global": (None, True),              # default GLOBAL: gates other threads too
    "global_other_thread_blocks_unsafe": (CM.GLOBAL, True),
    "thread_local_other_thread_allows_unsafe": (CM.THREAD_LOCAL, False),
    # this thread's RELAXED capture does not gate; another thread's GLOBAL one does
    "relaxed_other_thread_global_capture_in_this_thread": (CM.RELAXED, False),
}


@pytest.mark.parametrize("mode, refused", OTHER_THREAD_UNSAFE.values(), ids=OTHER_THREAD_UNSAFE.keys())
def test_capture_other_thread_unsafe_call(dev, mode, refused):
    s = srt.Stream(non_blocking=True)
    begin(s, mode)
    box = other_thread(lambda: srt.free(srt.malloc(16)))
    if refused:
        assert isinstance(box.get("e"), srt.CaptureUnsupportedError), box
        try:
            s.end_capture()
        except srt.CaptureInvalidatedError:
            pass
    else:
        assert "e" not in box, box
        assert isinstance(s.end_capture(), srt.Graph)


def test_capture_pool_alloc_becomes_mem_nodes(dev):
    s = srt.Stream(non_blocking=True)
    out = srt.malloc(N * 4)
    s.begin_capture(CM.THREAD_LOCAL)
    p = s.malloc(N * 4)
    s.memset(p, 0, N * 4)
    s.launch(add_one, p, N)
    s.memcpy(out, p, N * 4)
    s.free(p)
    g = s.end_capture()
    types = [n.type for n in g.nodes()]
    assert types[0] == srt.NodeType.MEM_ALLOC and types[-1] == srt.NodeType.MEM_FREE
    assert g.nodes()[0].ptr == p
    ge = g.instantiate()
    for _ in range(2):
        ge.launch(s)
    sync(s)
    assert (srt.read(out, (N,), np.float32) == 1).all()
    ge.destroy()
    srt.free(out)


def test_capture_update_dependencies(buf):
    s = srt.Stream(non_blocking=True)
    s.begin_capture()
    s.launch(add_one, buf, N)
    first = s.capture_info().dependencies
    s.update_capture_dependencies((), replace=True)
    s.launch(add_one, buf, N)
    g = s.end_capture()
    nodes = g.nodes()
    assert len(g.root_nodes()) == 2 and g.edges() == []
    s.begin_capture()
    a = g  # noqa: F841
    s.launch(add_one, buf, N)
    n1 = s.capture_info().dependencies
    s.update_capture_dependencies((), replace=True)
    s.launch(add_one, buf, N)
    s.update_capture_dependencies(n1)          # add
    s.launch(add_one, buf, N)
    g2 = s.end_capture()
    last = g2.nodes()[-1]
    assert len(last.dependencies) == 2
    del first, nodes


def test_capture_host_func_and_event_record_uncaptured_wait(buf):
    # an event recorded in capture, waited on outside capture is illegal only for its sync
    s = srt.Stream(non_blocking=True)
    log = []
    s.begin_capture()
    s.launch_host_func(log.append, 1)
    g = s.end_capture()
    assert g.nodes()[0].type == srt.NodeType.HOST and log == []
    ge = g.instantiate()
    ge.launch(s)
    ge.launch(s)
    sync(s)
    assert log == [1, 1]
