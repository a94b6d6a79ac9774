"""Stream capture errors (900-908, DESIGN.md §5): unsupported calls, invalidation and leaving
capture, merge, unmatched, unjoined, isolation, implicit legacy dependencies, captured events,
wrong thread."""

from __future__ import annotations

import threading

import pytest

import streamrt as srt
from tests.conftest import add_one_kernel, cpu_only, fill_kernel, in_thread
from tests.conftest import read_f32 as _read
from tests.contract.graph.capturing import assert_invalidated_then_ended, assert_left_capture, noop

N = 16


M = srt.CaptureMode


def test_graph_capture_begin_errors(s):
    with pytest.raises(srt.InvalidTypeError):
        s.begin_capture("global")
    s.begin_capture()
    with pytest.raises(srt.IllegalStateError):
        s.begin_capture()
    s.end_capture()
    with pytest.raises(srt.IllegalStateError):
        s.end_capture()


# -- 900 unsupported ------------------------------------------------------------------------------
@pytest.mark.parametrize("what", ["synchronize", "query"])
def test_graph_capture_sync_or_query_of_capturing_stream_unsupported(s, s2, what):
    s.begin_capture()
    s2.wait(s.record())
    s.launch_host_func(noop)
    with pytest.raises(srt.CaptureUnsupportedError) as ei:
        getattr(s2, what)()  # a joined stream counts as capturing
    assert ei.value.code == 900
    with pytest.raises(srt.CaptureInvalidatedError):  # further work is refused
        s.launch_host_func(print)
    assert_invalidated_then_ended(s, s2)
    assert s2.query() and s.query()  # usable again once out of capture


def test_graph_capture_device_synchronize_unsupported(s):
    s.begin_capture()
    with pytest.raises(srt.CaptureUnsupportedError):
        s.device.synchronize()
    assert_invalidated_then_ended(s)


def test_graph_capture_device_synchronize_of_joined_streams_device_unsupported(s, dev):
    cpu_only(dev, "a capture spanning two devices needs a second device of the backend")
    # the capture began on cpu:0, a stream of cpu:1 joined it: cpu:1 now has a capturing stream
    other = srt.Stream(srt.Device("cpu:1"), non_blocking=True)
    s.begin_capture()
    s.launch_host_func(noop)
    other.wait(s.record())
    with pytest.raises(srt.CaptureUnsupportedError):
        other.device.synchronize()
    assert_invalidated_then_ended(s, other)
    other.device.synchronize()  # fine once the capture is over


def test_graph_capture_other_device_or_stream_sync_allowed(s, s2):
    other = srt.Device("cpu:1")
    s.begin_capture()
    s2.launch_host_func(noop)
    s2.synchronize()  # not capturing
    assert s2.query()
    other.synchronize()  # no capture on that device
    s.launch_host_func(noop)
    g = s.end_capture()
    assert len(g.nodes()) == 1


# -- 901 invalidated: every joined stream leaves ---------------------------------------------------
def test_graph_capture_invalidated_end_releases_every_joined_stream(s, s2, dev, buf):
    s3 = srt.Stream(dev, non_blocking=True)
    s.begin_capture()
    e = s.record()
    s2.wait(e)
    s3.wait(s2.record())
    s3.launch_host_func(noop)
    with pytest.raises(srt.CaptureUnsupportedError):
        s3.query()
    with pytest.raises(srt.CaptureInvalidatedError):
        s2.launch(add_one_kernel, buf, N)
    assert_invalidated_then_ended(s, s2, s3)
    # the events are no longer captured, the streams run eagerly again
    assert e.query()
    s3.launch(fill_kernel, buf, N, 2.0)
    s3.synchronize()
    assert (_read(buf) == 2.0).all()


@pytest.mark.parametrize(
    "call", ["launch", "malloc", "record", "update_dependencies", "fork", "join"])
def test_graph_capture_invalidated_capture_refuses_every_capture_call(s, s2, dev, call):
    s3 = srt.Stream(dev, non_blocking=True)
    s.begin_capture()
    s.launch_host_func(noop)
    fork = s.record()  # recorded while the capture is still active
    s2.wait(fork)
    s2.launch_host_func(noop)
    branch = s2.record()
    branch_nodes = s2.capture_info().dependencies
    with pytest.raises(srt.CaptureUnsupportedError):
        s2.query()  # invalidates the capture
    deps = s.capture_info().dependencies
    nodes = len(s.capture_info().graph.nodes())
    with pytest.raises(srt.CaptureInvalidatedError):
        if call == "launch":
            s.launch_host_func(noop)
        elif call == "malloc":
            s.malloc(64)
        elif call == "record":
            s.record()
        elif call == "update_dependencies":
            s.update_capture_dependencies(branch_nodes)
        elif call == "fork":
            s3.wait(fork)  # an idle stream cannot join an invalidated capture
        else:
            s.wait(branch)  # nor can a joined one merge more dependencies
    assert s.capture_info().dependencies == deps
    assert len(s.capture_info().graph.nodes()) == nodes
    assert_left_capture(s3)
    assert_invalidated_then_ended(s, s2)


# -- 902 merge ---------------------------------------------------------------------------------------
def test_graph_capture_merge_of_two_captures(s, s2):
    s.begin_capture()
    s2.begin_capture()
    s.launch_host_func(noop)
    e = s.record()
    with pytest.raises(srt.CaptureMergeError) as ei:
        s2.wait(e)
    assert ei.value.code == 902
    assert_invalidated_then_ended(s)
    assert_invalidated_then_ended(s2)


# -- 903 unmatched -------------------------------------------------------------------------------------
def test_graph_capture_end_on_joined_stream_unmatched(s, s2):
    s.begin_capture()
    s2.wait(s.record())
    s2.launch_host_func(noop)
    with pytest.raises(srt.CaptureUnmatchedError) as ei:
        s2.end_capture()
    assert ei.value.code == 903
    assert_invalidated_then_ended(s, s2)


# -- 904 unjoined -----------------------------------------------------------------------------------
def test_graph_capture_unjoined_fork(s, s2):
    s.begin_capture()
    s2.wait(s.record())
    s2.launch_host_func(noop)
    s.launch_host_func(noop)
    with pytest.raises(srt.CaptureUnjoinedError) as ei:
        s.end_capture()
    assert ei.value.code == 904
    assert_left_capture(s, s2)


def test_graph_capture_join_recorded_before_the_branch_work_is_unjoined(s, s2):
    s.begin_capture()
    s2.wait(s.record())
    early = s2.record()
    s2.launch_host_func(noop)  # after the joined record
    s.wait(early)
    with pytest.raises(srt.CaptureUnjoinedError):
        s.end_capture()
    assert_left_capture(s, s2)


def test_graph_capture_empty_fork_needs_no_join(s, s2):
    s.begin_capture()
    s.launch_host_func(noop)
    s2.wait(s.record())  # joined, but adds no node
    g = s.end_capture()
    assert len(g.nodes()) == 1
    assert_left_capture(s, s2)


# -- 905 isolation --------------------------------------------------------------------------------
def test_graph_capture_wait_on_uncaptured_work_isolation(s, s2, gate):
    gate(s2)
    outside = s2.record()  # real work, outside the capture
    s.begin_capture()
    with pytest.raises(srt.CaptureIsolationError) as ei:
        s.wait(outside)
    assert ei.value.code == 905
    assert_invalidated_then_ended(s)


def test_graph_capture_wait_on_unrecorded_event_is_noop(s, dev):
    s.begin_capture()
    s.wait(srt.Event(dev))
    s.launch_host_func(noop)
    assert len(s.end_capture().nodes()) == 1


@pytest.mark.parametrize("which", ["origin", "joined"])
def test_graph_capture_destroy_of_a_capturing_stream_is_refused(s, s2, which):
    # destroying a stream of the capture left the capture active for good: every later unsafe
    # call (GLOBAL) and device synchronize was refused, with no stream left to end it on
    s.begin_capture()
    s.launch_host_func(noop)
    s2.wait(s.record())
    with pytest.raises(srt.CaptureUnsupportedError) as ei:
        (s if which == "origin" else s2).destroy()
    assert ei.value.code == 900
    assert_invalidated_then_ended(s, s2)
    s2.destroy()  # after the end: allowed
    p = srt.malloc(16)
    srt.free(p)
    s.device.synchronize()


# -- 906 implicit ---------------------------------------------------------------------------------
def test_graph_capture_legacy_stream_refused(dev):
    with pytest.raises(srt.CaptureError):
        dev.default_stream.begin_capture()
    assert not dev.default_stream.is_capturing()


@pytest.mark.parametrize("use", ["launch", "memset", "srt.memset_relaxed"])
def test_graph_capture_legacy_use_while_blocking_stream_captures_implicit(dev, buf, use):
    b = srt.Stream(dev)  # blocking: implicitly synchronizes with the legacy stream
    mode = M.RELAXED if use.endswith("relaxed") else M.GLOBAL
    b.begin_capture(mode)
    b.launch_host_func(noop)
    legacy = dev.default_stream
    with pytest.raises(srt.CaptureImplicitError) as ei:
        if use == "launch":
            legacy.launch(add_one_kernel, buf, N)
        elif use == "memset":
            legacy.memset(buf, 0, 4)
        else:
            srt.memset(buf, 0, 4)  # mode-gating allows it; the legacy stream still refuses
    assert ei.value.code == 906
    assert_invalidated_then_ended(b)


@pytest.mark.parametrize("use", ["synchronize", "query", "wait"])
def test_graph_capture_legacy_sync_query_or_wait_while_blocking_stream_captures_implicit(
        s, dev, use):
    # regression: these enqueue nothing, yet CUDA leaves the legacy stream unusable until a
    # blocking stream's capture ends (they used to succeed silently)
    done = s.record()  # uncaptured work to wait on
    b = srt.Stream(dev)
    b.begin_capture()
    b.launch_host_func(noop)
    legacy = dev.default_stream
    with pytest.raises(srt.CaptureImplicitError):
        if use == "wait":
            legacy.wait(done)
        else:
            getattr(legacy, use)()
    assert_invalidated_then_ended(b)
    legacy.wait(done)  # usable again
    assert legacy.query()
    legacy.synchronize()


@pytest.mark.parametrize("query", ["is_capturing", "capture_info"])
def test_graph_capture_legacy_query_while_blocking_stream_captures_implicit(s, dev, query):
    # cudaStreamIsCapturing / cudaStreamGetCaptureInfo on cudaStreamLegacy while a blocking
    # stream captures: cudaErrorStreamCaptureImplicit, and the capture is not invalidated
    legacy = dev.default_stream
    s.begin_capture()  # a non-blocking stream's capture leaves the legacy stream queryable
    assert getattr(legacy, query)() in (False, srt.CaptureInfo(srt.CaptureStatus.NONE, 0, None, ()))
    s.end_capture()
    b = srt.Stream(dev)
    b.begin_capture()
    b.launch_host_func(noop)
    with pytest.raises(srt.CaptureImplicitError) as ei:
        getattr(legacy, query)()
    assert ei.value.code == 906
    assert b.is_capturing()  # left as it was
    assert len(b.end_capture().nodes()) == 1
    assert getattr(legacy, query)() in (False, srt.CaptureInfo(srt.CaptureStatus.NONE, 0, None, ()))


def test_graph_capture_legacy_use_while_joined_blocking_stream_captures_implicit(s, dev, buf):
    # the capture began on a non-blocking stream, but a blocking stream joined it: that stream
    # is capturing too, and the legacy stream would implicitly synchronize with it
    b = srt.Stream(dev)
    s.begin_capture()
    s.launch_host_func(noop)
    b.wait(s.record())
    with pytest.raises(srt.CaptureImplicitError):
        dev.default_stream.launch(add_one_kernel, buf, N)
    assert_invalidated_then_ended(s, b)


def test_graph_capture_legacy_use_with_non_blocking_capture_allowed(s, dev, buf):
    s.begin_capture()
    s.launch_host_func(noop)
    dev.default_stream.launch(fill_kernel, buf, N, 3.0)
    dev.default_stream.synchronize()
    assert len(s.end_capture().nodes()) == 1
    assert (_read(buf) == 3.0).all()


def test_graph_capture_legacy_stream_cannot_join(s, dev):
    s.begin_capture()
    with pytest.raises(srt.CaptureImplicitError):
        dev.default_stream.wait(s.record())
    assert not dev.default_stream.is_capturing()
    assert_invalidated_then_ended(s)


# -- 907 captured events ---------------------------------------------------------------------------
@pytest.mark.parametrize("what", ["synchronize", "query"])
def test_graph_capture_captured_event_sync_or_query(s, s2, what):
    s.begin_capture()
    s.launch_host_func(noop)
    e = s.record()
    with pytest.raises(srt.CapturedEventError) as ei:
        in_thread(getattr(e, what))  # from any thread
    assert ei.value.code == 907 and isinstance(ei.value, srt.CaptureError)
    assert_invalidated_then_ended(s)
    getattr(e, what)()  # no longer captured


@pytest.mark.parametrize("which", ["start", "end"])
def test_graph_capture_captured_event_elapsed_time(s, which):
    # cudaErrorCapturedEvent covers any use of an event last recorded in a capturing stream:
    # elapsed_time returned the timing of the event's previous, uncaptured record
    t0, t1 = srt.Event(timing=True), srt.Event(timing=True)
    s.record(t0)
    s.record(t1)
    s.synchronize()
    before = t0.elapsed_time(t1)
    s.begin_capture()
    s.record(t0 if which == "start" else t1)
    with pytest.raises(srt.CapturedEventError) as ei:
        t0.elapsed_time(t1)
    assert ei.value.code == 907
    assert_invalidated_then_ended(s)
    assert t0.elapsed_time(t1) == before  # the uncaptured records are what is left


def test_graph_capture_event_rerecorded_in_another_capture_stays_captured(s, s2):
    # an event belongs to the capture that recorded it last: ending the first capture must not
    # release it from the second
    s.begin_capture()
    s2.begin_capture()
    s.launch_host_func(noop)
    e = s.record()
    s2.launch_host_func(noop)
    s2.record(e)
    assert len(s.end_capture().nodes()) == 1
    with pytest.raises(srt.CapturedEventError):
        e.query()
    assert_invalidated_then_ended(s2)
    assert e.query()


# -- 908 wrong thread -----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [M.GLOBAL, M.THREAD_LOCAL])
def test_graph_capture_end_from_other_thread(s, mode):
    s.begin_capture(mode)
    s.launch_host_func(noop)
    with pytest.raises(srt.CaptureWrongThreadError) as ei:
        in_thread(s.end_capture)
    assert ei.value.code == 908
    assert s.is_capturing()  # still this thread's capture
    assert len(s.end_capture().nodes()) == 1


def test_graph_capture_concurrent_thread_local_captures_on_two_threads(dev):
    # each thread captures its own stream and uses unsafe calls only outside its capture window
    ptrs = [srt.malloc(N * 4, dev) for _ in range(2)]
    graphs: list = [None, None]
    both_capturing = threading.Barrier(2, timeout=30)

    def worker(i):
        st = srt.Stream(dev, non_blocking=True)
        st.begin_capture(M.THREAD_LOCAL)
        st.launch(fill_kernel, ptrs[i], N, float(i + 1))
        both_capturing.wait()  # both captures are active now
        st.launch(add_one_kernel, ptrs[i], N)
        graphs[i] = st.end_capture()
        graphs[i].instantiate().launch(st)
        st.synchronize()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert all(len(g.nodes()) == 2 for g in graphs)
    assert (_read(ptrs[0]) == 2.0).all() and (_read(ptrs[1]) == 3.0).all()
    for p in ptrs:
        srt.free(p)


def test_graph_capture_relaxed_may_end_on_other_thread(s):
    s.begin_capture(M.RELAXED)
    s.launch_host_func(noop)
    g = in_thread(s.end_capture)
    assert len(g.nodes()) == 1 and not s.is_capturing()


def test_graph_capture_work_from_other_thread_is_captured(s):
    # capture is per stream: another thread enqueueing on a capturing stream adds nodes
    s.begin_capture(M.THREAD_LOCAL)
    in_thread(lambda: s.launch_host_func(noop))
    assert len(s.end_capture().nodes()) == 1
