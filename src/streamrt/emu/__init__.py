"""Run CUDA C kernels on the CPU: the cpu backend's way to launch a kernel made only of CUDA C.

g++ (C++20) compiles a kernel's CUDA C after ``shim.h`` (``build``), which supplies the CUDA
built-ins: ``threadIdx``/``blockIdx``/``blockDim``/``gridDim``, ``__shared__`` (static, and
dynamic ``extern __shared__ T s[]`` sized by the launch), ``__syncthreads``, ``__syncwarp``,
the shuffles (``__shfl_sync``, ``_xor``, ``_up``, ``_down``) and votes (``__ballot_sync``,
``__all_sync``, ``__any_sync``), ``atomicAdd/Sub/Max/Min/Exch/CAS/And/Or/Xor/Inc`` (real atomic
operations), ``__threadfence``, ``min``/``max``, the math of ``<cmath>`` and the fast
intrinsics, ``clock64``, ``cuda_fp16.h``'s ``__half``/``__half2`` (``fp16.h``), the vector
types (``vectors.h``) and the integer and conversion intrinsics (``intrinsics.h``). A
launch (``runner``) runs the CUDA threads of a block as fibers (``ucontext``) on the calling
thread. The shared objects are cached on disk (``build.cache_dir``), named by a hash of the
C++ source, the options and the compiler's version; a kernel g++ cannot compile raises
``srt.CompileError`` with g++'s log, its lines named as NVRTC names them.

What it does not emulate, so what it cannot find:

- no real memory model: no weak ordering, caches or coalescing. Indices into fixed-size
  arrays (``__shared__`` and local ones) are bounds checked (``-fsanitize=bounds,object-size``:
  the launch stops with RuntimeError; an array index, or a pointer into one inside an inlined
  helper). Global memory is checked only while the sanitizer is on (``checked``: the kernel's
  recording build runs on redzoned copies of the allocations its pointer arguments lie in);
  otherwise a stray access through a pointer reads or corrupts this process's memory, or
  crashes it, and so does an ``extern __shared__`` array used past the launch's ``shared_mem``;
- scheduling: the threads of a block are fibers on one OS thread, each running until it waits at
  a barrier (``__syncthreads``, a shuffle) or returns, in the launch's *order* (``runner.ORDERS``; the
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
- the grid runs as given (tests of the operators' grid-stride kernels cap it for speed);
- floating point: fp contraction is off (NVRTC fuses ``a*b+c`` into FMAs by default) and
  ``expf``/``exp``/``sqrtf`` come from the host's libm, so the last bits may differ from a GPU's;
- warps: the shuffle mask is ignored (every lane of a warp must take part); a warp is 32
  consecutive threads in CUDA's linear order (x fastest), the last one may be partial. A block
  whose threads deadlock (a barrier in divergent code) raises RuntimeError;
- ``clock64()`` counts nanoseconds and sleeps a little at each call (spin loops stay cheap);
- nothing about speed, occupancy, registers or launch limits: only results.
"""

from __future__ import annotations

from .build import build, cache_dir, cpp_source_of, require, unavailable
from .checked import REDZONE, Checked, OutOfBounds, launch_checked
from .runner import ORDER_ENV, ORDERS, Library, launch, library, parse_order

__all__ = ["ORDERS", "ORDER_ENV", "REDZONE", "Checked", "Library", "OutOfBounds", "build",
           "cache_dir", "cpp_source_of", "launch", "launch_checked", "library", "parse_order",
           "require", "unavailable"]
