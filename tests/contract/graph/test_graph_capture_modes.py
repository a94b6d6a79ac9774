"""Capture modes (global, thread local, relaxed): which unsafe calls each refuses, on which thread, with
one capture or several, and ``exchange_capture_mode`` per thread."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

import streamrt as srt
from tests.conftest import in_thread
from tests.contract.graph.capturing import assert_invalidated_then_ended, noop

N = 16


M = srt.CaptureMode


# -- unsafe calls gated by mode ----------------------------------------------------------------------
def _unsafe_calls(buf):
    host = np.zeros(N, np.float32)
    return {
        "srt.malloc": _malloc_and_remember,
        "srt.memcpy": lambda: srt.memcpy(host, buf, N * 4),
        "srt.memset": lambda: srt.memset(buf, 1, 4),
        "srt.malloc_host": _malloc_host_and_remember,
    }


_made: list[tuple[str, int]] = []


def _malloc_and_remember():
    _made.append(("dev", srt.malloc(64)))


def _malloc_host_and_remember():
    _made.append(("host", srt.malloc_host(64)))


def _cleanup_made():
    while _made:
        kind, p = _made.pop()
        (srt.free if kind == "dev" else srt.free_host)(p)


def _refused(capture_mode, same_thread, caller_mode):
    """DESIGN.md §5: GLOBAL refuses on an own non-relaxed capture or any GLOBAL capture;
    THREAD_LOCAL only on an own non-relaxed capture; RELAXED never."""
    if caller_mode is M.RELAXED:
        return False
    own = same_thread and capture_mode is not M.RELAXED
    if caller_mode is M.THREAD_LOCAL:
        return own
    return own or capture_mode is M.GLOBAL


@pytest.mark.parametrize("caller_mode", [M.GLOBAL, M.THREAD_LOCAL, M.RELAXED])
@pytest.mark.parametrize("same_thread", [True, False], ids=["same", "other"])
@pytest.mark.parametrize("capture_mode", [M.GLOBAL, M.THREAD_LOCAL, M.RELAXED])
def test_graph_capture_mode_gates_unsafe_calls(s, buf, capture_mode, same_thread, caller_mode):
    expect = _refused(capture_mode, same_thread, caller_mode)
    try:
        for name, call in _unsafe_calls(buf).items():
            s.begin_capture(capture_mode)
            s.launch_host_func(noop)

            def attempt(call=call):
                prev = srt.exchange_capture_mode(caller_mode)
                try:
                    call()
                finally:
                    assert srt.exchange_capture_mode(prev) is caller_mode

            if expect:
                with pytest.raises(srt.CaptureUnsupportedError):
                    attempt() if same_thread else in_thread(attempt)
                assert_invalidated_then_ended(s)
            else:
                attempt() if same_thread else in_thread(attempt)
                assert s.is_capturing(), name
                assert len(s.end_capture().nodes()) == 1, name
    finally:
        _cleanup_made()


def test_graph_capture_unsafe_call_without_capture_allowed(buf):
    srt.memset(buf, 0, 4)  # no capture anywhere: nothing to gate
    p = srt.malloc(64)
    srt.free(p)


@pytest.mark.parametrize(
    "capture_mode,same_thread,caller_mode",
    [
        pytest.param(M.GLOBAL, True, M.GLOBAL, id="refused-own-global"),
        pytest.param(M.THREAD_LOCAL, True, M.THREAD_LOCAL, id="refused-own-thread-local"),
        pytest.param(M.GLOBAL, False, M.GLOBAL, id="refused-other-global"),
        pytest.param(
            M.RELAXED, True, M.GLOBAL, id="allowed-relaxed-capture"),
        pytest.param(
            M.THREAD_LOCAL, False, M.GLOBAL, id="allowed-other-thread"),
    ],
)
def test_graph_capture_mode_gates_srt_free(s, capture_mode, same_thread, caller_mode):
    p = srt.malloc(64)
    s.begin_capture(capture_mode)
    s.launch_host_func(noop)

    def attempt():
        prev = srt.exchange_capture_mode(caller_mode)
        try:
            srt.free(p)
        finally:
            srt.exchange_capture_mode(prev)

    if _refused(capture_mode, same_thread, caller_mode):
        with pytest.raises(srt.CaptureUnsupportedError):
            attempt() if same_thread else in_thread(attempt)
        assert_invalidated_then_ended(s)
        srt.free(p)  # fine once the capture is over
        return
    graph = None
    try:
        attempt() if same_thread else in_thread(attempt)
        assert s.is_capturing()
    finally:
        try:
            graph = s.end_capture()
        except srt.CaptureError:
            pass
    assert graph is not None and len(graph.nodes()) == 1
    with pytest.raises(srt.InvalidAddressError):
        srt.free(p)  # it was really freed


def test_graph_capture_srt_free_of_pool_memory_in_relaxed_capture(s):
    # srt.free of pool memory synchronizes the device first: the capturing stream, which has no
    # work to wait for, is skipped rather than refused
    p = s.malloc(64)
    s.synchronize()
    s.begin_capture(M.RELAXED)
    s.launch_host_func(noop)
    srt.free(p)
    assert s.is_capturing()
    assert len(s.end_capture().nodes()) == 1


def test_graph_capture_exchange_capture_mode_is_per_thread():
    assert srt.exchange_capture_mode(M.RELAXED) is M.GLOBAL  # the default
    try:
        assert in_thread(lambda: srt.exchange_capture_mode(M.GLOBAL)) is M.GLOBAL  # own default
        assert srt.exchange_capture_mode(M.THREAD_LOCAL) is M.RELAXED
    finally:
        srt.exchange_capture_mode(M.GLOBAL)
    with pytest.raises(srt.InvalidTypeError):
        srt.exchange_capture_mode(1)


def test_graph_capture_relaxed_thread_mode_allows_unsafe_calls_in_global_capture(s, buf):
    s.begin_capture(M.GLOBAL)
    prev = srt.exchange_capture_mode(M.RELAXED)
    try:
        p = srt.malloc(64)
        srt.memcpy(p, np.ones(4, np.float32), 16)
    finally:
        srt.exchange_capture_mode(prev)
    assert len(s.end_capture().nodes()) == 0
    assert (srt.read(p, (4,), np.float32) == 1).all()
    srt.free(p)


@settings(max_examples=150, deadline=None)
@given(captures=hst.lists(hst.tuples(hst.sampled_from(list(M)), hst.booleans()), max_size=3),
       caller_mode=hst.sampled_from(list(M)), caller_on_worker=hst.booleans())
def test_graph_capture_mode_gating_with_several_captures_property(
        captures, caller_mode, caller_on_worker):
    """Several captures at once, begun on this thread or a worker: an unsafe call is refused iff
    some capture forbids it (DESIGN.md §5), and exactly those captures are invalidated."""
    dev = srt.Device("cpu:0")  # capture is frontend code: one backend is enough
    p = srt.malloc(64, dev)
    streams = [srt.Stream(dev, non_blocking=True) for _ in captures]
    outcomes = []
    # one long-lived worker: its captures keep its thread id until they end (a fresh thread per
    # call could reuse the id of a finished one)
    with ThreadPoolExecutor(1) as worker:

        def on(on_worker, fn):
            return worker.submit(fn).result() if on_worker else fn()

        here, there = threading.get_ident(), worker.submit(threading.get_ident).result()
        caller = there if caller_on_worker else here
        # the model: which captures forbid this caller's unsafe calls
        culprits = {
            i for i, (mode, on_worker) in enumerate(captures)
            if caller_mode is not M.RELAXED and (
                ((there if on_worker else here) == caller and mode is not M.RELAXED)
                or (caller_mode is M.GLOBAL and mode is M.GLOBAL))
        }

        def attempt():
            prev = srt.exchange_capture_mode(caller_mode)
            try:
                srt.memset(p, 1, 4)
            finally:
                srt.exchange_capture_mode(prev)

        try:
            for stream, (mode, on_worker) in zip(streams, captures):
                on(on_worker, lambda stream=stream, mode=mode: stream.begin_capture(mode))
                stream.launch_host_func(noop)
            if culprits:
                with pytest.raises(srt.CaptureUnsupportedError):
                    on(caller_on_worker, attempt)
            else:
                on(caller_on_worker, attempt)
            statuses = [stream.capture_info().status for stream in streams]
        finally:
            for stream, (_, on_worker) in zip(streams, captures):  # never leak a capture
                try:
                    outcomes.append(len(on(on_worker, stream.end_capture).nodes()))
                except srt.CaptureInvalidatedError:
                    outcomes.append("invalidated")
    srt.free(p)
    for stream in streams:
        stream.destroy()
    S = srt.CaptureStatus
    assert statuses == [S.INVALIDATED if i in culprits else S.ACTIVE for i in range(len(captures))]
    assert outcomes == ["invalidated" if i in culprits else 1 for i in range(len(captures))]
