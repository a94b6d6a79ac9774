"""Devices: registry, specs, current device per thread, memory info, synchronize, reset."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import streamrt as srt


def test_device_same_spec_same_object():
    assert srt.Device("cpu:1") is srt.Device("cpu:1")
    assert srt.Device("cpu:0") is srt.Device(srt.Device("cpu:0"))
    d = srt.Device("cpu:1")
    assert (d.backend, d.index, d.name) == ("cpu", 1, "cpu:1")


def test_device_int_spec_is_index_on_current_backend():
    with srt.Device("cpu:0"):
        assert srt.Device(1) is srt.Device("cpu:1")


def test_device_none_is_current_and_with_restores():
    d0, d1 = srt.Device("cpu:0"), srt.Device("cpu:1")
    d0.set_current()
    assert srt.Device() is d0 and srt.current_device() is d0
    with d1:
        assert srt.current_device() is d1
        with d0:
            assert srt.current_device() is d0
        assert srt.current_device() is d1
    assert srt.current_device() is d0


def test_device_current_is_per_thread():
    srt.Device("cpu:0").set_current()
    seen = []

    def other():
        srt.Device("cpu:1").set_current()
        seen.append(srt.current_device())

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == [srt.Device("cpu:1")]
    assert srt.current_device() is srt.Device("cpu:0")


@pytest.mark.parametrize("spec", ["gpu:0", "cpu:x", "cpu:99", "cpu:-1"])
def test_device_bad_spec(spec):
    with pytest.raises(srt.InvalidDeviceError):
        srt.Device(spec)


def test_device_bad_spec_type():
    with pytest.raises(srt.InvalidTypeError):
        srt.Device(1.5)


def test_device_count():
    assert srt.device_count() == 2
    assert srt.device_count("cpu") == 2
    with pytest.raises(srt.InvalidDeviceError):
        srt.device_count("tpu")


def test_device_cuda_unavailable_is_clear():
    # no GPU here: zero devices and a clear BackendUnavailableError naming what is missing
    try:
        import cuda.bindings  # noqa: F401
    except ImportError:
        assert srt.device_count("cuda") == 0
        with pytest.raises(srt.BackendUnavailableError, match="cuda-bindings"):
            srt.Device("cuda:0")
    else:  # pragma: no cover - only on machines with cuda-bindings
        pytest.skip("cuda-bindings installed: covered by the cuda tests")


def test_device_import_does_not_import_cuda():
    # what ``import streamrt`` adds: cuda-bindings 12's .pth file imports ``cuda`` at startup
    code = ("import sys; before = set(sys.modules); import streamrt; "
            "print(sorted(m for m in set(sys.modules) - before if m.startswith('cuda')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_device_env_switches():
    code = (
        "import streamrt as srt; d = srt.Device('cpu:3'); "
        "print(srt.device_count(), d.memory_info()[1])"
    )
    env = dict(os.environ, STREAMRT_CPU_DEVICES="4", STREAMRT_CPU_MEMORY=str(64 << 20))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True)
    assert out.stdout.split() == ["4", str(64 << 20)]


def test_device_memory_info_tracks_allocations():
    d = srt.Device("cpu:1")
    free0, total = d.memory_info()
    p = srt.malloc(1 << 20, device=d)
    free1, total1 = d.memory_info()
    assert total1 == total and free0 - free1 == 1 << 20
    srt.free(p)
    assert d.memory_info()[0] == free0


def test_device_capacity_enforced():
    code = (
        "import streamrt as srt\n"
        "p = srt.malloc(40 << 20)\n"
        "try:\n    srt.malloc(40 << 20)\nexcept srt.OutOfMemoryError as e:\n    print('oom', e)\n"
        "srt.free(p); q = srt.malloc(40 << 20); print('ok')\n"
    )
    env = dict(os.environ, STREAMRT_CPU_MEMORY=str(64 << 20))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True)
    assert out.stdout.startswith("oom") and out.stdout.strip().endswith("ok")


def test_device_synchronize_waits_for_every_stream(gate):
    d = srt.Device("cpu:0")
    s1, s2 = srt.Stream(d, non_blocking=True), srt.Stream(d, non_blocking=True)
    seen = []
    g = gate(s1)
    s1.launch_host_func(seen.append, 1)
    s2.launch_host_func(seen.append, 2)
    threading.Timer(0.01, g.open).start()  # opened from elsewhere; synchronize must wait for it
    d.synchronize()
    assert sorted(seen) == [1, 2]
    assert s1.query() and s2.query()


def test_device_reset_destroys_everything():
    d = srt.Device("cpu:1")
    s = srt.Stream(d)
    p = srt.malloc(4096, device=d)
    q = s.malloc(4096)
    pool = srt.MemPool(d)
    e = s.record()
    d.reset()
    assert d.memory_info()[0] == d.memory_info()[1]  # every byte back
    with pytest.raises(srt.InvalidHandleError):
        s.launch_host_func(print)
    with pytest.raises(srt.InvalidHandleError):
        pool.trim_to(0)
    with pytest.raises(srt.InvalidAddressError):
        srt.read(p, (1,), np.uint8)
    with pytest.raises(srt.InvalidAddressError):
        srt.free(q)
    with pytest.raises(srt.InvalidHandleError):  # destroyed too (it only lost its record)
        e.query()
    # the device stays usable
    s2 = srt.Stream(d)
    r = s2.malloc(64)
    s2.memset(r, 7, 64)
    s2.synchronize()
    assert srt.read(r, (64,), np.uint8).tolist() == [7] * 64
    s2.free(r)
    d.default_stream.synchronize()


def test_device_reset_ends_captures_of_its_streams():
    # a reset destroyed a capturing stream and left its capture active: srt.malloc (GLOBAL mode)
    # and device synchronizes were refused for good
    d, other = srt.Device("cpu:1"), srt.Device("cpu:0")
    s = srt.Stream(d, non_blocking=True)
    s.begin_capture()
    s.launch_host_func(print)
    o = srt.Stream(other, non_blocking=True)
    o.begin_capture(srt.CaptureMode.RELAXED)  # another device's capture is left alone
    d.reset()
    assert not s.is_capturing() and o.is_capturing()
    with pytest.raises(srt.InvalidHandleError):
        s.launch_host_func(print)
    assert len(o.end_capture().nodes()) == 0
    p = srt.malloc(16, device=d)
    srt.free(p)
    d.synchronize()


def test_device_reset_destroys_graph_execs(any_dev):
    d = any_dev
    with d:
        g = srt.Graph()
        a = g.add_mem_alloc_node(4096)
        g.add_mem_free_node(a.ptr, deps=[a])
        ge = g.instantiate()
        plain = srt.Graph()
        plain.add_empty_node()
        ge2 = plain.instantiate()
        s = srt.Stream(d, non_blocking=True)
        ge.launch(s)
        ge2.launch(s)
        s.synchronize()
    assert d.graph_mem_info()["reserved"] >= 4096
    d.reset()
    assert d.graph_mem_info()["reserved"] == 0
    for e in (ge, ge2):
        with pytest.raises(srt.InvalidHandleError):
            e.launch(srt.Stream(d, non_blocking=True))


def test_device_reset_destroys_execs_made_there_never_launched(any_dev):
    # cudaGraphInstantiate makes the exec in the current context, which cudaDeviceReset destroys
    d = any_dev
    p = srt.malloc(4096, d)
    with d:
        g = srt.Graph()
        g.add_memset_node(p, 1, 4096)  # no node names a device
        ge = g.instantiate()
    d.reset()
    with pytest.raises(srt.InvalidHandleError, match="destroyed"):
        ge.launch(srt.Stream(d, non_blocking=True))


def test_device_backend_without_index_follows_current():
    # "cpu" names the current device when it is a cpu one (as "cuda" does with cudaGetDevice)
    with srt.Device("cpu:1"):
        assert srt.Device("cpu") is srt.Device("cpu:1")
    with srt.Device("cpu:0"):
        assert srt.Device("cpu") is srt.Device("cpu:0")


def test_device_count_is_per_backend():
    from streamrt.backends import device_count as backend_count

    assert srt.device_count("cuda") == backend_count("cuda")  # not the cpu count


def _held_failure(gate):
    """A stream of cpu:1 held by a gate, with a failing kernel and then a host function queued
    behind it; returns (device, stream, gate, what the host function saw)."""
    d = srt.Device("cpu:1")
    s = srt.Stream(d, non_blocking=True)
    seen: list = []
    g = gate(s)
    s.launch(boom_kernel)
    s.launch_host_func(seen.append, 1)
    return d, s, g, seen


def test_device_synchronize_covers_destroyed_streams_and_reports_once(gate):
    d, s, g, seen = _held_failure(gate)
    s.destroy()  # pending work still completes; the device synchronize waits for it
    threading.Timer(0.01, g.open).start()  # opened from elsewhere; synchronize must wait for it
    with pytest.raises(srt.LaunchError, match="boom"):
        d.synchronize()
    assert seen == [1]
    d.synchronize()  # reported once


@srt.kernel
def boom_kernel(ctx):
    raise RuntimeError("boom")


def test_device_reset_waits_then_discards_failures(gate):
    d, _, g, seen = _held_failure(gate)
    raised = []

    def reset():
        try:
            d.reset()
        except BaseException as exc:  # pragma: no cover - the failure this test looks for
            raised.append(exc)

    t = threading.Thread(target=reset)
    t.start()
    t.join(0.2)
    assert t.is_alive(), "reset returned before the device's work completed"
    g.open()
    t.join()
    assert seen == [1] and raised == []  # a reset discards pending failures
    d.synchronize()  # the failure went with the reset


def test_device_reset_destroys_events():
    d = srt.Device("cpu:1")
    s = srt.Stream(d, non_blocking=True)
    a, b = srt.Event(d, timing=True), srt.Event(d, timing=True)
    other = srt.Event("cpu:0")
    s.record(a)
    s.record(b)
    s.synchronize()
    assert a.elapsed_time(b) >= 0
    d.reset()
    for call in (lambda: a.elapsed_time(b), a.query, a.synchronize, a.destroy,
                 lambda: srt.Stream(d).record(a), lambda: srt.Stream(d).wait(b)):
        with pytest.raises(srt.InvalidHandleError, match="destroyed"):
            call()
    assert other.query()  # another device's event is left alone
    srt.Stream(d).record(srt.Event(d))  # new events work


def test_device_reset_restores_the_default_pool():
    d = srt.Device("cpu:1")
    pool = srt.MemPool(d)
    d.set_mem_pool(pool)
    assert d.mem_pool is pool
    d.reset()
    assert d.mem_pool is d.default_mem_pool
    s = srt.Stream(d, non_blocking=True)
    p = s.malloc(64)  # from the (new) default pool, not the destroyed one
    s.free(p)
    s.synchronize()


def test_device_addresses_are_reused_once_its_window_is_used_up(monkeypatch):
    # each pool reserves a whole device of addresses: a long-running process that made and
    # destroyed a few thousand pools ran past cpu:0's 256 TiB window into cpu:1's addresses
    from streamrt.backends import cpu

    start = 1 << 48  # cpu:0's window
    end = start + (1 << 48)  # and where cpu:1's begins
    monkeypatch.setitem(cpu.SPACE._next, 0, end - 4096)  # as if every address had been used
    n = 1 << 20
    ptrs = [srt.malloc(n, "cpu:0") for _ in range(3)]
    try:
        spans = sorted((p, p + n) for p in ptrs)
        assert all(start <= lo and hi <= end for lo, hi in spans)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
        for i, p in enumerate(ptrs):  # each is usable, and none overlaps another allocation
            srt.memset(p, i + 1, n)
        assert [int(srt.read(p, (n,), np.uint8).min()) for p in ptrs] == [1, 2, 3]
        assert {srt.pool.device_of(p) for p in ptrs} == {srt.Device("cpu:0")}
    finally:
        for p in ptrs:
            srt.free(p)


@pytest.mark.parametrize("sanitize", [False, True])
def test_device_synchronize_forgets_streams_gone_for_good_from_clocks(sanitize):
    # the legacy stream's clock named every blocking stream ever made, and every record copied
    # it: a program making streams for days slowed down for good. After a device synchronize a
    # host proof orders later work after theirs, for pools and the sanitizer alike
    dev = srt.Device("cpu:1")
    leg = dev.default_stream
    if sanitize:
        srt.sanitizer.clear()
        srt.sanitizer.enable("collect")
    try:
        p = srt.malloc(64, dev)
        gone = set()
        for i in range(20):
            s = srt.Stream(dev)  # blocking: the legacy stream orders after it
            s.memset(p, i, 64)
            leg.memset(p, 100, 64)
            s.destroy()
            gone.add(s.id)
        assert gone <= set(leg._clock)
        dev.synchronize()
        assert not gone & set(leg._clock)
        out = np.empty(64, np.uint8)
        s = srt.Stream(dev, non_blocking=True)
        s.memcpy(out, p, 64)  # ordered after the gone streams' memsets by the host proof alone
        assert (out == 100).all()
        if sanitize:
            assert srt.sanitizer.report() == []
        srt.free(p)
    finally:
        if sanitize:
            srt.sanitizer.disable()
            srt.sanitizer.clear()
