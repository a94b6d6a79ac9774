"""``acl.nn``: aclnn's two-phase calls for every shipped operator, in aclnn's argument order:
``acl.nn.<op>_get_workspace_size(<tensors and attributes as aclnnXxxGetWorkspaceSize takes
them>)`` -> ``(workspace_size, executor, ret)``, then ``acl.nn.<op>(workspace, workspace_size,
executor, stream)`` -> ``ret``; ``destroy_executor``, ``set_executor_repeatable``. Each is
``ops.<op>.get_workspace_size`` / ``ops.<op>(...)``; a failure's ``ret`` is its ACLNN number
(``ACLNN_ERR_PARAM_INVALID`` ...) or runtime code.

Arguments streamrt decides otherwise are accepted and checked, not used: ``dtype`` (the out
tensor's dtype is the result's) and ``cubeMathType``; layer_norm's ``meanOutOptional`` /
``rstdOutOptional`` must be None (not computed here)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import ops
from ..errors import ExecutorError
from ..ops.executor import Executor
from . import constants as C
from .errors import api, not_offered
from .streams import stream_of

__all__ = ["ORDER", "destroy_executor", "set_executor_repeatable"]


def _dtype_ok(dtype: Any, out: Any) -> None:
    from .tensors import DTYPES

    if dtype is not None and DTYPES.get(dtype) != getattr(out, "dtype", None):
        raise ExecutorError(f"dtype {dtype!r} is not the out tensor's dtype",
                            C.ACLNN_ERR_PARAM_INVALID)


def _add(self: Any, other: Any, alpha: Any, out: Any) -> tuple[tuple, dict]:
    return (self, other, out), {"alpha": 1.0 if alpha is None else alpha}


def _mul(self: Any, other: Any, out: Any) -> tuple[tuple, dict]:
    return (self, other, out), {}


def _matmul(self: Any, mat2: Any, out: Any, cube_math_type: Any = 0) -> tuple[tuple, dict]:
    return (self, mat2, out), {}


def _softmax(self: Any, dim: Any, out: Any) -> tuple[tuple, dict]:
    return (self, out), {"axis": dim}


def _cumsum(self: Any, dim: Any, dtype: Any, out: Any) -> tuple[tuple, dict]:
    _dtype_ok(dtype, out)
    return (self, out), {"axis": dim}


def _reduce_sum(self: Any, dims: Any, keep_dim: Any, dtype: Any, out: Any) -> tuple[tuple, dict]:
    _dtype_ok(dtype, out)
    axis = None if dims is None else tuple(dims) if isinstance(dims, (list, tuple)) else dims
    return (self, out), {"axis": axis, "keepdims": keep_dim}


def _layer_norm(input: Any, normalized_shape: Any, weight: Any, bias: Any, eps: Any, out: Any,
                mean_out: Any = None, rstd_out: Any = None) -> tuple[tuple, dict]:
    if mean_out is not None or rstd_out is not None:
        raise ExecutorError("layer_norm's meanOut/rstdOut are not computed here: pass None",
                            C.ACLNN_ERR_PARAM_INVALID)
    if not isinstance(normalized_shape, (list, tuple)):
        raise ExecutorError(f"normalizedShape must be a list of ints, not {normalized_shape!r}",
                            C.ACLNN_ERR_PARAM_INVALID)
    return (input, weight, bias, out), {"eps": eps, "normalized_ndim": len(normalized_shape)}


# op -> aclnn's argument list for phase 1 (the names of aclnnXxxGetWorkspaceSize's inputs)
ORDER: dict[str, Callable[..., tuple[tuple, dict]]] = {
    "add": _add, "mul": _mul, "matmul": _matmul, "softmax": _softmax, "cumsum": _cumsum,
    "reduce_sum": _reduce_sum, "layer_norm": _layer_norm,
}


def _executor(executor: Any) -> Executor:
    if not isinstance(executor, Executor):
        raise ExecutorError(f"{executor!r} is not an executor", C.ACLNN_ERR_PARAM_NULLPTR)
    return executor


def _make(name: str, convert: Callable[..., tuple[tuple, dict]]) -> None:
    op = ops.OPS[name]

    def phase1(*args: Any, **kwargs: Any) -> tuple[int, Executor]:
        try:
            tensors, attrs = convert(*args, **kwargs)
        except TypeError as exc:  # the wrong number of aclnn arguments
            raise ExecutorError(f"ops.{name}: {exc}", C.ACLNN_ERR_PARAM_INVALID) from None
        return op.get_workspace_size(*tensors, **attrs)  # type: ignore[no-any-return]

    def phase2(workspace: Any, workspace_size: int, executor: Any, stream: Any) -> None:
        op(workspace or 0, workspace_size, _executor(executor), stream_of(stream))

    phase1.__name__ = phase1.__qualname__ = f"{name}_get_workspace_size"
    phase1.__doc__ = (f"``aclnn{_camel(name)}GetWorkspaceSize`` -> ``(workspace_size, executor, "
                      f"ret)``: ``ops.{name}.get_workspace_size``.")
    phase2.__name__ = phase2.__qualname__ = name
    phase2.__doc__ = f"``aclnn{_camel(name)}`` -> ``ret``: ``ops.{name}(...)``, enqueue only."
    globals()[phase1.__name__] = api(None, None)(phase1)
    globals()[name] = api()(phase2)
    __all__.extend((phase1.__name__, name))


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _as_given(*tensors: Any, **attrs: Any) -> tuple[tuple, dict]:
    """An operator without an aclnn order here: its tensors, then its attributes by keyword."""
    return tensors, attrs


for _name in ops.OPS:  # every shipped operator
    _make(_name, ORDER.get(_name, _as_given))


@api()
def destroy_executor(executor: Executor) -> None:
    """``aclDestroyAclOpExecutor``: ``ex.destroy()``."""
    _executor(executor).destroy()


@api()
def set_executor_repeatable(executor: Executor) -> None:
    """``aclSetAclOpExecutorRepeatable``: ``ex.set_repeatable()``."""
    _executor(executor).set_repeatable()


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    offered = ", ".join(n for n in ops.OPS)
    raise not_offered("acl.nn", name, {name: f"one of the shipped operators ({offered}): "
                                             "acl.nn.<op>_get_workspace_size, then acl.nn.<op>"})
