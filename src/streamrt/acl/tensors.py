"""``acl.create_tensor`` / ``acl.destroy_tensor``: ``aclCreateTensor``'s arguments (view shape,
data type, strides, offset, format, storage shape, data pointer) as an ``srt.Tensor`` over
``srt.TensorDesc``; the data stays the caller's (destroying the tensor frees nothing)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import InvalidTypeError, InvalidValueError
from ..tensor import Tensor, TensorDesc
from . import constants as C
from .errors import api

__all__ = ["DTYPES", "FORMATS", "create_tensor", "destroy_tensor"]

DTYPES = {C.ACL_FLOAT: np.float32, C.ACL_FLOAT16: np.float16, C.ACL_DOUBLE: np.float64,
          C.ACL_INT8: np.int8, C.ACL_INT16: np.int16, C.ACL_INT32: np.int32,
          C.ACL_INT64: np.int64, C.ACL_UINT8: np.uint8, C.ACL_UINT16: np.uint16,
          C.ACL_UINT32: np.uint32, C.ACL_UINT64: np.uint64, C.ACL_BOOL: np.bool_}
FORMATS = {C.ACL_FORMAT_ND: "ND", C.ACL_FORMAT_NCHW: "NCHW", C.ACL_FORMAT_NHWC: "NHWC",
           C.ACL_FORMAT_NCDHW: "NCDHW", C.ACL_FORMAT_NDHWC: "NDHWC",
           C.ACL_FORMAT_NC1HWC0: "NC1HWC0", C.ACL_FORMAT_FRACTAL_NZ: "FRACTAL_NZ"}


@api(None)
def create_tensor(view_dims: Any, data_type: int, stride: Any, offset: int, format: int,
                  storage_dims: Any, tensor_data: int) -> Tensor:
    """``aclCreateTensor`` -> ``(tensor, ret)``: strides and offset in elements, as aclnn's."""
    if data_type not in DTYPES:
        raise InvalidValueError(f"data_type {data_type!r} is not an aclDataType this runtime has")
    if format not in FORMATS:
        raise InvalidValueError(f"format {format!r} is not an aclFormat this runtime has")
    if not isinstance(storage_dims, (list, tuple)):
        raise InvalidTypeError(f"storage_dims must be a list of ints, not "
                               f"{type(storage_dims).__name__}")
    desc = TensorDesc(tuple(view_dims), DTYPES[data_type],
                      None if stride is None else tuple(stride), offset, FORMATS[format])
    storage = math.prod(storage_dims) * desc.itemsize
    if desc.storage_nbytes > storage:
        raise InvalidValueError(f"the view {desc.shape} (strides {desc.strides}, offset "
                                f"{desc.offset}) reaches {desc.storage_nbytes} bytes, past the "
                                f"storage {tuple(storage_dims)} ({storage} bytes)")
    return Tensor(desc, tensor_data)


@api()
def destroy_tensor(tensor: Tensor) -> None:
    """``aclDestroyTensor``: the descriptor goes; the memory stays the caller's."""
    if not isinstance(tensor, Tensor):
        raise InvalidTypeError(f"{tensor!r} is not a tensor (acl.create_tensor)")
