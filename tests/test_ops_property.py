"""Property tests (hypothesis): random shapes, axes, strides and offsets vs numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import streamrt as srt
from streamrt import ops

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def s():
    st_ = srt.Stream("cpu:0", non_blocking=True)
    yield st_
    st_.synchronize()
    st_.destroy()


SHORT_SIDE = st.integers(1, 7)


@st.composite
def strided(draw, max_dims=4, side=SHORT_SIDE, max_elems=None):
    """(array, device-view recipe): a random shape, seen through random steps and an offset."""
    shape = tuple(draw(st.lists(side, min_size=1, max_size=max_dims)))
    if max_elems is not None:
        assume(int(np.prod(shape)) <= max_elems)
    steps = tuple(draw(st.lists(st.integers(1, 3), min_size=len(shape), max_size=len(shape))))
    start = draw(st.integers(0, 5))
    perm = draw(st.permutations(range(len(shape))))
    return shape, steps, start, tuple(perm)


def device_view(s, shape, steps, start, perm, seed=None):
    """A strided, offset, transposed device view and the numpy array it shows (random values,
    or zeros without ``seed``)."""
    base_shape = tuple(d * k for d, k in zip(shape, steps))
    size = start + int(np.prod(base_shape))
    flat = (np.zeros(size) if seed is None else np.random.default_rng(seed).uniform(-1, 1, size))
    flat = flat.astype(np.float32)
    base = flat[start:].reshape(base_shape)
    view = base[tuple(slice(None, None, k) for k in steps)].transpose(perm)
    t = srt.Tensor.from_numpy(flat, stream=s)
    strides = tuple(x // 4 for x in view.strides)
    return t.as_strided(view.shape, strides, start), view


@SETTINGS
@given(spec=strided(), data=st.data())
def test_property_reduce_sum(s, spec, data):
    x, xv = device_view(s, *spec, seed=1)
    nd = xv.ndim
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, nd - 1), min_size=1))))
    keep = data.draw(st.booleans())
    ref = xv.astype(np.float64).sum(axis=axes, keepdims=keep)
    out = srt.Tensor.empty(ref.shape, np.float32, stream=s)
    ops.run(ops.reduce_sum, x, out, stream=s, axis=axes, keepdims=keep)
    np.testing.assert_allclose(out.numpy(s), ref, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(spec=strided(), data=st.data())
def test_property_cumsum_and_softmax(s, spec, data):
    x, xv = device_view(s, *spec, seed=2)
    axis = data.draw(st.integers(-xv.ndim, xv.ndim - 1) | st.none())
    ref = np.cumsum(xv.astype(np.float64), axis=axis)
    out = srt.Tensor.empty(ref.shape, np.float32, stream=s)
    ops.run(ops.cumsum, x, out, stream=s, axis=axis)
    # float32 accumulation: the error of a sum of n terms in [-1, 1] grows like n * eps
    n = xv.size if axis is None else xv.shape[axis]
    np.testing.assert_allclose(out.numpy(s), ref, rtol=1e-5, atol=max(1e-5, 4 * n * 6e-8))
    if axis is not None:
        e = np.exp(xv - xv.max(axis, keepdims=True))
        sm = srt.Tensor.empty(xv.shape, np.float32, stream=s)
        ops.run(ops.softmax, x, sm, stream=s, axis=axis)
        np.testing.assert_allclose(sm.numpy(s), e / e.sum(axis, keepdims=True), rtol=1e-5)


@SETTINGS
@given(a=strided(max_dims=3), data=st.data())
def test_property_add_broadcast(s, a, data):
    x, xv = device_view(s, *a, seed=3)
    # y: a suffix of x's shape with random dims collapsed to 1 (numpy broadcasting)
    k = data.draw(st.integers(0, xv.ndim))
    yshape = tuple(d if data.draw(st.booleans()) else 1 for d in xv.shape[xv.ndim - k:])
    yh = np.random.default_rng(4).uniform(-1, 1, yshape).astype(np.float32)
    alpha = data.draw(st.sampled_from([1.0, -2.0, 0.5]))
    out = srt.Tensor.empty(xv.shape, np.float32, stream=s)
    ops.run(ops.add, x, srt.Tensor.from_numpy(yh, stream=s), out, stream=s, alpha=alpha)
    np.testing.assert_allclose(out.numpy(s), xv + alpha * yh, rtol=1e-6, atol=1e-6)


# -- strided outputs, strided broadcast operands, and long axes (multi-level reduce, multi-block
# scan) --------------------------------------------------------------------------------------
LONG_SIDE = SHORT_SIDE | st.sampled_from([257, 300, 513, 700])
LONG = strided(side=LONG_SIDE, max_elems=40000)


def strided_out(s, shape, data):
    """An output tensor of ``shape`` seen through random steps, an offset and a permutation."""
    nd = len(shape)
    steps = tuple(data.draw(st.lists(st.integers(1, 2), min_size=nd, max_size=nd)))
    perm = tuple(data.draw(st.permutations(range(nd))))
    pshape = tuple(shape[i] for i in np.argsort(perm))  # permuted by perm, it gives shape
    t, v = device_view(s, pshape, steps, data.draw(st.integers(0, 3)), perm)
    assert v.shape == tuple(shape)
    return t


@SETTINGS
@given(spec=LONG, data=st.data())
def test_reduce_sum_long_axes_into_strided_out(s, spec, data):
    x, xv = device_view(s, *spec, seed=1)
    nd = xv.ndim
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, nd - 1), min_size=1))))
    keep = data.draw(st.booleans())
    ref = xv.astype(np.float64).sum(axis=axes, keepdims=keep)
    out = strided_out(s, ref.shape, data)
    ops.run(ops.reduce_sum, x, out, stream=s, axis=axes, keepdims=keep)
    n = int(np.prod([xv.shape[a] for a in axes]))
    np.testing.assert_allclose(out.numpy(s), ref, rtol=1e-5, atol=max(1e-5, 4 * n * 6e-8))


@SETTINGS
@given(spec=LONG, data=st.data())
def test_cumsum_long_axes_into_strided_out(s, spec, data):
    x, xv = device_view(s, *spec, seed=2)
    axis = data.draw(st.integers(-xv.ndim, xv.ndim - 1) | st.none())
    ref = np.cumsum(xv.astype(np.float64), axis=axis)
    out = strided_out(s, ref.shape, data)
    ops.run(ops.cumsum, x, out, stream=s, axis=axis)
    n = xv.size if axis is None else xv.shape[axis]
    np.testing.assert_allclose(out.numpy(s), ref, rtol=1e-5, atol=max(1e-5, 4 * n * 6e-8))


@SETTINGS
@given(a=strided(3, LONG_SIDE, 40000), data=st.data())
def test_add_broadcasts_a_strided_operand_into_strided_out(s, a, data):
    x, xv = device_view(s, *a, seed=3)
    assume(xv.size <= 5000)
    k = data.draw(st.integers(0, xv.ndim))
    yshape = tuple(d if data.draw(st.booleans()) else 1 for d in xv.shape[xv.ndim - k:])
    ysteps = tuple(data.draw(st.lists(st.integers(1, 3), min_size=k, max_size=k)))
    yperm = tuple(data.draw(st.permutations(range(k))))
    inv = tuple(np.argsort(yperm)) if k else ()
    y, yv = device_view(s, tuple(yshape[i] for i in inv), ysteps, data.draw(st.integers(0, 5)),
                        yperm, seed=4)
    assert yv.shape == yshape
    alpha = data.draw(st.sampled_from([1.0, -2.0, 0.5]))
    out = strided_out(s, xv.shape, data)
    ops.run(ops.add, x, y, out, stream=s, alpha=alpha)
    np.testing.assert_allclose(out.numpy(s), xv + alpha * yv, rtol=1e-6, atol=1e-6)
