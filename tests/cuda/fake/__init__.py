"""A fake CUDA runtime and driver, so that streamrt's cuda backend runs where no GPU is (a test aid).

``install()`` replaces the *functions* of ``cuda.bindings.runtime`` and ``cuda.bindings.driver``
that streamrt uses with fakes; the real types, enums and structs stay. Opt in with
``STREAMRT_CUDA_FAKE=1`` (``tests/conftest.py`` installs it before any device is made), then the
cuda tests run against it::

    STREAMRT_CUDA_FAKE=1 python -m pytest -m cuda

Every fake first calls the real function with the same arguments, which without a driver only
converts and type-checks them exactly as on a GPU (a wrong argument type fails as it would
there), then answers as the real binding does: ``(err, values...)`` with real result enums and
handle types. The devices say what they are: ``srt.Device("cuda:0")._impl.model`` (the backend's
device, named from ``cudaDeviceProp.name``) is "streamrt fake GPU". There are
``STREAMRT_CUDA_FAKE_DEVICES`` of them (default 2), sm_90, each with ``STREAMRT_CUDA_FAKE_MEMORY``
bytes (default 1 GiB; counted, not reserved up front).

What it models (each module's docstring says how):

- devices and the per-thread current device; device and pinned memory as real host memory;
  ``cudaMemcpyAsync``'s pageable-memory rules (staged source, waiting destination);
- streams as worker threads running their operations in order; the legacy default stream's
  implicit ordering with blocking streams; events (completion, timing, errors); host functions
  called on the worker thread, where any CUDA call fails with ``cudaErrorNotPermitted``
  (recorded in ``state.refused``); ``cudaFree``/``cudaFreeHost`` synchronizing;
- kernels: real NVRTC compilation (``compile_module`` is wrapped to remember each image's source),
  run on the CPU by ``tests/cuda/emu`` (g++ and a shim of the CUDA built-ins), parameters copied
  at launch and checked against the kernel's C parameter list;
- stream-ordered pools (reuse rules, release threshold, trim, watermarks, limits), CUDA graphs
  (kernel, memcpy, memset, host, empty, event record/wait and conditional nodes, the event nodes
  acting where they sit; conditional IF/WHILE/SWITCH nodes with their handles, defaults and
  ``cudaGraphSetConditional`` from device code, ``conditional.py``; exec independent of its
  graph; a launch is one stream operation;
  ``cudaGraphInstantiateWithParams`` with its flags and ``result_out``; the graph memory
  attributes and trim of CUDA's own graph allocator, which nothing here uses, so they read 0),
  and the VMM calls (``cuMem*``) with real shared mappings;
- stream capture (``capture.py``): ``cudaStreamBeginCapture`` in the three modes records kernel
  launches, copies, memsets, host functions and graph launches as graph nodes, event record/wait
  as forks and joins, and ``cudaStreamEndCapture`` gives a graph that instantiates and launches
  as any other; the capture errors (legacy-stream implicit dependency, isolation, merge,
  unmatched, unjoined, wrong thread, captured events, unsafe calls, synchronize/query of a
  capturing stream) invalidate it as CUDA documents;
- the driver calls of raw cuda-bindings programs (the peers of ``benchmarks/gpu_*.py``): primary
  contexts (``contexts.py``: ``cuCtxSetCurrent`` sets the thread's current device, shared with
  ``cudaSetDevice``), ``cuStream*`` (``driver_streams.py``: a ``CUstream`` and a ``cudaStream_t``
  of one handle are one stream), ``cuMemAlloc``/``cuMemFree``/``cuMemsetD32[Async]``/
  ``cuMemcpyDtoH``/``cuMemcpyHtoD`` (``driver_memory.py``: the synchronous ones on the legacy
  stream);
- the CUDA errors of invalid handles, frees, ranges and launch shapes.

What it cannot find, so what a real GPU run must still check:

- real driver behaviour: the error codes and synchronisation chosen here follow the CUDA
  documentation, but where it is silent the fake made a choice (see each module); no sticky
  errors and no device-side faults: a stray kernel access reads or corrupts this process's
  memory, or crashes it (freed device and pinned memory is made inaccessible, so a use after
  free crashes loudly); kernel pointer arguments are not checked to be device memory, nor peer
  access (``cudaDeviceEnablePeerAccess``) for a kernel reading another GPU's memory;
- NVRTC CUBIN loading: the fake never loads a CUBIN or PTX, it only looks up the source it came
  from, so an image the driver would refuse (wrong architecture, missing symbol mangling) is not
  caught; ``cuModuleLoadData`` of an image not compiled through ``compile_module`` is a
  FakeUnsupported;
- the GIL and threading of the real driver: the driver calls host functions on its own thread
  and its blocking calls may hold the GIL; here every blocking wait releases the GIL, so a
  deadlock that needs a GIL-holding blocking call never shows;
- concurrency inside the GPU: a kernel's blocks run one after another and its threads in one
  interleaving (``tests/cuda/emu``); a graph's nodes run one at a time (independent branches
  never overlap, though a wait node still waiting lets the others run first; the order among
  ready nodes is the reverse of insertion, so a missing edge shows); pools hand out whole
  blocks (no suballocation, so no placement bugs show);
- performance, occupancy, launch limits beyond the documented maxima, 2-D/3-D blocks and dynamic
  shared memory (FakeUnsupported errors);
- in a capture: stream-ordered allocation (memory nodes), ``cudaGraphUpload`` and external
  event waits are FakeUnsupported; ``cudaStreamGetCaptureInfo``/``cudaStreamUpdateCaptureDependencies``
  and ``cudaThreadExchangeStreamCaptureMode`` are not faked; where CUDA's documentation does not
  say which error a capture misuse gives (a second begin, an end without a capture: here
  cudaErrorIllegalState) or whether it invalidates the capture, the fake chose (``capture.py``);
- driver contexts other than the primary ones (``cuCtxCreate``, push/pop, a thread with no
  current context), and the per-thread default stream, are not faked.
"""

from __future__ import annotations

import os

from . import binding, state

__all__ = ["install", "installed", "uninstall", "state"]

_installed = False


def install() -> None:
    """Replace the CUDA runtime and driver functions with the fakes (idempotent)."""
    global _installed
    if _installed:
        return
    from cuda.bindings import runtime as rt

    err = rt.cudaGetDeviceCount()[0]
    if err != rt.cudaError_t.cudaErrorInsufficientDriver:
        raise binding.RealDriverPresent(
            f"cudaGetDeviceCount answered {err!r}: a real driver is here, and the fake (which calls "
            "the real functions to check their arguments) must not run beside it")
    from . import (  # noqa: F401 (register the fakes)
        capture,
        conditional,
        contexts,
        devices,
        driver_memory,
        driver_streams,
        events,
        graph_memattrs,
        graph_updates,
        graphs,
        kernels,
        memory,
        pools,
        streams,
        vmm,
    )

    streams.reset_devices()
    kernels.wrap_compile_module()
    binding.patch()
    _installed = True


def unavailable() -> str | None:
    """Why the fake cannot run here (None: it can): it needs cuda-bindings, no CUDA driver beside
    it, and g++ for the kernel emulator."""
    try:
        from cuda.bindings import runtime as rt
    except ImportError:
        return "cuda-bindings is not installed"
    err = rt.cudaGetDeviceCount()[0]
    if err != rt.cudaError_t.cudaErrorInsufficientDriver:
        return f"a CUDA driver is here (cudaGetDeviceCount: {err!r}): the cuda tests run on it instead"
    from streamrt import emu

    return emu.unavailable()


def installed() -> bool:
    return _installed


def uninstall() -> None:
    """Put the real functions back (fake state stays: streamrt may still hold fake handles)."""
    global _installed
    binding.unpatch()
    _installed = False


def enabled_by_env() -> bool:
    """``STREAMRT_CUDA_FAKE=1``."""
    return os.environ.get("STREAMRT_CUDA_FAKE") == "1"
