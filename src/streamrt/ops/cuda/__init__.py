"""CUDA C implementations of the operators for the cuda backend (issue 8).

Each ``Op`` validates its metadata exactly as on cpu, then, on a cuda device, asks the planner of
its family here (``plan_*``: a pure function of tensor metadata) for a :class:`~..framework.Plan`
whose enqueue launches these kernels with ``stream.launch``. Importing this package needs neither
a GPU nor cuda-bindings: kernels are source strings, compiled by NVRTC at their first launch.

Scope: float16, float32 and float64, one dtype per call (mixed dtypes raise ExecutorError
161002); any rank and any strides (elementwise and matmul read strides in place, the others pack
strided inputs and unpack strided outputs through the workspace). float16 computes in float32.
"""

from __future__ import annotations

from .common import KERNELS
from .elementwise import plan_binary
from .matmul import plan_matmul
from .norm import plan_layer_norm, plan_softmax
from .reduce import plan_reduce_sum
from .scan import plan_cumsum

__all__ = ["KERNELS", "plan_binary", "plan_matmul", "plan_layer_norm", "plan_softmax",
           "plan_reduce_sum", "plan_cumsum"]
