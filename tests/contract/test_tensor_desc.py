"""TensorDesc: metadata validation, strides and extents, interned keys."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt


# -- TensorDesc ---------------------------------------------------------------------------------
def test_tensor_desc_defaults_to_c_contiguous():
    d = srt.TensorDesc((2, 3, 4), np.float32)
    assert d.strides == (12, 4, 1)
    assert d.offset == 0 and d.format == "ND" and d.ndim == 3 and d.numel == 24
    assert d.is_contiguous
    assert d.storage_nbytes == 24 * 4
    assert d.dtype is np.dtype(np.float32)


def test_tensor_desc_strided_extent_and_contiguity():
    d = srt.TensorDesc((3, 4), np.float64, strides=(1, 3), offset=5)  # a transposed view
    assert not d.is_contiguous
    assert d.storage_nbytes == (5 + 1 + 2 * 1 + 3 * 3) * 8
    # size-1 dims do not break contiguity, whatever their stride
    assert srt.TensorDesc((1, 4), np.float32, strides=(99, 1)).is_contiguous
    assert srt.TensorDesc((0, 4), np.float32).storage_nbytes == 0


def test_tensor_desc_scalar_and_int_shape():
    assert srt.TensorDesc((), np.float32).numel == 1
    assert srt.TensorDesc(5, np.float32).shape == (5,)
    assert srt.TensorDesc(np.array([2, 3]), np.float16).shape == (2, 3)


def test_tensor_desc_equal_metadata_shares_a_key():
    a = srt.TensorDesc((2, 3), np.float32)
    b = srt.TensorDesc([2, 3], "float32", strides=(3, 1))
    assert a == b and hash(a) == hash(b) and a._kid == b._kid
    others = [
        srt.TensorDesc((3, 2), np.float32),
        srt.TensorDesc((2, 3), np.float64),
        srt.TensorDesc((2, 3), np.float32, strides=(1, 2)),
        srt.TensorDesc((2, 3), np.float32, offset=1),
        srt.TensorDesc((1, 2, 3, 1), np.float32, format="NCHW"),
        srt.TensorDesc((1, 2, 3, 1), np.float32),
    ]
    kids = {d._kid for d in others} | {a._kid}
    assert len(kids) == len(others) + 1


@pytest.mark.parametrize("kwargs, exc", [
    ({"shape": (2, -1)}, srt.InvalidValueError),
    ({"shape": (2.0, 3)}, srt.InvalidTypeError),
    ({"shape": (True, 3)}, srt.InvalidTypeError),
    ({"shape": "abc"}, srt.InvalidTypeError),
    ({"shape": object()}, srt.InvalidTypeError),
    ({"shape": (1,) * 9}, srt.InvalidValueError),
    ({"dtype": object}, srt.InvalidTypeError),
    ({"dtype": "U4"}, srt.InvalidTypeError),
    ({"dtype": "not-a-dtype"}, srt.InvalidTypeError),
    ({"dtype": ">f4"}, srt.InvalidValueError),
    ({"strides": (1,)}, srt.InvalidValueError),
    ({"strides": (-3, 1)}, srt.InvalidValueError),
    ({"strides": (3, -1)}, srt.InvalidValueError),  # the boundary: -1 is negative too
    ({"strides": (3.0, 1)}, srt.InvalidTypeError),
    ({"offset": -1}, srt.InvalidValueError),
    ({"offset": 1.5}, srt.InvalidTypeError),
    ({"offset": True}, srt.InvalidTypeError),  # a bool is not an element count
    ({"format": "XYZ"}, srt.InvalidValueError),
    ({"format": 4}, srt.InvalidTypeError),
    ({"format": "NCHW"}, srt.InvalidValueError),  # NCHW needs 4 dims, shape has 2
    ({"shape": (1, 2, 3, 4, 5), "format": "NCHW"}, srt.InvalidValueError),  # ... not 5 either
])
def test_tensor_desc_rejects_bad_metadata(kwargs, exc):
    args = {"shape": (2, 3), "dtype": np.float32} | kwargs
    with pytest.raises(exc):
        srt.TensorDesc(**args)


def test_tensor_desc_accepts_the_aclnn_limits():
    # the boundaries of the checks above: 8 dims (aclnn's maximum), offset 0, stride 0
    assert srt.TensorDesc((1,) * 8, np.float32).ndim == 8
    d = srt.TensorDesc((2, 3), np.float32, strides=(0, 1), offset=0)
    assert d.strides == (0, 1) and d.storage_nbytes == 3 * 4
    assert srt.TensorDesc((1, 2, 3, 4), np.float32, format="NCHW").format == "NCHW"


def test_tensor_desc_bad_metadata_is_a_value_or_type_error():
    with pytest.raises(ValueError):
        srt.TensorDesc((-1,), np.float32)
    with pytest.raises(TypeError):
        srt.TensorDesc((1,), object)


def test_tensor_desc_detects_self_overlap():
    assert srt.TensorDesc((3, 4), np.float32, strides=(0, 1)).overlaps_itself()
    assert srt.TensorDesc((3, 4), np.float32, strides=(2, 1)).overlaps_itself()
    assert not srt.TensorDesc((3, 4), np.float32, strides=(1, 3)).overlaps_itself()
    assert not srt.TensorDesc((1, 4), np.float32, strides=(0, 1)).overlaps_itself()


def test_tensor_metadata_table_stays_bounded_and_equal_descs_stay_equal(monkeypatch):
    # a service seeing ever new shapes grew the interned-metadata table without end; once it
    # starts over, descs made before still equal (and hash as) new ones of the same metadata,
    # and an in-place op on tensors made on both sides of it is still in place
    from streamrt import ops, tensor

    monkeypatch.setattr(tensor, "_MAX_INTERNED", 8, raising=False)
    s = srt.Stream(non_blocking=True)
    x = srt.Tensor.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3), stream=s)
    old = srt.TensorDesc((2, 3), np.float32)
    for n in range(1, 40):  # new shapes: the table starts over several times
        srt.TensorDesc((n, 7), np.float32)
    assert len(tensor._interned) <= 8
    new = srt.TensorDesc((2, 3), np.float32)
    assert new == old and hash(new) == hash(old) and len({old, new}) == 1
    assert new != srt.TensorDesc((3, 2), np.float32)
    y = srt.Tensor(new, x.ptr)  # the same view as x, described after the table started over
    ops.run("add", x, x, y, stream=s, sync=True)  # in place: not refused as a partial overlap
    assert x.numpy(s).tolist() == [[0, 2, 4], [6, 8, 10]]
    x.free(s)
