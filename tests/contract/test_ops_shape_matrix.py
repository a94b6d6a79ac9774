"""The seed's shape matrix for every operator vs numpy: tiny, long, broadcast, strided, many dims.

Each case runs the explicit two-phase template with a workspace of exactly ``workspace_size``
bytes placed flush against the end of its allocation, so a kernel that used more than phase 1
declared fails (out of bounds) instead of passing by luck.
"""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from streamrt import ops
from tests.contract.ops_fixtures import ops_stream  # noqa: F401 (the fixture s)

F16, F32, F64 = np.float16, np.float32, np.float64
TOL = {np.dtype(F16): 2e-2, np.dtype(F32): 2e-4, np.dtype(F64): 1e-9}




def rand(shape, dtype, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(dtype)


def view_of(s, base: np.ndarray, view: np.ndarray) -> srt.Tensor:
    """A device tensor with ``view``'s strides/offset into a device copy of ``base``."""
    bt = srt.Tensor.from_numpy(base, stream=s)
    item = base.itemsize
    off = (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // item
    return bt.as_strided(view.shape, tuple(x // item for x in view.strides), off)


def put(s, a: np.ndarray | None, layout: str = "c") -> srt.Tensor | None:
    """``a`` on the device: contiguous ("c"), stored transposed ("T"), every other element ("s")."""
    if a is None:
        return None
    if layout == "c":
        return srt.Tensor.from_numpy(a, stream=s)
    if layout == "T":
        base = np.ascontiguousarray(a.T)
        return view_of(s, base, base.T)
    base = np.zeros(a.shape[:-1] + (2 * a.shape[-1] + 3,), a.dtype)
    base[..., 3::2] = a
    return view_of(s, base, base[..., 3::2])


def two_phase(s, op, tensors, attrs) -> int:
    size, ex = op.get_workspace_size(*tensors, **attrs)
    ws = base = None
    if size:
        r = (size + 511) // 512 * 512
        base = srt.malloc(r, s.device)
        ws = base + r - size  # exactly ``size`` bytes before the end of the allocation
    op(ws, size, ex, s)
    s.synchronize()
    if base is not None:
        srt.free(base)
    ex.destroy()  # safe after the run; the one-shot executor was already released
    return size


def check(got: np.ndarray, ref: np.ndarray, dtype) -> None:
    assert got.shape == ref.shape
    tol = TOL[np.dtype(dtype)]
    scale = max(float(np.max(np.abs(ref))) if ref.size else 0.0, 1e-6)
    err = float(np.max(np.abs(got.astype(F64) - ref))) if ref.size else 0.0
    assert err <= tol * scale, f"max error {err} > {tol} * {scale}"


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _layer_norm(x, w, b, k, eps):
    axes = tuple(range(x.ndim - k, x.ndim))
    y = (x - x.mean(axis=axes, keepdims=True)) / np.sqrt(x.var(axis=axes, keepdims=True) + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


# op -> case -> (inputs [(shape, layout) or None], out (shape, layout), attrs, reference)
CASES = {
    "add": {
        "tiny": ([((1,), "c"), ((), "c")], ((1,), "c"), {}, lambda x, y: x + y),
        "long": ([((100_003,), "c"), ((100_003,), "c")], ((100_003,), "c"), {"alpha": 2.0},
                 lambda x, y: x + 2 * y),
        "broadcast": ([((4, 1, 6), "c"), ((5, 1), "c")], ((4, 5, 6), "c"), {"alpha": -0.5},
                      lambda x, y: x - 0.5 * y),
        "strided": ([((5, 7), "T"), ((7,), "s")], ((5, 7), "s"), {"alpha": 3},
                    lambda x, y: x + 3 * y),
        "many_dims": ([((2, 1, 3, 1, 2, 3), "c"), ((3, 5, 2, 1), "s")], ((2, 1, 3, 5, 2, 3), "c"),
                      {}, lambda x, y: x + y),
    },
    "mul": {
        "tiny": ([((), "c"), ((), "c")], ((), "c"), {}, lambda x, y: x * y),
        "long": ([((100_003,), "c"), ((100_003,), "c")], ((100_003,), "c"), {}, np.multiply),
        "broadcast": ([((4, 1, 6), "c"), ((5, 1), "c")], ((4, 5, 6), "c"), {}, np.multiply),
        "strided": ([((5, 7), "T"), ((5, 7), "s")], ((5, 7), "T"), {}, np.multiply),
        "many_dims": ([((2, 1, 3, 1, 2, 3), "T"), ((3, 5, 2, 1), "c")], ((2, 1, 3, 5, 2, 3), "s"),
                      {}, np.multiply),
    },
    "reduce_sum": {
        "tiny": ([((), "c")], ((), "c"), {}, lambda x: np.sum(x)),
        "long": ([((300_000,), "c")], ((), "c"), {}, lambda x: np.sum(x)),
        "broadcast": ([((4, 5, 6), "c")], ((1, 5, 1), "c"), {"axis": (0, 2), "keepdims": True},
                      lambda x: x.sum(axis=(0, 2), keepdims=True)),
        "strided": ([((700, 6), "T")], ((6,), "s"), {"axis": 0}, lambda x: x.sum(axis=0)),
        "many_dims": ([((2, 3, 4, 5, 6), "c")], ((2, 4, 6), "c"), {"axis": (1, -2)},
                      lambda x: x.sum(axis=(1, 3))),
        "middle_run": ([((3, 600, 5), "c")], ((3, 5), "T"), {"axis": 1}, lambda x: x.sum(axis=1)),
    },
    "softmax": {
        "tiny": ([((1,), "c")], ((1,), "c"), {}, lambda x: _softmax(x, -1)),
        "long": ([((3, 40_000), "c")], ((3, 40_000), "c"), {}, lambda x: _softmax(x, -1)),
        "broadcast": ([((300, 5), "c")], ((300, 5), "c"), {"axis": 0}, lambda x: _softmax(x, 0)),
        "strided": ([((30, 7), "T")], ((30, 7), "s"), {"axis": 1}, lambda x: _softmax(x, 1)),
        "many_dims": ([((2, 3, 4, 5, 6), "c")], ((2, 3, 4, 5, 6), "c"), {"axis": 2},
                      lambda x: _softmax(x, 2)),
    },
    "layer_norm": {
        "tiny": ([((1, 1), "c"), ((1,), "c"), ((1,), "c")], ((1, 1), "c"), {},
                 lambda x, w, b: _layer_norm(x, w, b, 1, 1e-5)),
        "long": ([((4, 20_000), "c"), ((20_000,), "c"), None], ((4, 20_000), "c"), {},
                 lambda x, w, b: _layer_norm(x, w, b, 1, 1e-5)),
        "broadcast": ([((3, 5, 6), "c"), ((5, 6), "c"), ((5, 6), "c")], ((3, 5, 6), "c"), {},
                      lambda x, w, b: _layer_norm(x, w, b, 2, 1e-5)),
        "strided": ([((40, 7), "T"), ((7,), "s"), ((7,), "c")], ((40, 7), "s"), {"eps": 0.1},
                    lambda x, w, b: _layer_norm(x, w, b, 1, 0.1)),
        "many_dims": ([((2, 2, 3, 4, 5), "c"), None, None], ((2, 2, 3, 4, 5), "c"),
                      {"normalized_ndim": 3, "eps": 1e-3},
                      lambda x, w, b: _layer_norm(x, w, b, 3, 1e-3)),
    },
    "matmul": {
        "tiny": ([((1, 1), "c"), ((1, 1), "c")], ((1, 1), "c"), {}, np.matmul),
        "long": ([((2, 4, 6000), "c"), ((6000, 3), "c")], ((2, 4, 3), "c"), {}, np.matmul),
        "broadcast": ([((3, 1, 4, 5), "c"), ((2, 5, 6), "c")], ((3, 2, 4, 6), "c"), {},
                      np.matmul),
        "strided": ([((8, 9), "T"), ((9, 4), "s")], ((8, 4), "s"), {}, np.matmul),
        "many_dims": ([((2, 1, 2, 3, 4), "c"), ((1, 2, 1, 4, 3), "T")], ((2, 2, 2, 3, 3), "c"), {},
                      np.matmul),
    },
    "cumsum": {
        "tiny": ([((1,), "c")], ((1,), "c"), {"axis": 0}, lambda x: np.cumsum(x, 0)),
        "long": ([((100_000,), "c")], ((100_000,), "c"), {}, np.cumsum),
        "broadcast": ([((3000, 4), "c")], ((3000, 4), "c"), {"axis": 0}, lambda x: np.cumsum(x, 0)),
        "strided": ([((4, 2000), "T")], ((4, 2000), "s"), {"axis": 1}, lambda x: np.cumsum(x, 1)),
        "many_dims": ([((2, 3, 4, 5, 6), "c")], ((2, 3, 4, 5, 6), "c"), {"axis": -2},
                      lambda x: np.cumsum(x, -2)),
        "strided_flat": ([((30, 40), "T")], ((1200,), "c"), {}, np.cumsum),
    },
}
PARAMS = [(op, case) for op, cases in CASES.items() for case in cases]


@pytest.mark.parametrize("dtype", [F32, F64, F16])
@pytest.mark.parametrize("op_name, case", PARAMS)
def test_ops_match_numpy(s, op_name, case, dtype):
    specs, (oshape, olayout), attrs, ref_fn = CASES[op_name][case]
    arrays = [None if sp is None else rand(sp[0], dtype, seed=i) for i, sp in enumerate(specs)]
    tensors = [put(s, a, sp[1]) if sp else None for a, sp in zip(arrays, specs)]
    out = put(s, np.full(oshape, np.nan, dtype), olayout)
    two_phase(s, ops.OPS[op_name], [*tensors, out], attrs)
    ref = ref_fn(*[None if a is None else a.astype(F64) for a in arrays])
    check(out.numpy(s), np.asarray(ref), dtype)


@pytest.mark.parametrize("xshape", [(3, 4), ()])  # a 0-d operand's cast still takes a region
@pytest.mark.parametrize("xt, yt, ot", [(F16, F32, F32), (F32, F64, F64), (F64, F16, F32)])
def test_ops_elementwise_mixed_dtypes_cast_in_the_workspace(s, xt, yt, ot, xshape):
    x, y = rand(xshape, xt, 1), rand((4,), yt, 2)
    if not xshape:  # rand of () is a numpy scalar; from_numpy wants an array
        x = np.asarray(x)
    out = srt.Tensor.empty(np.broadcast_shapes(xshape, (4,)), ot, stream=s)
    size = two_phase(s, ops.add, [put(s, x), put(s, y), out], {"alpha": 0.5})
    assert size > 0  # the narrower operand was cast into the workspace
    check(out.numpy(s), x.astype(F64) + 0.5 * y.astype(F64), ot)


def test_ops_empty_tensors(s):
    x = srt.Tensor.empty((0, 3), F32, stream=s)
    for op, outs, attrs in [(ops.add, [x, x, srt.Tensor.empty((0, 3), F32, stream=s)], {}),
                            (ops.softmax, [x, srt.Tensor.empty((0, 3), F32, stream=s)], {}),
                            (ops.cumsum, [x, srt.Tensor.empty((0, 3), F32, stream=s)],
                             {"axis": 0})]:
        assert two_phase(s, op, outs, attrs) == 0
    out = put(s, np.full((3,), np.nan, F32))
    two_phase(s, ops.reduce_sum, [x, out], {"axis": 0})  # a sum over nothing is 0
    np.testing.assert_array_equal(out.numpy(s), np.zeros(3, F32))
    mm = put(s, np.full((2, 2), np.nan, F32))
    two_phase(s, ops.matmul, [srt.Tensor.empty((2, 0), F32, stream=s),
                              srt.Tensor.empty((0, 2), F32, stream=s), mm], {})
    np.testing.assert_array_equal(mm.numpy(s), np.zeros((2, 2), F32))


def test_ops_in_place_add(s):
    x = rand((64,), F32, 3)
    t = put(s, x)
    two_phase(s, ops.add, [t, put(s, np.ones(64, F32)), t], {"alpha": 2.0})  # x += 2
    check(t.numpy(s), x.astype(F64) + 2, F32)
