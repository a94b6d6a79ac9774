"""acl.nn: each shipped operator's two-phase call in aclnn's argument order, destroy_executor,
set_executor_repeatable; acl.create_tensor / destroy_tensor."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from streamrt import ops

from .conftest import failed

RNG = np.random.default_rng(7)


@pytest.fixture
def dev_tensor(acl):
    """Device tensors made with acl.create_tensor from host arrays (freed after the test)."""
    made = []

    def make(array=None, shape=None):
        a = np.zeros(shape, np.float32) if array is None else np.ascontiguousarray(array, np.float32)
        ptr, ret = acl.rt.malloc(max(a.nbytes, 4), 0)
        assert ret == 0
        srt.write(ptr, a)
        t, ret = acl.create_tensor(list(a.shape), acl.ACL_FLOAT, None, 0, acl.ACL_FORMAT_ND,
                                   list(a.shape), ptr)
        assert ret == 0
        made.append(ptr)
        return t

    yield make
    srt.Device("cpu:0").synchronize()
    for p in made:
        acl.rt.free(p)


def run_two_phase(acl, name, *args):
    ws_size, ex, ret = getattr(acl.nn, f"{name}_get_workspace_size")(*args)
    assert ret == 0, acl.get_recent_err_msg()
    s, _ = acl.rt.create_stream()
    ws = 0
    if ws_size:
        ws, _ = acl.rt.malloc(ws_size, 0)
    assert getattr(acl.nn, name)(ws, ws_size, ex, s) == 0
    assert acl.rt.synchronize_stream(s) == 0
    if ws:
        acl.rt.free(ws)
    acl.rt.destroy_stream(s)


def test_every_shipped_operator_has_its_two_calls(acl):
    for name in ops.OPS:
        assert callable(getattr(acl.nn, f"{name}_get_workspace_size"))
        assert callable(getattr(acl.nn, name))


x34 = RNG.standard_normal((3, 4)).astype(np.float32)
y34 = RNG.standard_normal((3, 4)).astype(np.float32)
b45 = RNG.standard_normal((4, 5)).astype(np.float32)
w4 = RNG.standard_normal(4).astype(np.float32)


def _ln(x, w, b, eps):
    m = x.mean(-1, keepdims=True)
    v = x.var(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


CASES = {  # op -> (aclnn-order args built from tensors "t:NAME", out shape, expected)
    "add": (["t:x", "t:y", 2.0, "out"], (3, 4), x34 + 2.0 * y34),
    "mul": (["t:x", "t:y", "out"], (3, 4), x34 * y34),
    "matmul": (["t:x", "t:b", "out", 0], (3, 5), x34 @ b45),
    "softmax": (["t:x", 1, "out"], (3, 4), np.exp(x34) / np.exp(x34).sum(1, keepdims=True)),
    "cumsum": (["t:x", 0, 0, "out"], (3, 4), np.cumsum(x34, 0)),
    "reduce_sum": (["t:x", [1], True, 0, "out"], (3, 1), x34.sum(1, keepdims=True)),
    "layer_norm": (["t:x", [4], "t:w", "t:w", 1e-5, "out", None, None], (3, 4),
                   _ln(x34, w4, w4, 1e-5)),
}
ARRAYS = {"x": x34, "y": y34, "b": b45, "w": w4}


@pytest.mark.parametrize("name", sorted(CASES))
def test_operator_in_aclnn_argument_order(acl, dev_tensor, name):
    spec, out_shape, expect = CASES[name]
    out = dev_tensor(shape=out_shape)
    args = [dev_tensor(ARRAYS[a[2:]]) if isinstance(a, str) and a.startswith("t:")
            else out if a == "out" else a for a in spec]
    run_two_phase(acl, name, *args)
    np.testing.assert_allclose(srt.read(out.ptr, out_shape, np.float32), expect, rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize(("name", "args"), [
    ("add", lambda x, o: (x, x, o)),  # alpha left out: out is missing
    ("mul", lambda x, o: (x, "y", o)),  # not a tensor
    ("matmul", lambda x, o: (x, x, o)),  # (3, 4) @ (3, 4)
    ("softmax", lambda x, o: (x, 5, o)),  # no axis 5
    ("cumsum", lambda x, o: (x, 0, 9, o)),  # dtype not out's
    ("reduce_sum", lambda x, o: (x, [7], False, 0, o)),
    ("layer_norm", lambda x, o: (x, [4], None, None, 1e-5, o, o, None)),  # meanOut
])
def test_operator_refusal_is_an_aclnn_param_error(acl, dev_tensor, name, args):
    x, out = dev_tensor(x34), dev_tensor(shape=(3, 4))
    ws, ex, ret = getattr(acl.nn, f"{name}_get_workspace_size")(*args(x, out))
    assert (ws, ex) == (None, None)
    failed(acl, ret, acl.ACLNN_ERR_PARAM_INVALID)


def test_phase_two_of_a_spent_executor_fails_and_a_repeatable_one_reruns(acl, dev_tensor):
    x, out = dev_tensor(x34), dev_tensor(shape=(3, 4))
    ws, ex, _ = acl.nn.mul_get_workspace_size(x, x, out)
    assert acl.nn.mul(0, ws, ex, None) == 0
    failed(acl, acl.nn.mul(0, ws, ex, None), acl.ACLNN_ERR_PARAM_INVALID, "already ran")
    ws, ex, _ = acl.nn.mul_get_workspace_size(x, x, out)
    assert acl.nn.set_executor_repeatable(ex) == 0
    for _ in range(2):
        assert acl.nn.mul(0, ws, ex, None) == 0
    assert acl.nn.destroy_executor(ex) == 0
    srt.Device("cpu:0").synchronize()
    np.testing.assert_allclose(srt.read(out.ptr, (3, 4), np.float32), x34 * x34)


def test_set_executor_repeatable_and_destroy_executor_of_no_executor_fail(acl):
    failed(acl, acl.nn.set_executor_repeatable("ex"), acl.ACLNN_ERR_PARAM_NULLPTR)
    failed(acl, acl.nn.destroy_executor(None), acl.ACLNN_ERR_PARAM_NULLPTR)


def test_create_tensor_takes_strides_offset_and_storage(acl):
    ptr, _ = acl.rt.malloc(48, 0)
    srt.write(ptr, np.arange(12, dtype=np.float32))
    # the transposed (4, 3) view of a (3, 4) storage, from element 0
    t, ret = acl.create_tensor([4, 3], acl.ACL_FLOAT, [1, 4], 0, acl.ACL_FORMAT_ND, [3, 4], ptr)
    assert ret == 0
    assert (t.shape, t.strides, t.dtype) == ((4, 3), (1, 4), np.float32)
    np.testing.assert_array_equal(t.numpy(), np.arange(12, dtype=np.float32).reshape(3, 4).T)
    assert acl.destroy_tensor(t) == 0
    np.testing.assert_array_equal(srt.read(ptr, (12,), np.float32), np.arange(12))  # kept
    acl.rt.free(ptr)


@pytest.mark.parametrize(("args", "words"), [
    (([4], 99, None, 0, 2, [4]), "aclDataType"),
    (([4], 0, None, 0, 77, [4]), "aclFormat"),
    (([4], 0, None, 1, 2, [4]), "past the storage"),
    (([2, 2], 0, None, 0, 0, [4]), "NCHW"),
])
def test_create_tensor_refusals(acl, args, words):
    ptr, _ = acl.rt.malloc(16, 0)
    t, ret = acl.create_tensor(*args, ptr)
    assert t is None
    failed(acl, ret, acl.ACL_ERROR_INVALID_PARAM, words)
    acl.rt.free(ptr)


def test_destroy_tensor_of_no_tensor_fails(acl):
    failed(acl, acl.destroy_tensor(42), acl.ACL_ERROR_INVALID_PARAM, "not a tensor")


@pytest.mark.parametrize("name", sorted(ops.OPS))
def test_phase_two_with_another_operators_executor_fails(acl, dev_tensor, name):
    # every operator's aclnnXxx refuses an executor aclnnYyyGetWorkspaceSize planned, and the
    # executor stays usable by its own operator
    other = "add" if name == "mul" else "mul"
    x, out = dev_tensor(x34), dev_tensor(shape=(3, 4))
    args = (x, x, 1.0, out) if other == "add" else (x, x, out)
    ws, ex, ret = getattr(acl.nn, f"{other}_get_workspace_size")(*args)
    assert ret == 0
    failed(acl, getattr(acl.nn, name)(0, ws, ex, None), acl.ACLNN_ERR_PARAM_INVALID,
           f"planned by ops.{other}")
    assert getattr(acl.nn, other)(0, ws, ex, None) == 0
    assert acl.rt.synchronize_device() == 0
