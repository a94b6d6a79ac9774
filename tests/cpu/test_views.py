"""``ctx.array``'s two implementations (views.py): the C hit path behaves as the Python one."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import streamrt as srt
from streamrt import views
from streamrt.views import PyViews

needs_c = pytest.mark.skipif(views.compiled is None, reason=(
    "the C view cache (streamrt._viewcache) was not built: no C compiler or Python headers "
    "when streamrt was installed, or STREAMRT_PURE_PYTHON is set"))


class _PyContext(PyViews):
    """A context on the Python path, beside KernelContext (on the C path where it is built)."""

    __slots__ = ()


def _pair(s: srt.Stream) -> tuple[srt.KernelContext, _PyContext]:
    ctx = srt.KernelContext(srt.Dim3(1), srt.Dim3(1), s.device, s)
    py = _PyContext()
    py._view, py._last = ctx._view, ctx._last
    return ctx, py


@pytest.fixture
def mem():
    s = srt.Stream(non_blocking=True)
    p = srt.malloc(64)
    srt.write(p, np.arange(16, dtype=np.float32))
    yield s, p
    srt.free(p)


def _calls(p: int) -> list[tuple[tuple, dict]]:
    """Every way a kernel asks for a view: hits and misses, either kind, odd spellings."""
    return [
        ((p, (16,), np.float32), {"readonly": True}),
        ((p, (16,), np.float32), {"readonly": True}),  # the hit
        ((p, (16,), np.float32), {}),
        ((p, (16,), np.float32), {}),
        ((p, (16,), np.float32), {"readonly": 1}),  # truthy, not a bool
        ((p, (16,), np.float32), {"readonly": np.bool_(False)}),
        ((p, (4, 4), np.float32), {}),  # another shape at the same address: a miss
        ((p, (16,), np.int32), {"readonly": True}),  # another dtype
        ((p, [16], np.float32), {}),  # a list shape: equal to no tuple, so never a hit
        ((p, 16, np.float32), {}),
        ((), {"ptr": p, "shape": (16,), "dtype": np.float32}),  # every argument by keyword
        ((p,), {"shape": (16,), "dtype": np.float32, "readonly": True}),
    ]


def _describe(v: object) -> object:
    if isinstance(v, np.ndarray):
        return ("view", v.shape, v.dtype.str, v.flags.writeable, v.ctypes.data, v.tolist())
    return v


def test_the_c_and_python_paths_return_the_same_views(mem):
    s, p = mem
    ctx, py = _pair(s)
    for args, kw in _calls(p):
        a = ctx.array(*args, **kw)
        b = py.array(*args, **kw)
        assert _describe(a) == _describe(b), (args, kw)
        if type(args[1] if len(args) > 1 else kw["shape"]) is tuple:
            assert a is b  # both read the device's cache: the same object


@pytest.mark.parametrize("args,kw,error", [
    ((1, (16,), np.float32, True), {}, TypeError),  # readonly is keyword-only
    ((1, (16,)), {}, TypeError),  # dtype missing
    ((1, (16,), np.float32), {"writable": True}, TypeError),  # no such keyword
    (([1], (16,), np.float32), {}, srt.StreamRTError),  # an unhashable pointer: refused
    ((1 << 60, (16,), np.float32), {}, srt.StreamRTError),  # no allocation there
])
def test_the_c_and_python_paths_refuse_alike(mem, args, kw, error):
    s, _ = mem
    ctx, py = _pair(s)
    with pytest.raises(error) as a:
        ctx.array(*args, **kw)
    with pytest.raises(error) as b:
        py.array(*args, **kw)
    assert type(a.value) is type(b.value)


def test_a_shape_whose_comparison_raises_raises_from_either_path(mem):
    class Odd(tuple):
        def __eq__(self, other):
            raise ZeroDivisionError("no comparing")

        __hash__ = tuple.__hash__

    s, p = mem
    ctx, py = _pair(s)
    ctx.array(p, (16,), np.float32)  # an entry at p to compare with
    for c in (ctx, py):
        with pytest.raises(ZeroDivisionError):
            c.array(p, Odd((16,)), np.float32)


def test_a_shape_comparison_that_clears_the_cache_is_safe(mem):
    """The C path holds the entry it compares with: the comparison may run Python code that
    drops every cached view (as freeing memory does on another thread)."""
    s, p = mem
    ctx, _ = _pair(s)
    first = ctx.array(p, (16,), np.float32)

    class Clearing(tuple):
        def __eq__(self, other):
            ctx._last.clear()
            return tuple(self) == tuple(other)

        __hash__ = tuple.__hash__

    v = ctx.array(p, Clearing((16,)), np.float32)
    assert v is first  # the entry held through the comparison still answered
    assert v.tolist() == list(range(16))


@needs_c
def test_hits_on_the_c_path_leak_no_reference(mem):
    s, p = mem
    ctx, _ = _pair(s)
    v = ctx.array(p, (16,), np.float32, readonly=True)
    before = sys.getrefcount(v)
    for _ in range(1000):
        ctx.array(p, (16,), np.float32, readonly=True)
    assert sys.getrefcount(v) == before


@needs_c
def test_kernel_contexts_take_the_c_path_where_it_is_built():
    assert srt.KernelContext.__mro__[1] is views.compiled
    assert srt.KernelContext._fast_array is views.compiled.array  # type: ignore[union-attr]


def test_kernels_run_on_either_path_from_several_threads(mem):
    s, p = mem
    outs = [srt.malloc(64) for _ in range(4)]

    @srt.kernel
    def double(ctx, src, dst):
        np.multiply(ctx.array(src, (16,), np.float32, readonly=True), 2,
                    out=ctx.array(dst, (16,), np.float32))

    streams = [srt.Stream(non_blocking=True) for _ in outs]

    def go(st: srt.Stream, dst: int) -> None:
        for _ in range(200):
            st.launch(double, p, dst)

    threads = [threading.Thread(target=go, args=(st, o)) for st, o in zip(streams, outs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for st, o in zip(streams, outs):
        st.synchronize()
        assert srt.read(o, (16,), np.float32).tolist() == [2.0 * i for i in range(16)]
        srt.free(o)


def test_streamrt_pure_python_selects_the_python_path():
    code = ("import streamrt as srt, streamrt.views as v; "
            "assert v.compiled is None and srt.KernelContext.__mro__[1] is v.PyViews; print('ok')")
    env = {**os.environ, "STREAMRT_PURE_PYTHON": "1"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_a_copied_context_gives_the_same_views_on_either_path(mem):
    import copy

    s, p = mem
    ctx = srt.KernelContext(srt.Dim3(2), srt.Dim3(1), s.device, s)
    twin = copy.copy(ctx)
    assert twin is not ctx and twin.grid == ctx.grid and twin.stream is s
    assert twin.array(p, (16,), np.float32) is ctx.array(p, (16,), np.float32)
