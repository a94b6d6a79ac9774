"""Kernels: CUBINs and PTX known by their CUDA C source, run on the CPU by ``streamrt.emu``.

``install()`` wraps ``streamrt.backends.cuda.nvrtc.compile_module`` so that it still compiles with the
real NVRTC and records ``image -> (source, name)``; ``cuModuleLoadData`` of such an image gives a
module whose functions g++ builds with the emulator's shim (and, for device code calling
``cudaGraphSetConditional``, the fake's definition of it: ``conditional.PRELUDE``). A launch
copies its parameters at the call (as the driver does), checked against the kernel's C parameter
list, and runs in stream order on the stream's worker thread. The operators' kernels
(``streamrt.ops.cuda.KERNELS``) loop grid-stride, so their grids are capped as the emulator does;
other kernels run their full grid.
"""

from __future__ import annotations

import ctypes
import re
import threading
from typing import Any

from cuda.bindings import driver as drv

from . import capture, conditional, state, streams
from .binding import driver
from .state import DRV_SUCCESS, LOCK, FakeMisuse, FakeUnsupported, R

# images (CUBIN or PTX) -> (source, name, NVRTC options), by the compile_module wrapper
CUBINS: dict[bytes, tuple[str, str, tuple[str, ...]]] = {}
_cubins_lock = threading.Lock()


def wrap_compile_module() -> None:
    """Make ``nvrtc.compile_module`` (which ``compile_cubin`` calls too) record what it compiled,
    CUBIN or PTX (it still compiles for real)."""
    from streamrt.backends.cuda import nvrtc

    real = nvrtc.compile_module
    if getattr(real, "__fake_recording__", False):
        return

    def compile_module(source: str, name: str, target: str, options: tuple[str, ...] = ()) -> bytes:
        image = real(source, name, target, options)
        with _cubins_lock:
            CUBINS[bytes(image)] = (source, name, tuple(options))
        return image

    compile_module.__fake_recording__ = True  # type: ignore[attr-defined]
    compile_module.__wrapped__ = real  # type: ignore[attr-defined]
    nvrtc.compile_module = compile_module


class Module:
    def __init__(self, source: str, device: int, options: tuple[str, ...] = ()) -> None:
        self.handle = state.new_handle()
        self.source = source
        self.device = device
        self.options = options  # NVRTC's: their macros reach g++ too


class Function:
    def __init__(self, module: Module, name: str) -> None:
        from streamrt import emu

        self.handle = state.new_handle()
        self.module = module
        self.name = name
        # device code calling cudaGraphSetConditional: built with the fake's definition of it
        self.conds = "cudaGraphSetConditional" in module.source
        source = conditional.PRELUDE + module.source if self.conds else module.source
        try:
            self.lib = emu.library(source, name, module.options)
        except (NotImplementedError, RuntimeError) as exc:
            raise FakeUnsupported(f"the CPU emulator cannot build kernel {name!r}: {exc}") from exc
        self.capped = module.source in _operator_sources()
        # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: 48 KiB until the program opts in
        self.max_dyn_smem = SMEM_DEFAULT


MODULES: dict[int, Module] = {}
FUNCTIONS: dict[int, Function] = {}


def _operator_sources() -> set[str]:
    from streamrt.ops.cuda import KERNELS

    return {k.cuda_source for k in KERNELS.values()}


@driver("cuModuleLoadData", 1)
def cuModuleLoadData(image: Any) -> tuple:
    data = bytes(image) if isinstance(image, bytes | bytearray | memoryview) else None
    hit = CUBINS.get(data) if data is not None else None
    if hit is None:
        raise FakeUnsupported("cuModuleLoadData: the fake runs only images compiled through "
                              "streamrt.backends.cuda.nvrtc.compile_module after install()")
    with LOCK:
        m = Module(hit[0], state.current_device(), hit[2])
        MODULES[m.handle] = m
    return (DRV_SUCCESS, drv.CUmodule(m.handle))


@driver("cuModuleUnload")
def cuModuleUnload(hmod: Any) -> tuple:
    with LOCK:
        if MODULES.pop(state.as_int(hmod), None) is None:
            return (R.CUDA_ERROR_INVALID_HANDLE,)
    return (DRV_SUCCESS,)


@driver("cuModuleGetFunction", 1)
def cuModuleGetFunction(hmod: Any, name: bytes) -> tuple:
    with LOCK:
        m = MODULES.get(state.as_int(hmod))
    if m is None:
        return (R.CUDA_ERROR_INVALID_HANDLE, None)
    fname = bytes(name).decode()
    if not re.search(r'extern\s+"C"\s+__global__\s+void\s+' + re.escape(fname) + r"\s*\(", m.source):
        return (R.CUDA_ERROR_NOT_FOUND, None)
    f = Function(m, fname)  # g++ (cached on disk): outside the lock
    with LOCK:
        FUNCTIONS[f.handle] = f
    return (DRV_SUCCESS, drv.CUfunction(f.handle))


class Params:
    """A private copy of a launch's parameters, as a ``void**`` the emulator reads."""

    def __init__(self, addr: int, sizes: tuple[int, ...]) -> None:
        n = len(sizes)
        self.blobs = []
        self.array = (ctypes.c_void_p * max(n, 1))()
        if n and not addr:
            raise FakeMisuse(f"kernelParams is NULL for a kernel of {n} parameters")
        slots = (ctypes.c_void_p * n).from_address(addr) if n else ()
        for i, size in enumerate(sizes):
            if not slots[i]:
                raise FakeMisuse(f"kernelParams[{i}] is NULL")
            blob = ctypes.create_string_buffer(ctypes.string_at(slots[i], size), max(size, 1))
            self.blobs.append(blob)
            self.array[i] = ctypes.addressof(blob)


def copy_params(f: Function, kernel_params: Any) -> Params:
    """Check ``kernelParams`` against ``f``'s C parameters and copy it (the driver copies too)."""
    sizes = f.lib.param_sizes
    if isinstance(kernel_params, tuple) and len(kernel_params) == 2 \
            and isinstance(kernel_params[0], tuple) and isinstance(kernel_params[1], tuple):
        values, types = kernel_params
        if len(values) != len(sizes):
            raise FakeMisuse(f"{f.name}: {len(values)} launch arguments for {len(sizes)} C parameters")
        for i, (t, size) in enumerate(zip(types, sizes, strict=True)):
            if t is not None and ctypes.sizeof(t) != size:
                raise FakeMisuse(f"{f.name}: argument {i} is a {t.__name__} ({ctypes.sizeof(t)} "
                                 f"bytes) for a C parameter of {size} bytes")
        holder = drv.CUDA_KERNEL_NODE_PARAMS()
        holder.kernelParams = kernel_params  # the binding's own conversion into a void**
        return Params(int(holder.kernelParams), sizes)
    if kernel_params is None:
        return Params(0, sizes)
    return Params(int(kernel_params), sizes)


SMEM_DEFAULT = 48 << 10  # dynamic shared memory a function takes before it opts in
SMEM_OPTIN = 227 << 10  # sharedMemPerBlockOptin of the fake's sm_90 GPU


def check_dims(grid: tuple[int, int, int], block: tuple[int, int, int], shmem: int,
               f: Function | None = None) -> Any:
    """None when the launch shape is valid and supported; else the CUresult (or raises)."""
    gx, gy, gz = grid
    bx, by, bz = block
    if min(grid) < 1 or min(block) < 1 or gx >= 2**31 or gy > 65535 or gz > 65535:
        return R.CUDA_ERROR_INVALID_VALUE
    if bx > 1024 or by > 1024 or bz > 64 or bx * by * bz > 1024:
        return R.CUDA_ERROR_INVALID_VALUE
    if shmem > (f.max_dyn_smem if f is not None else SMEM_DEFAULT):  # not opted in that far
        return R.CUDA_ERROR_INVALID_VALUE
    return None


@driver("cuFuncSetAttribute")
def cuFuncSetAttribute(hfunc: Any, attrib: Any, value: int) -> tuple:
    with LOCK:
        fn = FUNCTIONS.get(state.as_int(hfunc))
    if fn is None:
        return (R.CUDA_ERROR_INVALID_HANDLE,)
    a = drv.CUfunction_attribute(int(attrib))
    if a is not drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        raise FakeUnsupported(f"cuFuncSetAttribute({a.name}): not modelled")
    if not 0 <= int(value) <= SMEM_OPTIN:
        return (R.CUDA_ERROR_INVALID_VALUE,)
    fn.max_dyn_smem = int(value)
    return (DRV_SUCCESS,)


def run(f: Function, params: Params, grid: tuple[int, int, int],
        block: tuple[int, int, int], shmem: int = 0) -> None:
    """Run one launch now (on a stream worker thread)."""
    from tests.cuda.emu import emu

    gx, gy, gz = grid
    if f.capped:
        gx, gz = min(gx, emu.GRID_CAP), min(gz, emu.GRID_CAP)
    f.lib.launch(params.array, gx, gy, gz, *block, shared_mem=shmem)
    if f.conds:  # its cudaGraphSetConditional calls reach the graph launch running it
        conditional.take(f.lib.lib)


@driver("cuLaunchKernel")
def cuLaunchKernel(f: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shmem: int,
                   stream: Any, kernel_params: Any, extra: Any) -> tuple:
    with LOCK:
        fn = FUNCTIONS.get(state.as_int(f))
        s = streams.resolve(stream)
        if fn is None or s is None:
            return (R.CUDA_ERROR_INVALID_HANDLE,)
        d = state.current_device()
        if fn.module.device != d or s.device != d:
            return (R.CUDA_ERROR_INVALID_HANDLE,)  # a launch runs in the current device's context
    grid, block = (int(gx), int(gy), int(gz)), (int(bx), int(by), int(bz))
    smem = int(shmem)
    bad = check_dims(grid, block, smem, fn)
    if bad is not None:
        return (bad,)
    if extra not in (None, 0):
        raise FakeUnsupported("cuLaunchKernel with 'extra': not modelled")
    params = copy_params(fn, kernel_params)
    with LOCK:
        if streams.resolve(stream) is not s:
            return (R.CUDA_ERROR_INVALID_HANDLE,)
        res = capture.intercept(s, "kernel", lambda: run(fn, params, grid, block, smem))
        if res is not None:
            return (R(int(res)),)
        s.enqueue(lambda: run(fn, params, grid, block, smem), f"kernel {fn.name}")
    return (DRV_SUCCESS,)
