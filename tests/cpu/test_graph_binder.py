"""Kernel binders: graph replay calls what the binder made at plan time; everything else runs the body."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import streamrt as srt

N = 64
calls = {"body": 0, "bind": 0}


@srt.kernel
def axpy(ctx, x, y, a):
    calls["body"] += 1
    yv = ctx.array(y, (N,), np.float32)
    yv += a * ctx.array(x, (N,), np.float32, readonly=True)


@axpy.binder
def _axpy_bound(ctx, x, y, a):
    calls["bind"] += 1
    xv = ctx.array(x, (N,), np.float32, readonly=True)
    yv = ctx.array(y, (N,), np.float32)
    return functools.partial(_axpy_now, xv, yv, np.float32(a))


def _axpy_now(xv, yv, a):
    yv += a * xv


@pytest.fixture(autouse=True)
def _reset_calls():
    calls.update(body=0, bind=0)


needs_plain_replay = pytest.mark.skipif(
    srt.sanitizer.enabled(),
    reason="with the sanitizer on (STREAMRT_SANITIZE=1), replays run kernel bodies by design")


def _chain(x, y, n, a=1.0):
    g = srt.Graph()
    prev = ()
    for _ in range(n):
        prev = g.add_kernel_node(axpy, x, y, a, deps=prev)
    return g


@needs_plain_replay
def test_graph_binder_replay_uses_bound_callable(s):
    x, y = srt.malloc(4 * N), srt.malloc(4 * N)
    srt.write(x, np.ones(N, np.float32))
    srt.write(y, np.zeros(N, np.float32))
    ge = _chain(x, y, 10).instantiate()
    for _ in range(3):
        ge.launch(s)
    s.synchronize()
    assert np.array_equal(srt.read(y, (N,), np.float32), np.full(N, 30, np.float32))
    assert calls == {"body": 0, "bind": 10}  # bound once per node, replayed three times
    s.launch(axpy, x, y, 1.0)  # an eager launch runs the body
    s.synchronize()
    assert calls["body"] == 1
    ge.destroy()
    srt.free(x)
    srt.free(y)


@needs_plain_replay
def test_graph_binder_rebinds_after_parameter_update(s):
    x, y, z = (srt.malloc(4 * N) for _ in range(3))
    srt.write(x, np.ones(N, np.float32))
    for p in (y, z):
        srt.write(p, np.zeros(N, np.float32))
    g = srt.Graph()
    node = g.add_kernel_node(axpy, x, y, 2.0)
    ge = g.instantiate()
    ge.launch(s)
    ge.set_kernel_node_params(node, x, z, 3.0)
    ge.launch(s)
    s.synchronize()
    assert np.array_equal(srt.read(y, (N,), np.float32), np.full(N, 2, np.float32))
    assert np.array_equal(srt.read(z, (N,), np.float32), np.full(N, 3, np.float32))
    assert calls["bind"] == 2
    ge.destroy()
    for p in (x, y, z):
        srt.free(p)


@needs_plain_replay
def test_graph_binder_views_of_freed_memory_fail(s):
    x, y = srt.malloc(4 * N), srt.malloc(4 * N)
    ge = _chain(x, y, 1).instantiate()
    ge.launch(s)
    s.synchronize()
    srt.free(y)  # the bound view of y is stale now: the next launch must not write through it
    with pytest.raises(srt.InvalidAddressError):
        ge.launch(s)
    ge.destroy()
    srt.free(x)


def test_graph_binder_unused_under_the_sanitizer(s):
    x, y = srt.malloc(4 * N), srt.malloc(4 * N)
    srt.write(x, np.ones(N, np.float32))
    srt.write(y, np.zeros(N, np.float32))
    ge = _chain(x, y, 3).instantiate()
    srt.sanitizer.enable()
    try:
        ge.launch(s)
        s.synchronize()
    finally:
        srt.sanitizer.disable()
    assert calls == {"body": 3, "bind": 0}  # checked replays see every access
    assert np.array_equal(srt.read(y, (N,), np.float32), np.full(N, 3, np.float32))
    ge.destroy()
    srt.free(x)
    srt.free(y)


def test_graph_binder_must_be_callable():
    with pytest.raises(srt.InvalidTypeError):
        axpy.binder(42)


def test_graph_binder_decorator_returns_the_function():
    def bound(ctx, x, y, a):
        return lambda: None

    k = srt.kernel(axpy.fn)
    assert k.binder(bound) is bound and k.bind is bound


# ctx.array keeps the view last made at each address: a hit must match shape, dtype and access
@srt.kernel
def _views_kernel(ctx, p, n, out):
    r = ctx.array(p, (n,), np.float32, readonly=True)
    out.append(r.flags.writeable)
    w = ctx.array(p, (n,), np.float32)  # same address, shape and dtype, but writable
    w += 1
    i = ctx.array(p, (n,), np.int32)  # same address and shape, another dtype
    out.append(i.dtype)


def test_kernel_context_view_cache_respects_access_and_dtype(s):
    p = srt.malloc(4 * N)
    srt.write(p, np.zeros(N, np.float32))
    out = []
    s.launch(_views_kernel, p, N, out)
    s.synchronize()
    assert out == [False, np.dtype(np.int32)]
    assert np.array_equal(srt.read(p, (N,), np.float32), np.ones(N, np.float32))
    srt.free(p)


@needs_plain_replay
def test_graph_binder_views_made_again_after_memory_moved_even_on_recorded_launches(s):
    # launches after the first take the launch record; memory freed meanwhile (any memory: the
    # generation is global) must still send the next launch to a new plan, whose binder runs
    x, y = srt.malloc(4 * N), srt.malloc(4 * N)
    srt.write(x, np.ones(N, np.float32))
    srt.write(y, np.zeros(N, np.float32))
    ge = _chain(x, y, 2).instantiate()
    for _ in range(3):
        ge.launch(s)
    s.synchronize()
    assert calls["bind"] == 2
    srt.free(srt.malloc(512))
    ge.launch(s)
    s.synchronize()
    assert calls["bind"] == 4 and calls["body"] == 0
    np.testing.assert_array_equal(srt.read(y, (N,), np.float32), np.full(N, 8, np.float32))


@srt.kernel
def add3(ctx, x, y, z):
    np.add(ctx.array(x, (N,), np.float32, readonly=True),
           ctx.array(y, (N,), np.float32, readonly=True), out=ctx.array(z, (N,), np.float32))


@add3.binder
def _add3_bound(ctx, x, y, z):
    calls["bind"] += 1
    return functools.partial(np.add, ctx.array(x, (N,), np.float32, readonly=True),
                             ctx.array(y, (N,), np.float32, readonly=True),
                             out=ctx.array(z, (N,), np.float32))


@needs_plain_replay
def test_graph_binder_partial_with_keywords_replays_the_same_call(s):
    # a binder's partial with keywords is replayed as a closure making the same call
    # (compile.direct): same function, same arguments, same keywords
    x, y, z = (srt.malloc(4 * N) for _ in range(3))
    srt.write(x, np.arange(N, dtype=np.float32))
    srt.write(y, np.full(N, 2, np.float32))
    srt.write(z, np.zeros(N, np.float32))
    g = srt.Graph()
    g.add_kernel_node(add3, x, y, z)
    ge = g.instantiate()
    ge.launch(s)
    ge.launch(s)
    s.synchronize()
    assert calls == {"body": 0, "bind": 1}
    np.testing.assert_array_equal(srt.read(z, (N,), np.float32), np.arange(N) + 2)


def test_graph_binder_direct_call_keeps_arguments_and_leaves_other_callables():
    from streamrt.graph.compile import direct

    seen = []

    def f(*args, **kw):
        seen.append((args, kw))
        return "r"

    call = direct(functools.partial(f, 1, 2, out=3, f=4))
    assert call() == "r" and seen == [((1, 2), {"out": 3, "f": 4})]
    plain = functools.partial(f, 1)
    assert direct(plain) is plain  # no keywords: a partial's own call is as fast
    odd = functools.partial(f, **{"not an identifier": 1})
    assert direct(odd) is odd
    assert direct(len) is len
