"""Shared helpers of the ``gpu_*`` benchmark scripts: skip logic, raw cuda-bindings peers, result rows.

The raw peers talk to the driver directly through ``cuda.bindings`` (the primary context of the
device, the same context the CUDA runtime, streamrt's cuda backend, CuPy and PyTorch use), so
that a figure for streamrt can be set against the cheapest call a Python program can make.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import importlib
import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import SMOKE_HELP

import streamrt as srt
from streamrt.backends.cuda.nvrtc import compile_cubin

N_ELEMS = 256
SRC = r"""extern "C" __global__ void tiny_add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) c[i] = a[i] + b[i]; }"""
# kernelParams types of ``(const float*, const float*, float*, int)``, tiny_add's signature
PTR3_I32 = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)


@srt.kernel(cuda=SRC, signature="ptr, ptr, ptr, i32")
def tiny_add(ctx, a, b, c, n):
    """c = a + b over ``n`` float32 (the Python body runs on the cpu backend)."""
    np.add(ctx.array(a, (n,), np.float32, readonly=True),
           ctx.array(b, (n,), np.float32, readonly=True),
           out=ctx.array(c, (n,), np.float32))


def gpu_skip_reason() -> str | None:
    """None when streamrt sees a usable cuda device, else why the GPU benchmarks are skipped."""
    try:
        if srt.device_count("cuda") > 0:
            return None
    except Exception as exc:  # a half-finished backend must not crash the caller
        return f"srt.device_count('cuda') raised {type(exc).__name__}: {exc}"
    try:  # the backend's own error message says what is missing (package, driver, GPU)
        from streamrt.backends import get_backend

        get_backend("cuda")
    except Exception as exc:
        return f"no usable cuda device: {exc}"
    return "no usable cuda device (srt.device_count('cuda') == 0)"


def _err_name(err: Any) -> str:
    name = getattr(err, "name", None)
    return f"{name} ({int(err)})" if name else repr(err)


def check(result: Any) -> Any:
    """Unwrap a cuda-bindings ``(err, *values)`` result: None, the one value, or a tuple of them."""
    if isinstance(result, tuple):
        err, values = result[0], result[1:]
    else:
        err, values = result, ()
    if err:  # CUDA_SUCCESS, cudaSuccess and NVRTC_SUCCESS are all 0
        raise RuntimeError(f"cuda-bindings call failed: {_err_name(err)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else values


@functools.cache
def _primary(index: int) -> tuple[Any, Any]:
    from cuda.bindings import driver

    check(driver.cuInit(0))
    dev = check(driver.cuDeviceGet(index))
    return dev, check(driver.cuDevicePrimaryCtxRetain(dev))  # retained for the process's life


def raw_context(index: int = 0) -> tuple[Any, Any]:
    """``(CUdevice, CUcontext)`` of device ``index``: its primary context, made current."""
    from cuda.bindings import driver

    dev, ctx = _primary(index)
    # every call, not once: streamrt or a peer library may have made another context current since
    check(driver.cuCtxSetCurrent(ctx))
    return dev, ctx


def raw_arch(index: int = 0) -> str:
    """The NVRTC target of device ``index``, e.g. ``"sm_90"``."""
    from cuda.bindings import driver

    dev, _ = raw_context(index)
    attr = driver.CUdevice_attribute
    major = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    return f"sm_{major}{minor}"


@functools.cache
def raw_module(source: str, name: str, index: int = 0) -> Any:
    """The ``CUfunction`` ``name`` of ``source``, compiled for device ``index`` and loaded raw."""
    from cuda.bindings import driver

    raw_context(index)
    cubin = compile_cubin(source, name, raw_arch(index))  # streamrt's NVRTC wrapper and cache
    module = check(driver.cuModuleLoadData(cubin))
    return check(driver.cuModuleGetFunction(module, name.encode()))


class RawTiny:
    """``tiny_add`` set up raw: its CUfunction, a non-blocking CUstream, a = b = 1.0, c, kernelParams."""

    def __init__(self, index: int = 0) -> None:
        from cuda.bindings import driver

        self._driver = driver
        raw_context(index)
        self.fn = raw_module(SRC, "tiny_add", index)
        self.stream = check(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING))
        self.ptrs: list[int] = []
        try:
            for _ in range(3):
                self.ptrs.append(int(check(driver.cuMemAlloc(N_ELEMS * 4))))
            for p, bits in zip(self.ptrs, (0x3F800000, 0x3F800000, 0)):  # 1.0f, 1.0f, 0.0f
                # on our stream: cuMemsetD32 would run on the legacy stream, which a
                # non-blocking stream is not ordered with (its synchronize would not wait for it)
                check(driver.cuMemsetD32Async(p, bits, N_ELEMS, self.stream))
            check(driver.cuStreamSynchronize(self.stream))
        except BaseException:
            self.close()
            raise
        #: kernelParams as cuda-bindings users write them: packed by cuda-bindings on every call
        self.params = ((*self.ptrs, N_ELEMS), PTR3_I32)
        # pre-packed: a void*[] whose entries point at the argument values; the int n is read
        # from the low 4 bytes of its uint64 slot (little-endian)
        self._values = np.array([*self.ptrs, N_ELEMS], np.uint64)
        self._slots = np.array([self._values.ctypes.data + 8 * i for i in range(4)], np.uint64)
        #: kernelParams as an ``int`` address of a ready ``void*[]``: the cheapest launch there is
        self.packed = int(self._slots.ctypes.data)

    def launch(self, kernel_params: Any, stream: Any = None) -> None:
        """One raw ``cuLaunchKernel`` of tiny_add (grid 1, block 256) on ``stream`` (default ours)."""
        err, = self._driver.cuLaunchKernel(self.fn, 1, 1, 1, N_ELEMS, 1, 1, 0,
                                           self.stream if stream is None else stream,
                                           kernel_params, 0)
        if err:
            check((err,))

    def synchronize(self) -> None:
        """``cuStreamSynchronize`` of the raw stream."""
        check(self._driver.cuStreamSynchronize(self.stream))

    def result(self) -> np.ndarray:
        """A host copy of c (synchronous)."""
        out = np.empty(N_ELEMS, np.float32)
        check(self._driver.cuMemcpyDtoH(out, self.ptrs[2], N_ELEMS * 4))
        return out

    def close(self) -> None:
        """Free the buffers and destroy the stream."""
        for p in self.ptrs:
            quietly(self._driver.cuMemFree, p)
        self.ptrs = []
        quietly(self._driver.cuStreamDestroy, self.stream)


NOT_THERE = "not installed or sees no GPU"


def optional_peer(name: str) -> tuple[Any | None, str | None]:
    """``(module, None)`` for ``cupy`` or ``torch`` installed and able to see a GPU, else
    ``(None, why)``: ``NOT_THERE``, with the exception when an installed library failed."""
    try:
        mod = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None, NOT_THERE
        return None, f"{NOT_THERE} (import failed: {type(exc).__name__}: {exc})"
    except Exception as exc:  # not only ImportError: a broken CUDA library can fail the import itself
        return None, f"{NOT_THERE} (import failed: {type(exc).__name__}: {exc})"
    try:
        if name == "cupy":
            ok = mod.cuda.runtime.getDeviceCount() > 0
        elif name == "torch":
            ok = bool(mod.cuda.is_available())
        else:
            ok = True
    except Exception as exc:
        return None, f"{NOT_THERE} ({type(exc).__name__}: {exc})"
    return (mod, None) if ok else (None, NOT_THERE)


def attempt(fn: Callable[[], Any]) -> tuple[Any, str | None]:
    """``(fn(), None)``, or ``(None, error)``: one failed measurement must not cost the others."""
    try:
        return fn(), None
    except Exception as exc:  # StreamRTError from a first-version backend, RuntimeError from check()
        return None, f"{type(exc).__name__}: {exc}"


def row(claim: str, ours: float | None, peer: float | None, unit: str, *, limit: float | None = None,
        error: str | None = None) -> dict:
    """One result row; ``limit`` is the largest passing ours/peer ratio (None: reported only)."""
    ratio = ours / peer if ours is not None and peer else None
    if ours is None:
        passed = False  # not run: never a pass, whatever the target
    elif limit is None:
        passed = True
    else:
        passed = ratio is not None and ratio <= limit
    r = {"claim": claim, "ours": ours, "peer": peer, "unit": unit, "ratio": ratio,
         "target": "info" if limit is None else f"<= {limit:g}x", "pass": passed}
    if error:
        r["error"] = error
    return r


def errors(*pairs: tuple[str, str | None]) -> str | None:
    """The non-empty errors of ``(label, error)`` pairs, joined, or None."""
    msgs = [f"{label}: {err}" for label, err in pairs if err]
    return "; ".join(msgs) or None


def quietly(fn: Callable[..., Any], *args: Any) -> None:
    """Call a cleanup ``fn(*args)``, ignoring its failure so that it never masks the real error."""
    try:
        fn(*args)
    except Exception:
        pass


def fmt(v: float | None) -> str:
    """A figure of a report line (``n/a`` for a measurement that did not run)."""
    return "    n/a" if v is None else f"{v:7.3f}"


def parser(doc: str, quick: str) -> argparse.ArgumentParser:
    """The command line every GPU benchmark shares (``--quick``, ``--json``, the smoke knob)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0], epilog=SMOKE_HELP)
    ap.add_argument("--quick", action="store_true", help=quick)
    ap.add_argument("--json", action="store_true", help="print the result as one JSON line")
    return ap


def finish(res: dict, rows: list[dict]) -> dict:
    """Attach the rows and the overall verdict to a benchmark result."""
    res["rows"] = rows
    res["pass"] = all(r["pass"] for r in rows)
    return res


def report(r: dict, as_json: bool, title: str, unit: str) -> None:
    """Print a benchmark result: JSON (``--json``), the skip reason, or a readable report."""
    if as_json:
        if "skipped" in r:
            print(f"skipped: {r['skipped']}", file=sys.stderr)
        print(json.dumps(r))
        return
    if "skipped" in r:
        print(f"skipped: {r['skipped']}")
        return
    print(title)
    for x in r["rows"]:
        err = f"  {x['error']}" if "error" in x else ""
        print(f"  {x['claim']:64s} {fmt(x['ours'])} vs {fmt(x['peer'])} {unit}   "
              f"ratio {fmt(x['ratio'])}x ({x['target']}){err}")
    for note in r.get("notes", ()):
        print(f"  note: {note}")
    print(f"  {'PASS' if r['pass'] else 'FAIL'}")
