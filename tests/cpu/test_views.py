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


# Python code run inside the lookup (a pointer's __hash__/__eq__, a shape's __eq__, a readonly's
# __bool__) may change the context's fields under the C path. Each case runs in a child process
# (a crash must fail the test, not end the run) and prints what both paths gave.
_HOSTILE = r"""
import sys
import numpy as np
import streamrt as srt
from streamrt.views import PyViews

class Py(PyViews):
    __slots__ = ()

s = srt.Stream(non_blocking=True)
p = srt.malloc(64)
srt.write(p, np.arange(16, dtype=np.float32))

def pair():
    ctx = srt.KernelContext(srt.Dim3(1), srt.Dim3(1), s.device, s)
    py = Py()
    py._view, py._last = ctx._view, ctx._last
    ctx.array(p, (16,), np.float32)  # an entry at p
    return ctx, py

def outcome(f):
    try:
        v = f()
    except Exception as e:
        return type(e).__name__
    return ("view", v.shape, v.dtype.str, v.flags.writeable, v.tolist()) if isinstance(
        v, np.ndarray) else repr(v)

CASE
print(repr(results))
"""

_CASES = {
    # a shape's __eq__ drops the miss path's function (then answers False: a miss)
    "del_view_in_shape_eq": """
results = []
for c in pair():
    class Shape(tuple):
        def __eq__(self, other, c=c):
            del c._view
            return False
        __hash__ = tuple.__hash__
    results.append(outcome(lambda: c.array(p, Shape((16,)), np.float32)))
""",
    # readonly's __bool__ drops it (a read-only view not cached yet: a miss)
    "del_view_in_readonly_bool": """
results = []
for c in pair():
    class Ro:
        def __bool__(self, c=c):
            del c._view
            return True
    c._last.clear(); c.array(p, (16,), np.float32)
    results.append(outcome(lambda: c.array(p, (16,), np.float32, readonly=Ro())))
""",
    # a pointer's __eq__ (run by the dict lookup) replaces the dict being searched, whose
    # last reference the context held
    "replace_last_in_key_eq": """
results = []
for c in pair():
    class Ptr(int):
        def __eq__(self, other, c=c):
            c._last = {}
            return int(self) == int(other)
        __hash__ = int.__hash__
    c._last = dict(c._last)  # the context's own copy: its only reference
    results.append(outcome(lambda: c.array(Ptr(p), (16,), np.float32)))
""",
    # a KeyError from a pointer's __hash__ is a miss, as a missing key is
    "key_error_from_hash": """
results = []
for c in pair():
    class Ptr(int):
        def __hash__(self):
            raise KeyError("no hashing")
    results.append(outcome(lambda: c.array(Ptr(p), (16,), np.float32)))
""",
    # a dict subclass's __missing__ and a mapping that is no dict answer as in Python
    "last_not_a_plain_dict": """
results = []
for c in pair():
    e = c._last[p]
    class D(dict):
        def __missing__(self, key, e=e):
            return e
    c._last = D()
    a = outcome(lambda: c.array(p, (16,), np.float32))
    class M:
        def __getitem__(self, key, e=e):
            return e
    c._last = M()
    results.append((a, outcome(lambda: c.array(p, (16,), np.float32))))
""",
    # a cached shape unequal to itself is no hit: Python's == runs, no identity shortcut
    "shape_unequal_to_itself": """
results = []
for c in pair():
    class Never:
        def __eq__(self, other):
            return False
        __hash__ = object.__hash__
    shape, e = Never(), c._last[p]
    c._last = {p: (shape, e[1], "cached", "cached")}
    c._view = lambda *a: "made"
    results.append(outcome(lambda: c.array(p, shape, e[1])))
""",
    # a str subclass spelling the keyword goes where Python sends it
    "keyword_str_subclass": """
results = []
for c in pair():
    class K(str):
        pass
    results.append(outcome(lambda: c.array(p, (16,), np.float32, **{K("readonly"): True})))
""",
}


@needs_c
@pytest.mark.parametrize("case", sorted(_CASES))
def test_python_code_inside_the_lookup_gets_what_the_python_path_gives(case):
    code = _HOSTILE.replace("CASE", _CASES[case])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    c_path, py_path = eval(r.stdout.strip())  # noqa: S307 (our child's repr of two outcomes)
    assert c_path == py_path
