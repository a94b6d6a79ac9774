"""Run the operator kernels' real CUDA C on the CPU: a test aid for machines without a GPU.

g++ (C++20) compiles each kernel's ``cuda_source`` after ``shim.h``, which supplies the CUDA
built-ins the kernels use: ``threadIdx``/``blockIdx``/``blockDim``/``gridDim``, ``__shared__``,
``__syncthreads``, ``__shfl_xor_sync``/``__shfl_up_sync``, ``__fmul_rn``/``__dmul_rn``,
``clock64`` and the float16 conversions (``_Float16``, round to nearest even). A launch runs the
CUDA threads of a block as fibers (``ucontext``) on the calling thread. The shared objects are
cached in ``$STREAMRT_CACHE_DIR/emu`` (default ``~/.cache/streamrt/emu``), named by a hash of the
C++ source and the compiler command, so a changed kernel is rebuilt and an unchanged one is not.

What it does not emulate, so what it cannot find:

- no real memory model: no weak ordering, caches or coalescing. Only indices into fixed-size
  arrays (``__shared__`` and local ones) are bounds checked (``-fsanitize=bounds,object-size``:
  the launch stops with RuntimeError; an array index, or a pointer into one inside an inlined
  helper); a stray access through a pointer (a global buffer, a workspace region) reads or
  corrupts this process's memory, or crashes it;
- scheduling: the threads of a block are fibers on one OS thread, each running until it waits at
  a barrier (``__syncthreads``, a shuffle) or returns, in the launch's *order* (``ORDERS``; the
  ``order`` argument, else ``$STREAMRT_EMU_ORDER``, else ``forward``):

  - ``forward``: passes over the block in thread order, every barrier that can open opening after
    a pass: thread 0 runs ahead of every other up to the next barrier, but the warps move in
    lockstep from shuffle to shuffle;
  - ``reverse``: the same in reverse thread order (the last thread runs ahead), blocks reversed;
  - ``ahead``: one warp at a time, its shuffles opening at once: warp 0 runs to its next
    ``__syncthreads`` before warp 1 starts, as warps may drift apart on a GPU. So a missing block
    barrier between shared-memory accesses that warp shuffles separate shows here, not in
    ``forward``;
  - ``behind``: as ``ahead`` with the warps, lanes and blocks in reverse order (warp 0 last: it
    often alone writes a block's result);
  - ``random:SEED``: as ``ahead`` with the warps in a seeded random order drawn at each
    ``__syncthreads``, the lanes of a warp in a random order, the blocks in a random order.

  A missing barrier shows only in the interleavings these give: a thread is never interrupted
  between two barriers (so a race needing that, or a lane of one warp between two shuffles of
  another, is missed), and no memory is lost to weak ordering (a missing ``__threadfence`` or
  ``volatile`` never shows). A kernel whose threads wait for each other without a barrier (a spin
  on another thread's flag) hangs;
- blocks run one after another (grid order, reversed or shuffled as the order says): never at
  once, so a race between blocks (two writing one place, one reading what another writes) shows
  only as the outcome of one whole block running before another;
- the grid is capped for speed: x and z to ``GRID_CAP`` blocks (y, the split-K index, is never
  capped). The kernels cover their work with grid-stride loops over x and z, so fewer blocks must
  give the same result, but a bug needing many blocks is missed unless ``cap=None``;
- floating point: fp contraction is off (NVRTC fuses ``a*b+c`` into FMAs by default) and
  ``expf``/``exp``/``sqrtf`` come from the host's libm, so the last bits may differ from a GPU's;
- warps: the shuffle mask is ignored (every lane of a warp must take part); a warp is 32
  consecutive threads in CUDA's linear order (x fastest), the last one may be partial. A block
  whose threads deadlock (a barrier in divergent code) raises RuntimeError;
- ``clock64()`` counts nanoseconds and sleeps a little at each call (spin loops stay cheap);
- nothing about speed, occupancy, registers or launch limits: only results.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from streamrt.backends.cpu import SPACE
from streamrt.backends.cuda.nvrtc import parse_signature
from streamrt.kernel import Kernel, dim3
from streamrt.ops.framework import Op

GRID_CAP = 2  # blocks along grid x and z (see the module docstring)
ORDERS = {"forward": 0, "reverse": 1, "ahead": 2, "behind": 3, "random": 4}  # shim.h's srt_emu_order
ORDER_ENV = "STREAMRT_EMU_ORDER"  # the default order, e.g. "reverse" or "random:7"
SHIM = (Path(__file__).parent / "shim.h").read_text()
# -fsanitize checks accesses to fixed-size (__shared__, local) arrays, by index or through a pointer
# the compiler follows; compile only (-c): the shim defines the handlers, and linking with
# -fsanitize would add libubsan
CXX = ["g++", "-std=c++20", "-O1", "-ffp-contract=off", "-fPIC", "-pthread", "-w",
       "-fsanitize=bounds,object-size"]
LINK = ["g++", "-shared", "-pthread"]
# srt_ld / srt_st convert float16 with PTX; the host converts with the shim's _Float16 helpers
PTX = {
    'asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p->bits));': "f = srt_emu_h2f(p->bits);",
    'asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));': "h = srt_emu_f2h(v);",
}
LAUNCH = ('extern "C" int srt_emu_launch(void** p, unsigned gx, unsigned gy, unsigned gz, '
          'unsigned bx, unsigned by, unsigned bz, int order, unsigned long long seed) '
          '{{ return srt_emu_run(&{name}, p, gx, gy, gz, bx, by, bz, order, seed); }}\n'
          'extern "C" unsigned srt_emu_param_sizes(unsigned long long* out, unsigned max) '
          '{{ return srt_emu_sizes(&{name}, out, max); }}\n'
          'extern "C" unsigned srt_emu_oob_at() {{ return srt_emu_oob_line; }}\n')

_libs: dict[str, Library] = {}  # by C++ source
_build_lock = threading.Lock()  # guards _libs


class Library:
    """One kernel built by g++: its launcher and the sizes of its C parameters."""

    def __init__(self, lib: ctypes.CDLL, name: str, cpp: Path | None = None) -> None:
        self.lib = lib
        self.name = name
        self.cpp = cpp  # the C++ source kept next to the library
        sizes = (ctypes.c_ulonglong * 64)()
        n = lib.srt_emu_param_sizes(sizes, 64)
        if n > 64:
            raise NotImplementedError(f"{name}: {n} parameters (the emulator takes 64)")
        self.param_sizes = tuple(sizes[:n])

    def launch(self, params: Any, gx: int, gy: int, gz: int, bx: int, by: int = 1,
               bz: int = 1, order: str | None = None) -> None:
        """Run a (gx, gy, gz) grid of (bx, by, bz) blocks in ``order`` (see :func:`parse_order`);
        ``params`` is a ``void**``. Launches on different OS threads run at once (each has its
        own coordinates and ``__shared__`` arrays)."""
        code, seed = parse_order(order)
        rc = self.lib.srt_emu_launch(params, gx, gy, gz, bx, by, bz, code, seed)
        if rc == 1:
            raise RuntimeError(f"{self.name}: the threads of a block deadlocked (a barrier that "
                               "some threads never reach)")
        if rc == 2:
            raise RuntimeError(f"{self.name}: an index out of the bounds of a fixed-size array "
                               f"(__shared__ or local) at line {self.lib.srt_emu_oob_at()} of "
                               f"{self.cpp}")


def parse_order(order: str | None = None) -> tuple[int, int]:
    """``(shim order code, seed)`` of ``order`` (an ``ORDERS`` name, or "random:SEED");
    None: ``$STREAMRT_EMU_ORDER``, else "forward" (read on every call)."""
    spec = order or os.environ.get(ORDER_ENV) or "forward"
    name, colon, seed = spec.partition(":")
    if name not in ORDERS or (colon and (name != "random" or not seed.isdigit())):
        raise ValueError(f"emulator order {spec!r}: one of {', '.join(ORDERS)}, or random:SEED")
    return ORDERS[name], int(seed or 0)


def cache_dir() -> Path:
    """``$STREAMRT_CACHE_DIR/emu`` or ``~/.cache/streamrt/emu`` (read on every call)."""
    root = os.environ.get("STREAMRT_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "streamrt") / "emu"


def unavailable() -> str | None:
    """None when g++ compiles the shim here (C++20, ``<ucontext.h>``, ``_Float16``), else why not."""
    if shutil.which("g++") is None:
        return "g++ is not on PATH"
    try:
        r = subprocess.run([*CXX, "-fsyntax-only", "-x", "c++", "-"], input=SHIM,
                           capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"g++ did not run: {exc}"
    if r.returncode:
        return f"g++ cannot compile the C++20 shim (ucontext, _Float16): {r.stderr.strip()[-600:]}"
    return None


def cpp_source_of(source: str, name: str) -> str:
    """The C++ translation unit of kernel ``name`` in CUDA C ``source``: shim, the source, and
    ``extern "C"`` launcher and parameter-size functions."""
    src = source
    for ptx, host in PTX.items():
        src = src.replace(ptx, host)
    if "asm(" in src:
        raise NotImplementedError(f"{name}: inline PTX the emulator does not know ({__file__})")
    return SHIM + src + LAUNCH.format(name=name)


def cpp_source(kernel: Kernel) -> str:
    """The C++ translation unit of ``kernel``."""
    return cpp_source_of(kernel.cuda_source, kernel.name)


def build_source(source: str, name: str) -> Library:
    """The loaded library of kernel ``name`` of ``source``, compiled unless cached."""
    src = cpp_source_of(source, name)
    lib = _libs.get(src)
    if lib is None:
        key = hashlib.sha256("\0".join([*CXX, *LINK, src]).encode()).hexdigest()[:16]
        so = cache_dir() / f"{name}-{key}.so"
        if not so.exists():
            _compile(src, so)
        cdll = ctypes.CDLL(str(so))
        cdll.srt_emu_launch.argtypes = ([ctypes.c_void_p] + [ctypes.c_uint] * 6
                                        + [ctypes.c_int, ctypes.c_ulonglong])
        cdll.srt_emu_launch.restype = ctypes.c_int
        cdll.srt_emu_param_sizes.argtypes = [ctypes.c_void_p, ctypes.c_uint]
        cdll.srt_emu_param_sizes.restype = ctypes.c_uint
        cdll.srt_emu_oob_at.restype = ctypes.c_uint
        with _build_lock:
            lib = _libs.setdefault(src, Library(cdll, name, so.with_suffix(".cpp")))
    return lib


def build(kernel: Kernel) -> Library:
    """The loaded library of ``kernel``'s current source, compiled unless cached."""
    return build_source(kernel.cuda_source, kernel.name)


def _compile(src: str, so: Path) -> None:
    so.parent.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}-{threading.get_ident()}"  # concurrent builders never share a file
    cpp, obj = so.with_suffix(f".{tag}.cpp"), so.with_suffix(f".{tag}.o")
    tmp = so.with_suffix(f".{tag}.tmp")
    cpp.write_text(src)
    try:
        for cmd in ([*CXX, "-c", "-o", str(obj), str(cpp)], [*LINK, "-o", str(tmp), str(obj)]):
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode:
                raise RuntimeError(f"g++ failed on {so.stem}:\n{r.stderr[-4000:]}")
        os.replace(tmp, so)
        os.replace(cpp, so.with_suffix(".cpp"))  # kept next to the library, for debugging
    finally:
        for f in (cpp, obj, tmp):
            f.unlink(missing_ok=True)


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
