"""Argument types: numpy scalars are accepted where Python ints and bools are; bools and floats are not
ints; pool sizes past uint64 mean no limit."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from streamrt import ops
from streamrt import stream as stream_module


# -- argument types: numpy scalars are ints and bools, bools are not ints ---------------------
@srt.kernel
def _noop_kernel(ctx):
    """Does nothing."""


NUMPY_ARGS = {  # calls that take an int (or a bool), given numpy's
    "Device(np.int64)": lambda: srt.Device(np.int64(1)),
    "Stream(priority=np.int64)": lambda: srt.Stream(priority=np.int64(-1),
                                                    non_blocking=np.bool_(True)),
    "launch(grid=np.int64)": lambda: _launch(grid=np.int64(2), block=(np.int32(3),)),
    "MemPool(max_size=np.int64)": lambda: srt.MemPool(max_size=np.int64(8 << 20),
                                                      release_threshold=np.uint64(5),
                                                      reuse_allow_opportunistic=np.bool_(False)),
    "trim_to(np.int64)": lambda: srt.MemPool().trim_to(np.int64(0)),
    "set_attr(np.int64, np.bool_)": lambda: srt.MemPool().set_attr(np.int64(1), np.bool_(False)),
    "Event(timing=np.bool_)": lambda: srt.Event(timing=np.True_),
    "instantiate(auto_free_on_launch=np.bool_)": lambda: srt.Graph().instantiate(
        auto_free_on_launch=np.False_),
    "set_node_enabled(np.bool_)": lambda: _set_enabled(np.False_),
    "ExecutorCache(np.int64)": lambda: ops.ExecutorCache(max_entries=np.int64(4),
                                                         max_bytes=np.int64(1 << 20)),
}


def _set_enabled(flag):
    g = srt.Graph()
    p = srt.malloc(16)
    n = g.add_memset_node(p, 0, 16)
    ge = g.instantiate()
    ge.set_node_enabled(n, flag)
    assert ge.node_enabled(n) is False
    ge.destroy()
    srt.free(p)


def _launch(**kw):
    s = srt.Stream(non_blocking=True)
    s.launch(_noop_kernel, **kw)
    s.synchronize()


@pytest.mark.parametrize("call", list(NUMPY_ARGS))
def test_errors_numpy_scalars_are_accepted_where_python_ones_are(call):
    # grid=(n + 255) // 256 with a numpy n, a device index from an array: refused before
    NUMPY_ARGS[call]()


BAD_TYPES = {
    "launch(grid=True)": lambda: _launch(grid=True),
    "launch(block=True)": lambda: _launch(block=True),
    "launch(grid=(True, 2))": lambda: _launch(grid=(True, 2)),  # not cached: dim3 refuses it
    "launch(grid=np.True_)": lambda: _launch(grid=np.True_),
    "add_kernel_node(grid=(True,))": lambda: srt.Graph().add_kernel_node(_noop_kernel,
                                                                         grid=(True,)),
    "add_kernel_node(block=np.True_)": lambda: srt.Graph().add_kernel_node(_noop_kernel,
                                                                           block=np.True_),
    "get_attr(True)": lambda: srt.MemPool().get_attr(True),
    "get_attr(4.0)": lambda: srt.MemPool().get_attr(4.0),
    "Device(True)": lambda: srt.Device(True),
    "Stream(priority=True)": lambda: srt.Stream(priority=True),
}


@pytest.mark.parametrize("call", list(BAD_TYPES))
def test_errors_bools_and_floats_are_not_ints(call):
    _launch(grid=1, block=1)  # the default shape is cached: True == 1 must not find it
    _launch(grid=(1,), block=1)
    with pytest.raises(srt.InvalidTypeError):
        BAD_TYPES[call]()


@pytest.mark.parametrize("bad", [2.0, (2.0,), (2, 1.0), (2, True), (np.True_, 1), np.float64(2)])
def test_errors_launch_shapes_equal_to_cached_ints_are_still_refused(bad):
    # 2.0 == 2 and (2, True) == (2, 1) find the int shapes' entries in the launch caches
    s = srt.Stream(non_blocking=True)
    for ok in (2, (2,), (2, 1), (1, 1)):
        s.launch(_noop_kernel, grid=ok)
        s.launch(_noop_kernel, block=ok)
    g = srt.Graph()
    g.add_kernel_node(_noop_kernel, grid=2, block=(2, 1))
    with pytest.raises(srt.InvalidTypeError):
        s.launch(_noop_kernel, grid=bad)
    with pytest.raises(srt.InvalidTypeError):
        s.launch(_noop_kernel, block=bad)
    with pytest.raises(srt.InvalidTypeError):
        g.add_kernel_node(_noop_kernel, grid=bad)
    s.launch(_noop_kernel, grid=np.int64(2), block=(np.int32(2), 1))  # numpy ints are ints
    s.synchronize()


def test_errors_launch_with_numpy_int_shapes_hits_the_launch_cache(monkeypatch):
    # np.int64(4) is 4: refusing 2.0 and True must not make every launch with a numpy shape
    # build its context again (4-5x the host cost of a launch)
    s = srt.Stream(non_blocking=True)
    s.launch(_noop_kernel, grid=np.int64(4), block=(np.int32(8), 2))
    made = []
    real = stream_module.launch_context
    monkeypatch.setattr(stream_module, "launch_context",
                        lambda st, g, b, m=0: made.append(1) or real(st, g, b, m))
    for _ in range(3):
        s.launch(_noop_kernel, grid=np.int64(4), block=(np.int32(8), 2))
        s.launch(_noop_kernel, grid=4, block=(8, 2))  # the same shape
    assert made == []
    with pytest.raises(srt.InvalidTypeError):
        s.launch(_noop_kernel, grid=np.True_, block=(8, 2))
    s.synchronize()


def test_errors_pool_sizes_past_uint64_mean_no_limit():
    # CUDA's attributes are uint64; a Python size past them asks for no limit, as 2**64 - 1 does
    pool = srt.MemPool(max_size=2 ** 70)
    pool.release_threshold = 2 ** 70
    pool.trim_to(2 ** 70)
    s = srt.Stream(non_blocking=True)
    s.free(s.malloc(1 << 20, pool))
    s.synchronize()
    assert pool.reserved_mem_current == 2 << 20  # kept: the threshold is past it
    with pytest.raises(srt.InvalidValueError):
        pool.release_threshold = -1
