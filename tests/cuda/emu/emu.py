"""The operators' CUDA C on the CPU emulator (``streamrt.emu``), for test_ops_cuda_emulated and
the fake CUDA runtime: re-exports of the package's builder and runner, plus what only these tests
do (a capped grid for the operators' grid-stride kernels, routing the operators to their CUDA C).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from streamrt.backends.cpu import SPACE
from streamrt.backends.cuda.nvrtc import parse_signature
from streamrt.emu import ORDER_ENV, ORDERS, Library, cache_dir, cpp_source_of, parse_order, unavailable
from streamrt.emu import library as build_source
from streamrt.kernel import Kernel, dim3
from streamrt.ops.framework import Op

__all__ = ["GRID_CAP", "ORDERS", "ORDER_ENV", "Library", "build", "build_all", "build_source",
           "cache_dir", "cpp_source", "cpp_source_of", "host_address", "host_body", "launch",
           "parse_order", "route", "unavailable"]

# blocks along grid x and z for the operators' kernels (y, the split-K index, is never capped):
# they cover their work with grid-stride loops over x and z, so fewer blocks must give the same
# result (a bug needing many blocks is missed unless cap=None)
GRID_CAP = 2


def cpp_source(kernel: Kernel) -> str:
    """The C++ translation unit of ``kernel``."""
    return cpp_source_of(kernel.cuda_source, kernel.name)


def build(kernel: Kernel) -> Library:
    """The loaded library of ``kernel``'s current source, compiled unless cached."""
    return build_source(kernel.cuda_source, kernel.name)


def build_all(kernels: Iterable[Kernel], jobs: int | None = None) -> None:
    """Build ``kernels`` ahead of their launches, ``jobs`` compilers at a time (default: cores)."""
    with ThreadPoolExecutor(jobs or os.cpu_count() or 1) as pool:
        list(pool.map(build, kernels))


def launch(kernel: Kernel, args: Any, grid: Any, block: Any, cap: int | None = GRID_CAP,
           order: str | None = None) -> None:
    """Run one launch of ``kernel`` in ``order`` (:func:`parse_order`); pointer arguments are
    host addresses."""
    g, b = dim3(grid), dim3(block, "block")
    vals = [t(v) for t, v in zip(parse_signature(kernel.signature), args, strict=True)]
    params = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
    gx, gz = (g.x, g.z) if cap is None else (min(g.x, cap), min(g.z, cap))
    build(kernel).launch(params, gx, g.y, gz, b.x, b.y, b.z, order)


def host_address(ptr: int) -> int:
    """The host address of cpu-backend device address ``ptr``."""
    a = SPACE.find(ptr)
    if a is None or a.buf is None:
        raise ValueError(f"{hex(ptr)} is not in mapped cpu-backend memory")
    return a.buf.ctypes.data + (ptr - a.base)


def host_body(kernel: Kernel, cap: int | None = GRID_CAP, order: str | None = None):
    """A Python body for ``kernel`` on the cpu backend: the emulator, with host addresses."""
    is_ptr = [t is ctypes.c_void_p for t in parse_signature(kernel.signature)]

    def body(ctx, *args):
        args = [host_address(v) if p and v else v for p, v in zip(is_ptr, args, strict=True)]
        launch(kernel, args, ctx.grid, ctx.block, cap, order)

    return body


def _plan_cuda_everywhere(op, backend, ins, outs, attrs):
    return op._plan_cuda(ins, outs, attrs)


def route(monkeypatch: Any, kernels: Iterable[Kernel], cap: int | None = GRID_CAP,
          order: str | None = None) -> None:
    """Through ``monkeypatch`` (so undone at its teardown): operators plan with their cuda planners
    on every device, and on cpu ``kernels`` run their CUDA C on the emulator in ``order``."""
    monkeypatch.setattr(Op, "_plan_for", _plan_cuda_everywhere)
    for k in kernels:
        monkeypatch.setattr(k, "fn", host_body(k, cap, order))
