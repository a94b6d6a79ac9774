"""Two-phase operators (aclnn style, DESIGN.md §4): framework, executor cache, ``run``, library.

``op.get_workspace_size(*tensors, **attrs) -> (size, executor)`` is phase 1 (metadata only);
``op(workspace, size, executor, stream)`` is phase 2 (enqueue only); ``run`` does both with the
workspace from the pool, and optionally an :class:`ExecutorCache`. Each operator documents its
slots, attributes, dtypes and workspace (``help(ops.add)``, ``streamrt info --ops``; ``ops.docs``);
the kernels it enqueues are named after it (``ops.reduce_sum (_sum_level)``) in sanitizer
findings and traces. Executor lifetime: see :class:`Executor` (``with ex:`` destroys it).
``ops.use_cuda_c()`` (or ``STREAMRT_OPS_CUDA_C=1``) plans them on cpu with their CUDA C kernels,
which the CUDA C emulator runs: the GPU code, checked without a GPU.
"""

from __future__ import annotations

from .cache import ExecutorCache
from .elementwise import add, mul
from .executor import Executor
from .framework import CUDA_C_ENV, OPS, Op, stats, use_cuda_c
from .matmul import matmul
from .norm import layer_norm, softmax
from .reduce import reduce_sum
from .run import run
from .scan import cumsum
from .stats import set_log

__all__ = [
    "add", "mul", "reduce_sum", "softmax", "layer_norm", "matmul", "cumsum",
    "run", "ExecutorCache", "stats", "OPS", "Executor", "Op", "set_log", "use_cuda_c", "CUDA_C_ENV",
]
