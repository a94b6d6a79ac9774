"""Sanitizer findings and traces name the public operator (``ops.reduce_sum``), not only the
inner kernel that did the access (``_sum_level``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import streamrt as srt
from streamrt import ops
from tests.contract.sanitizer_helpers import kinds, streams, write_k

F32 = np.float32

# name -> (input shapes, output shape, attrs): a call enqueuing every kind of kernel it has
CASES = {
    "add": ([(4, 8), (8,)], (4, 8), {"alpha": 2.0}),
    "mul": ([(4, 8), (4, 8)], (4, 8), {}),
    "reduce_sum": ([(4, 600)], (4,), {"axis": 1}),  # tree levels, then the final sum
    "softmax": ([(4, 8)], (4, 8), {}),
    "layer_norm": ([(4, 8), None, None], (4, 8), {}),
    "matmul": ([(4, 8), (8, 4)], (4, 4), {}),
    "cumsum": ([(1200,)], (1200,), {}),  # block scan: three kernels
}


def test_every_operator_has_a_case():
    assert set(CASES) == set(ops.OPS)


def _tensors(s, name):
    shapes, out_shape, attrs = CASES[name]
    rng = np.random.default_rng(0)
    ins = [None if sh is None else srt.Tensor.from_numpy(rng.standard_normal(sh).astype(F32),
                                                         stream=s) for sh in shapes]
    out = srt.Tensor.empty(out_shape, F32, stream=s)
    return ins, out, attrs


@pytest.mark.parametrize("name", sorted(CASES))
def test_sanitizer_race_on_an_operators_output_names_the_operator(dev, san, name):
    a, b = streams(dev)
    ins, out, attrs = _tensors(a, name)
    a.synchronize()  # the tensors' allocations and copies are seen complete
    ops.run(ops.OPS[name], *ins, out, stream=a, **attrs)
    b.launch(write_k, out.ptr, 1, 0.0)  # BUG: no wait on a's operator, which writes out
    dev.synchronize()
    rep = san.report()
    assert "race" in kinds(rep)
    msg = next(f for f in rep if f.kind == "race").message
    assert f"kernel 'ops.{name} (_" in msg, msg  # the public operator, then its inner kernel
    for t in [*ins, out]:
        if t is not None:
            t.free(a)
    dev.synchronize()


def test_sanitizer_race_between_two_operators_names_both(dev, san):
    a, b = streams(dev)
    x = srt.Tensor.from_numpy(np.ones((4, 1000), F32), stream=a)
    total = srt.Tensor.empty((4,), F32, stream=a)
    a.synchronize()
    ops.run(ops.reduce_sum, x, total, stream=a, axis=1)
    ops.run(ops.add, total, total, total, stream=b)  # BUG: reads a's sums without a wait
    dev.synchronize()
    f = next(f for f in san.report() if f.kind == "race")
    assert "'ops.reduce_sum (_sum_final)'" in f.message and "'ops.add (_binary_kernel)'" in f.message
    for t in (x, total):
        t.free(a)
    dev.synchronize()


def test_sanitizer_names_the_workspace_by_its_operator(dev, san, gate):
    a, b = streams(dev)
    x = srt.Tensor.from_numpy(np.ones((64, 64), F32), stream=a)
    y = srt.Tensor.empty((64, 64), F32, stream=a)
    size, ex = ops.softmax.get_workspace_size(x, y)
    ws = a.malloc(size)
    g = gate(a)
    ops.softmax(ws, size, ex, a)
    b.free(ws)  # BUG: not ordered after the executor's kernels
    g.open()
    dev.synchronize()
    rep = san.report()
    assert rep and "ops.softmax" in rep[0].message
    x.free(a)
    y.free(a)


def test_trace_slices_name_the_operator(dev, tmp_path):
    s = srt.Stream(dev, non_blocking=True)
    ins, out, attrs = _tensors(s, "layer_norm")
    path = tmp_path / "t.json"
    with srt.trace(path):
        ops.run(ops.layer_norm, *ins, out, stream=s, **attrs)
        s.synchronize()
    names = {e.get("name") for e in json.loads(path.read_text())["traceEvents"]}
    assert {"ops.layer_norm (_ln_stats)", "ops.layer_norm (_ln_apply)"} <= names, names
    s.destroy()
