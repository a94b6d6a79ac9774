"""Elementwise binary operators: ``add`` (``out = x + alpha * y``) and ``mul`` (``out = x * y``).

Both broadcast numpy-style (the output shape must be the broadcast shape) and read strided
inputs in place. The workspace holds what aclnn's l0 ops would put there: an input cast to the
compute dtype (``l0op::Cast``) when the operands' dtypes differ, and, for ``add`` with
``alpha != 1``, ``alpha * y`` in the compute dtype. Same-dtype calls with ``alpha == 1`` need
no workspace (the seed's size-0 case).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..tensor import TensorDesc
from .common import Layout, for_op, region, two_step, view
from .cuda import plan_binary
from .framework import Attr, Op, Plan, float_attr

__all__ = ["Add", "Mul", "add", "mul"]

BLOCK = 256  # elements per block in the reported tiling (the grid of the launch)


def _binary_views(ctx: Any, xp: int, yp: int, op_: int, ws: int | None, p: tuple) -> tuple:
    ufunc, xd, yd, od, cdt, xoff, yoff, alpha = p
    return (view(ctx, xp, xd, True), view(ctx, yp, yd, True),
            region(ctx, ws, xoff, xd.shape, cdt) if xoff >= 0 else None,  # x cast there
            region(ctx, ws, yoff, yd.shape, cdt) if yoff >= 0 else None,  # y cast/scaled there
            view(ctx, op_, od, False), ufunc, alpha)


@two_step(_binary_views)
def _binary_kernel(x: Any, y: Any, xb: Any, yb: Any, o: Any, ufunc: Any, alpha: Any) -> None:
    if xb is not None:  # cast x into the workspace
        np.copyto(xb, x, casting="unsafe")
        x = xb
    if yb is not None:  # cast and/or scale y into the workspace
        if alpha is None:
            np.copyto(yb, y, casting="unsafe")
        else:
            np.multiply(y, alpha, out=yb, casting="unsafe")
        y = yb
    ufunc(x, y, out=o, casting="unsafe")


class _Binary(Op):
    """What ``add`` and ``mul`` share: broadcasting, the casts, one kernel per operator."""

    inputs = ("x", "y")
    _ufunc: Any = None  # private: pydoc would show numpy's docstring of a public ufunc
    slot_docs = {
        "x": "any shape that broadcasts with y (numpy rules); read in place, strided or not.",
        "y": "any shape that broadcasts with x.",
        "out": "the broadcast shape of x and y; may be x or y itself (in place), never a "
               "partial overlap.",
    }
    dtype_doc = ("Mixed dtypes are accepted on cpu (computed in numpy's result type of x and "
                 "y, then cast to out); cuda needs one dtype for every tensor.")

    def __init__(self) -> None:
        super().__init__()
        self._kernel = for_op(_binary_kernel, self.name)  # named ops.add / ops.mul in findings

    def _check(self, x: TensorDesc, y: TensorDesc, o: TensorDesc) -> tuple[int, ...]:
        """The broadcast shape, which ``out`` must have."""
        try:
            shape = np.broadcast_shapes(x.shape, y.shape)
        except ValueError:
            raise self._bad(f"x {x.shape} and y {y.shape} do not broadcast") from None
        self._check_shape("out", o, shape)
        return shape

    def _plan_cuda(self, ins: list[TensorDesc | None], outs: list[TensorDesc], attrs: dict) -> Plan:
        x, y = ins
        (o,) = outs
        self._check(x, y, o)
        return plan_binary(self.name, x, y, o, attrs.get("alpha", 1.0))

    def _plan(self, ins: list[TensorDesc | None], outs: list[TensorDesc], attrs: dict) -> Plan:
        x, y = ins
        (o,) = outs
        shape = self._check(x, y, o)
        cdt = np.result_type(x.dtype, y.dtype)
        alpha = attrs.get("alpha", 1.0)
        lay = Layout()
        xoff = lay.add("x_cast", x.shape, cdt) if x.dtype != cdt else -1
        scaled = alpha != 1.0
        yoff = lay.add("y_cast", y.shape, cdt) if y.dtype != cdt or scaled else -1
        blocks = max((o.numel + BLOCK - 1) // BLOCK, 1)
        impl = "same_shape" if x.shape == y.shape == shape else "broadcast"
        if xoff >= 0 or yoff >= 0:
            impl += "+cast" if not scaled else "+scale"
        params = (self._ufunc, x, y, o, cdt, xoff, yoff, cdt.type(alpha) if scaled else None)
        grid = min(blocks, 65535)
        launch_needed = o.numel > 0
        kernel = self._kernel

        def enqueue(s: Any, ws: int | None, a: list) -> None:
            if launch_needed:
                s.launch(kernel, a[0], a[1], a[2], ws, params, grid=grid, block=BLOCK)

        return Plan(lay.total(), enqueue, impl, {"blocks": blocks, "block": BLOCK})


class Add(_Binary):
    """``out = x + alpha * y``, elementwise with numpy broadcasting (``aclnnAdd``)."""

    name = "add"
    _ufunc = np.add
    attrs = {"alpha": Attr(float_attr, 1.0, "the factor of y, rounded to the compute dtype.")}
    workspace_doc = ("x and/or y cast to the compute dtype when the dtypes differ, and "
                     "alpha * y when alpha != 1; 0 bytes for one dtype and alpha == 1.")


class Mul(_Binary):
    """``out = x * y``, elementwise with numpy broadcasting (``aclnnMul``)."""

    name = "mul"
    _ufunc = np.multiply
    workspace_doc = "x and/or y cast to the compute dtype when the dtypes differ; else 0 bytes."


add = Add()
mul = Mul()
