"""The built-in operators' kernels have binders (ops/common.two_step): a captured operator
replays with its views made once, and gives what the same operator gives eagerly, for every
implementation its phase 1 can choose (casts, scaling, broadcasting, strides, float16 buffers,
multi-level reductions, multi-block scans, split-K)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import streamrt as srt
from streamrt import ops
from streamrt.kernel import Kernel
from tests.conftest import PY_KERNELS, cpu_only

rng = np.random.default_rng(7)


def _arr(shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# (op, inputs (arrays or None), output shape, output dtype, attrs)
CASES = [
    (ops.add, [_arr((4, 5)), _arr((4, 5))], (4, 5), np.float32, {}),
    (ops.add, [_arr((4, 5)), _arr((4, 5), np.float16)], (4, 5), np.float32, {"alpha": 2.0}),
    (ops.mul, [_arr((4, 1)), _arr((1, 5))], (4, 5), np.float32, {}),
    (ops.softmax, [_arr((6, 7))], (6, 7), np.float32, {}),
    (ops.softmax, [_arr((6, 7), np.float16)], (6, 7), np.float16, {"axis": 0}),
    (ops.layer_norm, [_arr((5, 8)), _arr((8,)), _arr((8,))], (5, 8), np.float32, {}),
    (ops.layer_norm, [_arr((5, 8), np.float16), None, None], (5, 8), np.float16, {}),
    (ops.reduce_sum, [_arr((3, 700))], (), np.float32, {}),
    (ops.reduce_sum, [_arr((3, 700))], (3, 1), np.float32, {"axis": 1, "keepdims": True}),
    (ops.reduce_sum, [_arr((0, 4))], (4,), np.float32, {"axis": 0}),
    (ops.cumsum, [_arr((5000,))], (5000,), np.float32, {}),
    (ops.cumsum, [_arr((3, 40))], (3, 40), np.float32, {"axis": 0}),
    (ops.cumsum, [_arr((3, 40), np.float16)], (120,), np.float16, {}),
    (ops.matmul, [_arr((4, 6)), _arr((6, 3))], (4, 3), np.float32, {}),
    (ops.matmul, [_arr((8, 4096)), _arr((4096, 8))], (8, 8), np.float32, {}),
    (ops.matmul, [_arr((2, 4, 6), np.float16), _arr((6, 3), np.float16)], (2, 4, 3),
     np.float16, {}),
]


def _kernels():
    mods = [importlib.import_module(f"streamrt.ops.{m}")  # (ops.matmul is the operator)
            for m in ("elementwise", "norm", "reduce", "scan", "matmul")]
    return [k for mod in mods for k in vars(mod).values() if isinstance(k, Kernel)]


def test_graph_ops_every_builtin_kernel_has_a_binder():
    ks = _kernels()
    assert len(ks) >= 16 and all(k.bind is not None for k in ks)


def _run(s, op, ins, shape, dtype, attrs, graph):
    ts = [None if a is None else srt.Tensor.from_numpy(a, stream=s) for a in ins]
    out = srt.Tensor.empty(shape, dtype, stream=s)
    s.synchronize()
    if not graph:
        ops.run(op, *ts, out, stream=s, **attrs)
        got = [out.numpy(s)]
    else:
        with srt.graph_capture(s, mode=srt.CaptureMode.THREAD_LOCAL) as cap:
            ops.run(op, *ts, out, stream=s, **attrs)
        ge = cap.graph.instantiate()
        got = []
        for _ in range(3):  # the first launch builds the plan (binders), the others replay it
            s.memset(out.ptr, 0, out.nbytes)
            ge.launch(s)
            got.append(out.numpy(s))
        ge.destroy()
    for t in (*ts, out):
        if t is not None:
            t.free(s)
    s.synchronize()
    return got


@pytest.mark.parametrize("case", range(len(CASES)))
def test_graph_ops_replay_matches_eager(s, dev, case):
    cpu_only(dev, PY_KERNELS)
    op, ins, shape, dtype, attrs = CASES[case]
    (want,) = _run(s, op, ins, shape, dtype, attrs, graph=False)
    for got in _run(s, op, ins, shape, dtype, attrs, graph=True):
        np.testing.assert_array_equal(got, want)


def test_graph_ops_replay_of_a_strided_input_matches_eager(s, dev):
    cpu_only(dev, PY_KERNELS)
    base = _arr((6, 8))
    results = []
    for graph in (False, True):
        x = srt.Tensor.from_numpy(base, stream=s)
        xt = x.as_strided((8, 6), (1, 8))  # the transpose, in place (strides in elements)
        out = srt.Tensor.empty((8, 6), np.float32, stream=s)
        s.synchronize()
        if graph:
            with srt.graph_capture(s, mode=srt.CaptureMode.THREAD_LOCAL) as cap:
                ops.run(ops.softmax, xt, out, stream=s)
            ge = cap.graph.instantiate()
            ge.launch(s)
            ge.launch(s)
        else:
            ops.run(ops.softmax, xt, out, stream=s)
        results.append(out.numpy(s))
        x.free(s)
        out.free(s)
        s.synchronize()
    np.testing.assert_array_equal(results[0], results[1])
    e = np.exp(base.T - base.T.max(1, keepdims=True))
    np.testing.assert_allclose(results[0], e / e.sum(1, keepdims=True), rtol=1e-5)
