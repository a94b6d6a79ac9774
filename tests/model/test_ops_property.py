"""Property tests (hypothesis): random shapes, axes, strides and offsets vs numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import streamrt as srt
from streamrt import ops
from streamrt.errors import ExecutorError

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


def device_view(s, shape, steps, start, perm, seed=None, dtype=np.float32):
    """A strided, offset, transposed device view of ``dtype`` and the numpy array it shows (random
    values in [-1, 1], or zeros without ``seed``)."""
    base_shape = tuple(d * k for d, k in zip(shape, steps))
    size = start + int(np.prod(base_shape))
    flat = (np.zeros(size) if seed is None else np.random.default_rng(seed).uniform(-1, 1, size))
    flat = flat.astype(dtype)
    base = flat[start:].reshape(base_shape)
    view = base[tuple(slice(None, None, k) for k in steps)].transpose(perm)
    t = srt.Tensor.from_numpy(flat, stream=s)
    strides = tuple(x // flat.itemsize for x in view.strides)
    return t.as_strided(view.shape, strides, start), view


# -- dtypes: every operator takes float16, float32 and float64 (ops.common.FLOATS), mixed freely;
# reductions accumulate in float64 when any operand is float64, else in float32 -------------------
F64 = np.dtype(np.float64)
FLOAT = st.sampled_from([np.dtype(np.float16), np.dtype(np.float32), F64])


def acc_of(*dtypes):
    """The accumulation dtype of the reducing ops (float16 widens to float32)."""
    return F64 if F64 in dtypes else np.dtype(np.float32)


def tols(out_dtype, compute_dtype, n=1):
    """``(rtol, atol)`` of a result against its float64 reference.

    rtol: one eps of the narrower of the output and compute dtypes (the result is rounded once
    to each: half an ulp each). atol: n terms of magnitude <= 1 accumulated in the compute dtype,
    4 unit roundoffs each (the float32 rule of this file, ``4 * n * 6e-8``), plus the smallest
    normal of the narrower dtype (a float16 result under 6e-5 is subnormal: its spacing is
    absolute, 2**-24, not relative)."""
    fo, fc = np.finfo(out_dtype), np.finfo(compute_dtype)
    return max(fo.eps, fc.eps), 4 * n * fc.eps / 2 + max(fo.tiny, fc.tiny)


def check_reduce_sum(s, spec, dx, do, data, out_of):
    """reduce_sum of a drawn view over drawn axes, into ``out_of(shape, dtype)``, vs numpy."""
    x, xv = device_view(s, *spec, seed=1, dtype=dx)
    nd = xv.ndim
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, nd - 1), min_size=1))))
    keep = data.draw(st.booleans())
    ref = xv.astype(np.float64).sum(axis=axes, keepdims=keep)
    out = out_of(ref.shape, do)
    ops.run(ops.reduce_sum, x, out, stream=s, axis=axes, keepdims=keep)
    n = int(np.prod([xv.shape[a] for a in axes]))
    rtol, atol = tols(do, acc_of(dx, do), n)
    np.testing.assert_allclose(out.numpy(s), ref, rtol=rtol, atol=atol)


def check_cumsum(s, spec, dx, do, data, out_of):
    """cumsum of a drawn view along a drawn axis (or flattened), into ``out_of(shape, dtype)``, vs
    numpy; returns the view, its numpy array, the axis and the tolerances used."""
    x, xv = device_view(s, *spec, seed=2, dtype=dx)
    axis = data.draw(st.integers(-xv.ndim, xv.ndim - 1) | st.none())
    ref = np.cumsum(xv.astype(np.float64), axis=axis)
    out = out_of(ref.shape, do)
    ops.run(ops.cumsum, x, out, stream=s, axis=axis)
    # accumulation: the error of a sum of n terms in [-1, 1] grows like n * eps
    n = xv.size if axis is None else xv.shape[axis]
    rtol, atol = tols(do, acc_of(dx, do), n)
    np.testing.assert_allclose(out.numpy(s), ref, rtol=rtol, atol=atol)
    return x, xv, axis, rtol, atol


@SETTINGS
@given(spec=strided(), dx=FLOAT, do=FLOAT, data=st.data())
def test_property_reduce_sum(s, spec, dx, do, data):
    check_reduce_sum(s, spec, dx, do, data, lambda shape, dt: srt.Tensor.empty(shape, dt, stream=s))


@SETTINGS
@given(spec=strided(), dx=FLOAT, do=FLOAT, data=st.data())
def test_property_cumsum_and_softmax(s, spec, dx, do, data):
    x, xv, axis, rtol, atol = check_cumsum(
        s, spec, dx, do, data, lambda shape, dt: srt.Tensor.empty(shape, dt, stream=s))
    if axis is not None:
        x64 = xv.astype(np.float64)
        e = np.exp(x64 - x64.max(axis, keepdims=True))
        sm = srt.Tensor.empty(xv.shape, do, stream=s)
        ops.run(ops.softmax, x, sm, stream=s, axis=axis)
        # values <= 1: exp, the row sum (n terms) and the division stay within the n-term atol
        np.testing.assert_allclose(sm.numpy(s), e / e.sum(axis, keepdims=True), rtol=rtol,
                                   atol=atol)


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


def shaped_view(s, shape, data, seed=None, dtype=np.float32):
    """A device view of ``shape`` seen through random steps, an offset and a permutation, and
    the numpy array it shows (as :func:`device_view`)."""
    nd = len(shape)
    steps = tuple(data.draw(st.lists(st.integers(1, 2), min_size=nd, max_size=nd)))
    perm = tuple(data.draw(st.permutations(range(nd))))
    pshape = tuple(shape[i] for i in np.argsort(perm))  # permuted by perm, it gives shape
    t, v = device_view(s, pshape, steps, data.draw(st.integers(0, 3)), perm, seed, dtype)
    assert v.shape == tuple(shape)
    return t, v


def strided_out(s, shape, data, dtype=np.float32):
    """An output tensor of ``shape`` (zeros) seen through random steps, an offset and a
    permutation."""
    return shaped_view(s, shape, data, dtype=dtype)[0]


def broadcast_shape(shape, data):
    """A shape that broadcasts to ``shape``: a suffix of it with random dims collapsed to 1."""
    k = data.draw(st.integers(0, len(shape)))
    return tuple(d if data.draw(st.booleans()) else 1 for d in shape[len(shape) - k:])


def broadcast_operand(s, shape, data, seed, dtype=np.float32):
    """A strided operand that broadcasts to ``shape`` and the numpy array it shows."""
    return shaped_view(s, broadcast_shape(shape, data), data, seed, dtype)


@SETTINGS
@given(spec=LONG, dx=FLOAT, do=FLOAT, data=st.data())
def test_reduce_sum_long_axes_into_strided_out(s, spec, dx, do, data):
    check_reduce_sum(s, spec, dx, do, data, lambda shape, dt: strided_out(s, shape, data, dt))


@SETTINGS
@given(spec=LONG, dx=FLOAT, do=FLOAT, data=st.data())
def test_cumsum_long_axes_into_strided_out(s, spec, dx, do, data):
    check_cumsum(s, spec, dx, do, data, lambda shape, dt: strided_out(s, shape, data, dt))


@SETTINGS
@given(a=strided(3, LONG_SIDE, 40000), data=st.data())
def test_add_broadcasts_a_strided_operand_into_strided_out(s, a, data):
    x, xv = device_view(s, *a, seed=3)
    assume(xv.size <= 5000)
    y, yv = broadcast_operand(s, xv.shape, data, seed=4)
    alpha = data.draw(st.sampled_from([1.0, -2.0, 0.5]))
    out = strided_out(s, xv.shape, data)
    ops.run(ops.add, x, y, out, stream=s, alpha=alpha)
    np.testing.assert_allclose(out.numpy(s), xv + alpha * yv, rtol=1e-6, atol=1e-6)


# -- mul, matmul and layer_norm; mixed dtypes; empty dims; unsupported dtypes -----------------
@SETTINGS
@given(a=strided(max_dims=3), op=st.sampled_from([ops.add, ops.mul]), dx=FLOAT, dy=FLOAT,
       do=FLOAT, data=st.data())
def test_property_binary_mixed_dtypes_broadcast(s, a, op, dx, dy, do, data):
    x, xv = device_view(s, *a, seed=3, dtype=dx)
    y, yv = broadcast_operand(s, xv.shape, data, seed=4, dtype=dy)
    x64, y64 = xv.astype(np.float64), yv.astype(np.float64)
    if op is ops.add:
        alpha = data.draw(st.sampled_from([1.0, -2.0, 0.5]))  # powers of 2: alpha * y is exact
        attrs, ref = {"alpha": alpha}, x64 + alpha * y64
    else:
        attrs, ref = {}, x64 * y64
    out = strided_out(s, xv.shape, data, do)
    ops.run(op, x, y, out, stream=s, **attrs)
    # one rounding in the compute dtype (numpy's promotion of x and y), one into out's dtype
    rtol, atol = tols(do, np.result_type(dx, dy))
    np.testing.assert_allclose(out.numpy(s), ref, rtol=rtol, atol=atol)


# K: short, zero (an empty sum: out is all zeros), or long enough for split-K (matmul.py:
# K >= 2048 makes K // 1024 splits; 2049 and 3001 leave a remainder for the last split)
MM_DIM = st.integers(0, 5)
MM_K = st.integers(0, 6) | st.sampled_from([2049, 3001])


@SETTINGS
@given(m=MM_DIM, k=MM_K, n=MM_DIM, da=FLOAT, db=FLOAT, do=FLOAT, data=st.data())
def test_property_matmul(s, m, k, n, da, db, do, data):
    batch = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2 if k < 7 else 1)))
    # batch dims that broadcast; any layout (the permutation may move M, K or N anywhere in memory)
    a, av = shaped_view(s, broadcast_shape(batch, data) + (m, k), data, seed=5, dtype=da)
    b, bv = shaped_view(s, broadcast_shape(batch, data) + (k, n), data, seed=6, dtype=db)
    ref = np.matmul(av.astype(np.float64), bv.astype(np.float64))
    out, _ = shaped_view(s, ref.shape, data, seed=7, dtype=do)  # random: K = 0 must write zeros
    ops.run(ops.matmul, a, b, out, stream=s)
    # a dot product of K terms in [-1, 1], accumulated in float32 (float64 if an operand is)
    rtol, atol = tols(do, acc_of(da, db), k)
    np.testing.assert_allclose(out.numpy(s), ref, rtol=rtol, atol=atol)


@SETTINGS
@given(spec=strided(), dx=FLOAT, dw=FLOAT, db=FLOAT, do=FLOAT, data=st.data())
def test_property_layer_norm(s, spec, dx, dw, db, do, data):
    x, xv = device_view(s, *spec, seed=8, dtype=dx)
    k = data.draw(st.integers(1, xv.ndim))
    nshape = xv.shape[xv.ndim - k:]
    w, wv = shaped_view(s, nshape, data, 9, dw) if data.draw(st.booleans()) else (None, 1.0)
    b, bv = shaped_view(s, nshape, data, 10, db) if data.draw(st.booleans()) else (None, 0.0)
    # a large eps tells sqrt(var + eps) from sqrt(var) + eps
    eps = data.draw(st.sampled_from([1e-5, 0.1, 0.5]))
    attrs = {"eps": eps}
    if (w is None and b is None) or data.draw(st.booleans()):  # else weight/bias fix it
        attrs["normalized_ndim"] = k
    axes = tuple(range(xv.ndim - k, xv.ndim))
    x64 = xv.astype(np.float64)
    mean = x64.mean(axes, keepdims=True)
    var = np.square(x64 - mean).mean(axes, keepdims=True)  # biased, as torch's layer_norm
    ref = (x64 - mean) / np.sqrt(var + eps) * wv + bv
    out = strided_out(s, xv.shape, data, do)
    ops.run(ops.layer_norm, x, w, b, out, stream=s, **attrs)
    # mean and variance sum n = prod(nshape) terms; the normalised values are O(1) (|w|, |b| <= 1)
    used = [dt for dt, t in ((dx, x), (dw, w), (db, b), (do, out)) if t is not None]
    rtol, atol = tols(do, acc_of(*used), int(np.prod(nshape)))
    # x - mean in the compute dtype is off by up to an ulp of the mean, which the division by
    # the standard deviation scales by |mean| / sqrt(var + eps): large for a row whose spread is
    # small beside its offset (a float16 input with eps=1e-5 drew 7.5 float32 ulps this way)
    cond = float(np.max(np.abs(mean) / np.sqrt(var + eps), initial=0.0))
    atol += 4 * cond * np.finfo(acc_of(*used)).eps * float(np.max(np.abs(wv), initial=1.0))
    np.testing.assert_allclose(out.numpy(s), ref, rtol=rtol, atol=atol)


def raises_param_invalid(call):
    """``call()`` raises the phase-1 ExecutorError PARAM_INVALID (161002) and leaves no executor.

    The device is synchronized first: a one-shot executor of an earlier run is released by its
    own stream operation (``out.numpy(s)`` of an empty tensor returns without waiting for it),
    and that release landing between the two counts made the test fail now and then.
    """
    srt.Device().synchronize()
    live = ops.stats()["live_executors"]
    with pytest.raises(ExecutorError) as info:
        call()
    assert info.value.code == 161002
    assert ops.stats()["live_executors"] == live


@SETTINGS
@given(spec=strided(side=st.integers(0, 3)), dt=FLOAT, data=st.data())
def test_property_empty_dims_every_op(s, spec, dt, data):
    """A zero-length axis: empty outputs, and sums over an empty axis are 0 (reduce_sum, and
    matmul with K = 0), written over an output of random values."""
    assume(0 in spec[0])
    x, xv = device_view(s, *spec, seed=11, dtype=dt)
    nd, x64 = xv.ndim, xv.astype(np.float64)

    def check(op, ref, *ins, **attrs):
        out, _ = shaped_view(s, ref.shape, data, seed=12, dtype=data.draw(FLOAT))
        ops.run(op, *ins, out, stream=s, **attrs)
        np.testing.assert_array_equal(out.numpy(s), ref)  # empty, or sums of nothing: exactly 0

    axes = data.draw(st.sets(st.integers(0, nd - 1), min_size=1))
    if data.draw(st.booleans()):  # reduce an empty axis
        axes.add(xv.shape.index(0))
    keep = data.draw(st.booleans())
    check(ops.reduce_sum, x64.sum(tuple(axes), keepdims=keep), x, axis=tuple(sorted(axes)),
          keepdims=keep)
    axis = data.draw(st.integers(-nd, nd - 1))
    scan_axis = data.draw(st.none() | st.just(axis))
    # x is empty, and so are the outputs of cumsum, softmax, add and mul: their shape is checked
    check(ops.cumsum, np.cumsum(x64, scan_axis), x, axis=scan_axis)
    check(ops.softmax, x64, x, axis=axis)
    for op in (ops.add, ops.mul):
        y, yv = broadcast_operand(s, xv.shape, data, seed=13, dtype=data.draw(FLOAT))
        check(op, x64 * yv, x, y)
    if nd >= 2:  # x as a: (..., M, K) @ (K, N)
        b, bv = shaped_view(s, (xv.shape[-1], data.draw(st.integers(0, 3))), data, seed=14,
                            dtype=data.draw(FLOAT))
        check(ops.matmul, x64 @ bv, x, b)
    k = data.draw(st.integers(1, nd))
    if 0 in xv.shape[nd - k:]:  # normalising over nothing is refused
        out = strided_out(s, xv.shape, data)
        raises_param_invalid(lambda: ops.run(ops.layer_norm, x, None, None, out, stream=s,
                                             normalized_ndim=k))
    else:
        check(ops.layer_norm, x64, x, None, None, normalized_ndim=k)


# one valid float32 call per operator: the shapes of its tensors, and its attributes
VALID_CALLS = {
    "add": ([(2, 3), (3,), (2, 3)], {}), "mul": ([(2, 3), (1, 3), (2, 3)], {}),
    "reduce_sum": ([(2, 3), (3,)], {"axis": 0}), "softmax": ([(2, 3), (2, 3)], {}),
    "layer_norm": ([(2, 3), (3,), (3,), (2, 3)], {}), "matmul": ([(2, 3), (3, 4), (2, 4)], {}),
    "cumsum": ([(2, 3), (6,)], {}),
}


@SETTINGS
@given(name=st.sampled_from(sorted(VALID_CALLS)), bad=st.sampled_from(
    [np.int32, np.int64, np.uint8, np.bool_, np.complex64]), data=st.data())
def test_property_unsupported_dtypes_are_refused(s, name, bad, data):
    """ops take float16/32/64 only (ops.common.FLOATS); any other dtype in any slot is refused in
    phase 1 (ExecutorError 161002): nothing runs, the output keeps its values."""
    assert set(VALID_CALLS) == set(ops.OPS)
    shapes, attrs = VALID_CALLS[name]
    slot = data.draw(st.integers(0, len(shapes) - 1))
    hs = [np.full(sh, 7, bad if i == slot else np.float32) for i, sh in enumerate(shapes)]
    ts = [srt.Tensor.from_numpy(h, stream=s) for h in hs]
    raises_param_invalid(lambda: ops.run(ops.OPS[name], *ts, stream=s, **attrs))
    np.testing.assert_array_equal(ts[-1].numpy(s), hs[-1])
