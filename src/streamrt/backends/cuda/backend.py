"""The cuda backend: the CUDA runtime through NVIDIA's ``cuda-bindings``, one call per primitive.

State and invariants:
- A :class:`CudaQueue` wraps one ``cudaStream_t`` (the legacy default stream for a device's
  default stream). Its ``op_*`` pairs are the enqueue calls themselves, so ``submit`` runs them
  at once on the calling thread; ``pos`` counts them in step with the frontend's ``Stream._pos``.
- Positions a host may wait for later are marked with a CUDA event when the frontend records
  an event (``mark``); ``done`` is the newest marked position whose event has completed, or
  ``pos`` once the whole stream is idle. Waiting for an unmarked position waits for the next
  marked one (or the whole stream): never too little.
- Host functions: run by :mod:`.cuda_hostfn` on a Python thread, never on the driver's.
- Kernels: compiled by NVRTC for the device's architecture once per process (and on disk; PTX
  for the newest architecture NVRTC knows when it does not know the GPU's), loaded per device
  with ``cuModuleLoadData``, launched with ``cuLaunchKernel``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from sortedcontainers import SortedDict

from ...errors import (
    BackendUnavailableError,
    InvalidAddressError,
    NotPermittedError,
    NotReadyError,
    NotSupportedError,
    OutOfMemoryError,
)
from ...instrument import fn_label
from ...reclaim import Reclaim
from ..base import Backend, DeviceImpl, Queue

try:  # imported only when the cuda backend is asked for (backends/__init__.py)
    from cuda.bindings import driver as drv
    from cuda.bindings import runtime as rt
except ImportError as exc:  # pragma: no cover - the registry reports this as unavailable
    raise BackendUnavailableError(
        "the cuda backend needs the 'cuda-bindings' package (pip install 'streamrt[cuda]')"
    ) from exc

from . import hostfn
from .errors import check, error_for

_SUCCESS = rt.cudaError_t.cudaSuccess
_NOT_READY = rt.cudaError_t.cudaErrorNotReady
_tls = threading.local()  # the CUDA device current on this thread, to skip cudaSetDevice


def _activate(index: int) -> None:
    if getattr(_tls, "device", None) != index:
        check(rt.cudaSetDevice(index))
        _tls.device = index


_SIZE_MAX = (1 << 64) - 1  # size_t / cuuint64_t: larger Python ints raise OverflowError


def _too_big(nbytes: int, what: str) -> None:
    """No allocation of more than SIZE_MAX bytes can succeed: OutOfMemoryError, as on cpu."""
    if nbytes > _SIZE_MAX:
        raise OutOfMemoryError(f"{what} of {nbytes} bytes: more than any device can hold")


def _host_ptr(buf: Any) -> int:
    """Address of a host ``uint8`` view (the frontend validated it)."""
    return int(buf.ctypes.data) if isinstance(buf, np.ndarray) else int(buf)


_OLD_DRIVER = rt.cudaError_t.cudaErrorInsufficientDriver


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def why_unusable(err: Any, driver: int, runtime: int) -> str:
    """What is missing, in words, when ``cudaGetDeviceCount`` finds no usable GPU (``driver``:
    the CUDA version the driver supports, 0 when there is none; ``runtime``: cuda-bindings')."""
    if err == _SUCCESS:
        return "the NVIDIA driver found no GPU"
    name = rt.cudaGetErrorName(err)[1].decode()
    if err == _OLD_DRIVER and driver:
        return (f"{name}: the NVIDIA driver supports CUDA {_cuda_version(driver)}, older than the "
                f"CUDA {_cuda_version(runtime)} of the installed cuda-bindings; update the driver "
                "or install the bindings for it (pip install 'streamrt[cuda12]' for CUDA 12)")
    return f"{name} (cuda-bindings is installed; an NVIDIA driver and a GPU are also needed)"


class _Stamp:
    """A timing event (``cudaEventCreate``), destroyed with its last reference."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = check(rt.cudaEventCreate())

    def __del__(self) -> None:
        try:  # a pending event is released by CUDA once it completes
            hostfn.release(rt.cudaEventDestroy, self.event)
        except Exception:  # noqa: S110 - at interpreter exit the bindings may be gone
            pass


# -- queues ----------------------------------------------------------------------------------
class CudaQueue(Queue):
    """One CUDA stream: enqueue calls run at once; completion is read from CUDA events."""

    inline = False

    def __init__(self, dev: CudaDevice, name: str, priority: int, non_blocking: bool,
                 legacy: bool) -> None:
        self.name = name
        self.dev = dev
        self._index = dev.index
        self._functions = dev._functions  # loaded kernels: read on every launch
        self.pos = 0
        self._done = 0
        self._enqueuing = 0  # submits between counting an operation and handing it to CUDA
        self._markers: deque[tuple[int, Any]] = deque()
        # Any thread may ask a stream how far it got, or wait on it, and the answer frees the
        # marker events it proves passed. A thread holding a marker outside the lock pins the
        # queue; events passed meanwhile wait in _dead, so no handle is destroyed in use.
        self._lock = threading.Lock()
        self._pins = 0
        self._dead: list[Any] = []
        # graphs launched and maybe still running, with their newest position: kept alive until
        # the stream passes it (their host nodes and host buffers must outlive an exec update)
        self._graphs: dict[Any, int] = {}
        self.errors: list[tuple[int, BaseException, str]] = []
        self._legacy = legacy
        self._closed = False
        _activate(dev.index)
        if legacy:
            self.stream = rt.cudaStream_t(rt.cudaStreamLegacy)
        else:
            flags = rt.cudaStreamNonBlocking if non_blocking else rt.cudaStreamDefault
            self.stream = check(rt.cudaStreamCreateWithPriority(flags, priority))
        self._cu_stream = drv.CUstream(int(self.stream))

    # -- completion ------------------------------------------------------------------------
    @property
    def done(self) -> int:
        """Completed operations: the stream's tail once idle, else the newest completed mark."""
        if self._done >= self.pos:
            return self._done
        tail = self.pos - self._enqueuing  # before the query: later work is not proven by it
        if not self._closed:
            _activate(self.dev.index)  # the legacy stream is the current device's
        err = _NOT_READY if self._closed else rt.cudaStreamQuery(self.stream)[0]
        if err == _SUCCESS:
            self._advance(tail)
        elif err != _NOT_READY:
            check((err,))
        else:
            with self._pinned():
                with self._lock:
                    markers = list(self._markers)
                for p, ev in reversed(markers):
                    if p <= self._done:
                        break
                    if rt.cudaEventQuery(ev)[0] == _SUCCESS:
                        self._advance(p)
                        break
        return self._done

    def _advance(self, p: int) -> None:
        with self._lock:
            if p > self._done:
                self._done = p
            while self._markers and self._markers[0][0] <= self._done:
                self._dead.append(self._markers.popleft()[1])
            dead, self._dead = (self._dead, []) if not self._pins else ([], self._dead)
            if self._graphs:
                self._graphs = {g: q for g, q in self._graphs.items() if q > self._done}
        for ev in dead:
            rt.cudaEventDestroy(ev)

    @contextmanager
    def _pinned(self) -> Iterator[None]:
        """Keep the marker events this thread reads alive until it is done with them."""
        with self._lock:
            self._pins += 1
        try:
            yield
        finally:
            with self._lock:
                self._pins -= 1
                dead, self._dead = (self._dead, []) if not self._pins else ([], self._dead)
            for ev in dead:
                rt.cudaEventDestroy(ev)

    def _event_at(self, pos: int) -> Any | None:
        """The marker event of the first marked position >= ``pos`` (None: the tail); call it
        pinned."""
        with self._lock:
            for p, ev in self._markers:
                if p >= pos:
                    return ev
        return None

    def mark(self) -> tuple[int, Any]:
        """Record a marker event at the tail: a host or another stream may wait for it later.
        Returns its position and event; operations other threads are still handing to CUDA
        come after it."""
        _activate(self.dev.index)
        ev = check(rt.cudaEventCreateWithFlags(rt.cudaEventDisableTiming))
        with self._lock:
            pos = self.pos - self._enqueuing  # before the record: it covers no less than this
        check(rt.cudaEventRecord(ev, self.stream))
        with self._lock:
            self._markers.append((pos, ev))
        return pos, ev

    def wait_done(self, pos: int) -> None:
        if self._done >= pos:
            return
        if hostfn.on_worker():  # a host function: every one runs there
            if self.done >= pos:  # finished work nobody had queried yet: no wait needed
                return
            raise NotPermittedError(
                f"{self.name}: a host function waited for stream work; the work may be waiting "
                "for this very host function (or one behind it, run by the same thread). Host "
                "functions must not synchronize: CUDA forbids API calls in them")
        if hostfn.deferred:
            hostfn.run_deferred()
        with self._pinned():
            ev = self._event_at(pos) if pos < self.pos or self._closed else None
            if ev is None:
                if self._closed:
                    return  # nothing was pending when it closed
                if hostfn.outstanding[0]:  # to be polled: an event, so that a synchronize ends it
                    pos, ev = self.mark()
                else:
                    stream, tail = self.stream, self.pos - self._enqueuing  # later work: not covered
                    _activate(self.dev.index)  # the legacy stream is the current device's
                    check(rt.cudaStreamSynchronize(stream))
                    self._advance(tail)
                    return
            hostfn.block(lambda: rt.cudaEventQuery(ev), lambda: rt.cudaEventSynchronize(ev),
                         settle=True)
            self._advance(pos)

    def drain(self) -> None:
        self.wait_done(self.pos)  # enqueue calls ran at once: the queue counts them

    def submit(self, fn: Callable[..., Any], args: tuple) -> None:
        if hostfn.deferred:
            hostfn.run_deferred()
        self._enqueuing += 1  # counted in ``pos`` before CUDA has it: no query may prove it yet
        self.pos += 1
        try:
            fn(*args)
        finally:
            self._enqueuing -= 1

    def close(self) -> None:
        if hostfn.on_driver_thread():  # the stream's finalizer, run in the trampoline
            hostfn.release(self.close)  # deferred
            return
        if self._legacy or self._closed:
            return
        if self.pos > self._done:
            self.mark()  # the handle dies now; a later synchronize waits on this event
        self._closed = True
        rt.cudaStreamDestroy(self.stream)  # work already enqueued still completes

    # -- operations: each pair is the enqueue call --------------------------------------------
    def op_launch(self, kernel: Any, ctx: Any, args: tuple) -> tuple[Callable[..., Any], tuple]:
        # the eager hot path on cuda: a dict hit, one generated argument test, no attribute walk
        fn, pack = self._functions.get(kernel) or self.dev.function(kernel)
        (gx, gy, gz), (bx, by, bz) = ctx.grid, ctx.block
        return self._launch, (fn, gx, gy, gz, bx, by, bz, pack(args))

    def _launch(self, fn: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int,
                params: Any) -> None:
        if getattr(_tls, "device", None) != self._index:  # _activate's own test, inline: the
            _activate(self._index)  # eager hot path skips a call when the device is current
        err, = drv.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, 0, self._cu_stream, params, 0)
        if err != 0:
            check((err,))

    def op_copy(self, dst: Any, src: Any, nbytes: int) -> tuple[Callable[..., Any], tuple]:
        # keep host views referenced by the pair: pinned or pageable, CUDA reads them in order
        return self._copy, (dst, src, nbytes)

    def _copy(self, dst: Any, src: Any, nbytes: int) -> None:
        if hostfn.outstanding[0] and (isinstance(dst, np.ndarray) or isinstance(src, np.ndarray)):
            # a copy with pageable memory may wait for the stream inside the driver; with a
            # host function pending, that function's thread needs the GIL: wait here first,
            # polling, so the GIL is free while it runs
            stream = self.stream
            hostfn.block(lambda: rt.cudaStreamQuery(stream), lambda: rt.cudaStreamSynchronize(stream))
        _activate(self.dev.index)
        check(rt.cudaMemcpyAsync(_host_ptr(dst), _host_ptr(src), nbytes,
                                 rt.cudaMemcpyKind.cudaMemcpyDefault, self.stream))

    def op_fill(self, dst: Any, value: int, nbytes: int) -> tuple[Callable[..., Any], tuple]:
        return self._fill, (dst, value, nbytes)

    def _fill(self, dst: int, value: int, nbytes: int) -> None:
        _activate(self.dev.index)
        check(rt.cudaMemsetAsync(dst, value, nbytes, self.stream))

    def op_host(self, fn: Callable[..., Any], args: tuple) -> tuple[Callable[..., Any], tuple]:
        return self._host, (fn, args)

    def _host(self, fn: Callable[..., Any], args: tuple) -> None:
        pos = self.pos
        label = f"host function {fn_label(fn)!r}"
        job = hostfn.add(fn, args, lambda exc: self.errors.append((pos, exc, label)))
        _activate(self.dev.index)
        try:
            check(rt.cudaLaunchHostFunc(self.stream, hostfn.HOST_FN, job))
        except BaseException:
            hostfn.drop(job, counted=True)
            raise

    def op_wait(self, other: Queue, pos: int) -> tuple[Callable[..., Any], tuple]:
        return self._wait, (other, pos)

    def _wait(self, other: Queue, pos: int) -> None:
        assert isinstance(other, CudaQueue), "streams of one backend only"
        if other._done >= pos:
            return
        with other._pinned():
            ev = other._event_at(pos)  # a marked position at or after pos (an event record)
            if ev is None:  # the other stream's tail: mark it now
                ev = other.mark()[1]
            _activate(self.dev.index)
            check(rt.cudaStreamWaitEvent(self.stream, ev, 0))

    def op_graph(self, graph: Any) -> tuple[Callable[..., Any], tuple]:
        """Launching a :class:`~.cuda_graph.NativeGraph` (``cudaGraphLaunch``)."""
        return self._graph, (graph,)

    def _graph(self, graph: Any) -> None:
        graph.launch(self)
        with self._lock:  # _advance may be rebuilding the dict on another thread
            self._graphs[graph] = self.pos

    def op_stamp(self) -> tuple[Callable[..., Any], tuple, Any]:
        _activate(self.dev.index)
        st = _Stamp()
        return self._stamp, (st,), st

    def _stamp(self, st: _Stamp) -> None:
        _activate(self.dev.index)
        check(rt.cudaEventRecord(st.event, self.stream))

    def elapsed_ms(self, start: Any, end: Any) -> float:
        err, ms = rt.cudaEventElapsedTime(start.event, end.event)
        if err == _NOT_READY:
            raise NotReadyError("the event has not completed yet")
        check((err,))
        return float(ms)


# -- devices ---------------------------------------------------------------------------------
class CudaDevice(DeviceImpl):
    """Device ``cuda:N``: memory through ``cudaMalloc``, pools through ``cudaMemPool``."""

    pools: Any = True  # interim: the pool_* methods below; a NativePools object next

    def __init__(self, index: int, pinned: _Ranges) -> None:
        self.index = index
        self._pinned = pinned  # the backend's pinned host allocations (copy endpoints too)
        _activate(index)
        check(rt.cudaFree(0))  # initialise the primary context on this thread
        prop = check(rt.cudaGetDeviceProperties(index))
        self.capacity = int(prop.totalGlobalMem)
        name = prop.name
        if isinstance(name, bytes | bytearray):
            name = bytes(name).split(b"\0", 1)[0].decode(errors="replace")
        self.model = str(name)
        self.arch = f"sm_{prop.major}{prop.minor}"
        self._cc = (int(prop.major), int(prop.minor))
        self._target: str | None = None  # what NVRTC builds for this GPU, chosen at the first kernel
        self._allocs: dict[int, int] = {}
        self._ranges = _Ranges()  # every live allocation, pools too
        self._reserved = _Ranges()  # graph memory's address ranges
        self.reclaim = self._reserved.reclaim  # finalizers release graph address ranges
        self._pooled: set[int] = set()  # live pool allocations, and created pools: a reset frees them
        self._pools: dict[int, Any] = {}
        self._functions: dict[Any, tuple] = {}
        self._lock = threading.Lock()
        _opened[index] = self

    def malloc(self, nbytes: int) -> int:
        _too_big(nbytes, f"cuda:{self.index}: cudaMalloc")
        _activate(self.index)
        try:
            ptr = int(check(rt.cudaMalloc(max(nbytes, 1))))
        except OutOfMemoryError as exc:
            free, total = self.memory_info()
            raise OutOfMemoryError(f"cuda:{self.index}: cudaMalloc of {nbytes} bytes failed: "
                                   f"{free} of {total} bytes free") from exc
        self._allocs[ptr] = nbytes
        self._ranges.add(ptr, nbytes)
        return ptr

    def free(self, ptr: int) -> None:
        if ptr not in self._allocs:
            raise InvalidAddressError(
                f"free of {hex(ptr)}: not the start of a live allocation on cuda:{self.index}")
        _activate(self.index)
        check(rt.cudaFree(ptr))
        del self._allocs[ptr]
        self._ranges.drop(ptr)

    def used(self) -> int:
        free, total = self.memory_info()
        return total - free

    def memory_info(self) -> tuple[int, int]:
        _activate(self.index)
        free, total = check(rt.cudaMemGetInfo())
        return int(free), int(total)

    def owns(self, ptr: int) -> bool:
        return ptr in self._allocs

    def usable(self, ptr: int) -> int | None:
        return self._ranges.room(ptr)

    def contains(self, ptr: int, nbytes: int) -> bool:
        room = self._ranges.room(ptr) or self._reserved.room(ptr)  # graph memory, mapped or not
        return room is not None and nbytes <= room

    def free_all(self) -> None:
        """Device reset: pool allocations freed, created pools destroyed, the default pool
        trimmed, then every ``cudaMalloc`` freed (the frontend synchronized the device)."""
        _activate(self.index)
        legacy = rt.cudaStream_t(rt.cudaStreamLegacy)
        for ptr in list(self._pooled):
            check(rt.cudaFreeAsync(ptr, legacy))
            self._ranges.drop(ptr)
        self._pooled.clear()
        check(rt.cudaStreamSynchronize(legacy))
        for pool in list(self._pools.values()):
            check(rt.cudaMemPoolDestroy(pool))
        self._pools.clear()
        check(rt.cudaMemPoolTrimTo(self.pool_default(), 0))
        for ptr in list(self._allocs):
            self.free(ptr)

    def create_queue(self, name: str, *, priority: int = 0, non_blocking: bool = False,
                     legacy: bool = False) -> CudaQueue:
        return CudaQueue(self, name, priority, non_blocking, legacy)

    def endpoint(self, ptr: int, nbytes: int) -> int:
        # unified addressing: a copy may read or write another GPU's memory (a peer copy)
        room = self._ranges.room(ptr) or self._pinned.room(ptr)
        for other in () if room is not None else _opened.values():
            room = other._ranges.room(ptr)
            if room is not None:
                break
        if room is None or nbytes > room:
            raise InvalidAddressError(
                f"{hex(ptr)}+{nbytes} is not inside a live allocation of cuda:{self.index}, "
                "another GPU or pinned host memory")
        return ptr

    # -- kernels -----------------------------------------------------------------------------
    def function(self, kernel: Any) -> tuple[Any, Callable[[tuple], Any]]:
        """The loaded ``CUfunction`` of ``kernel`` on this device and its argument packer
        (:func:`~.nvrtc.packer`)."""
        hit = self._functions.get(kernel)
        if hit is not None:
            return hit
        if not kernel.cuda_source or kernel.signature is None:
            raise NotSupportedError(
                f"kernel {kernel.name!r} has no CUDA body: declare it with "
                "@srt.kernel(cuda=SOURCE, signature='ptr, i32, ...') to launch it on cuda")
        from .nvrtc import compile_module, packer, parse_signature, target_for

        types = parse_signature(kernel.signature)
        if self._target is None:
            self._target = target_for(*self._cc)
        image = compile_module(kernel.cuda_source, kernel.name, self._target)
        with self._lock:
            _activate(self.index)
            module = check(drv.cuModuleLoadData(image))
            err, fn = drv.cuModuleGetFunction(module, kernel.name.encode())
            if err != 0:  # CUDA_ERROR_NOT_FOUND: the source names its kernel otherwise
                raise error_for(err, f"kernel {kernel.name!r}: its CUDA source has no "
                                f'extern "C" __global__ function of that name')
            hit = self._functions[kernel] = (fn, packer(types))
        return hit

    def graph_exec(self, flat: list[tuple[Any, list[int]]]) -> Any:
        """Build and instantiate the CUDA graph of a flattened frontend graph."""
        from .graph import NativeGraph

        return NativeGraph(self, flat)

    # -- graph memory: virtual memory management (what CUDA's own graph memory is built on) ----
    def _vmm_prop(self) -> Any:
        prop = drv.CUmemAllocationProp()
        prop.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = self.index
        return prop

    @property
    def graph_granule(self) -> int:  # type: ignore[override]
        """The VMM allocation granularity (``cuMemGetAllocationGranularity``, typically 2 MiB)."""
        g = self.__dict__.get("_granule")
        if g is None:
            flag = drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
            g = self._granule = int(check(drv.cuMemGetAllocationGranularity(self._vmm_prop(), flag)))
        return g

    def graph_reserve(self, nbytes: int) -> int:
        """``cuMemAddressReserve``: addresses only; an exec maps memory there."""
        _activate(self.index)
        ptr = int(check(drv.cuMemAddressReserve(nbytes, 0, 0, 0)))
        self._reserved.add(ptr, nbytes)
        return ptr

    def graph_release(self, ptr: int, nbytes: int) -> None:
        """``cuMemAddressFree`` (from a finalizer: deferred when on the driver's thread)."""
        self._reserved.drop(ptr)
        hostfn.release(lambda: check(drv.cuMemAddressFree(ptr, nbytes)))

    def graph_map(self, ranges: list[tuple[int, int, int]], nbytes: int) -> Any:
        """``cuMemCreate`` one physical allocation, ``cuMemMap`` each range at its offset and make
        it readable and writable by this device (``cuMemSetAccess``)."""
        _activate(self.index)
        handle = check(drv.cuMemCreate(nbytes, self._vmm_prop(), 0))
        access = drv.CUmemAccessDesc()
        access.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = self.index
        access.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        mapped: list[tuple[int, int, int]] = []
        try:
            for ptr, off, size in ranges:
                check(drv.cuMemMap(ptr, size, off, handle, 0))
                mapped.append((ptr, off, size))
                check(drv.cuMemSetAccess(ptr, size, [access], 1))
                self._ranges.add(ptr, size)
        except BaseException:
            self.graph_unmap(mapped, handle)
            raise
        return handle

    def graph_unmap(self, ranges: list[tuple[int, int, int]], handle: Any) -> None:
        """``cuMemUnmap`` each range, then ``cuMemRelease`` the physical allocation."""
        _activate(self.index)
        for ptr, _off, size in ranges:
            self._ranges.drop(ptr)
            check(drv.cuMemUnmap(ptr, size))
        check(drv.cuMemRelease(handle))

    # -- native pools (cudaMemPool_t) --------------------------------------------------------
    def pool_default(self) -> Any:
        """The device's default pool (``cudaDeviceGetDefaultMemPool``)."""
        return check(rt.cudaDeviceGetDefaultMemPool(self.index))

    def pool_create(self, max_size: int) -> Any:
        """A new pool of pinned device memory on this device (``cudaMemPoolCreate``)."""
        props = rt.cudaMemPoolProps()
        props.allocType = rt.cudaMemAllocationType.cudaMemAllocationTypePinned
        props.location.type = rt.cudaMemLocationType.cudaMemLocationTypeDevice
        props.location.id = self.index
        # a limit at or past the device's memory is none: 0, the driver's own maximum (a larger
        # maxSize, up to SIZE_MAX, is a value the documentation never promises to accept)
        props.maxSize = max_size if max_size < self.capacity else 0
        pool = check(rt.cudaMemPoolCreate(props))
        self._pools[int(pool)] = pool
        return pool

    def pool_get(self, pool: Any, attr: int) -> int:
        """``cudaMemPoolGetAttribute`` as an int."""
        return int(check(rt.cudaMemPoolGetAttribute(pool, rt.cudaMemPoolAttr(attr))))

    def pool_set(self, pool: Any, attr: int, value: int) -> None:
        """``cudaMemPoolSetAttribute``: flags as int, sizes as ``cuuint64_t``."""
        v: Any = int(value) if attr <= 3 else drv.cuuint64_t(min(int(value), _SIZE_MAX))
        check(rt.cudaMemPoolSetAttribute(pool, rt.cudaMemPoolAttr(attr), v))

    def pool_malloc(self, pool: Any, nbytes: int, q: CudaQueue) -> int:
        """``cudaMallocFromPoolAsync`` on the queue's stream."""
        _too_big(nbytes, f"cuda:{self.index}: cudaMallocFromPoolAsync")
        if nbytes > self.capacity:  # which error the driver gives for it is undocumented
            raise OutOfMemoryError(f"cuda:{self.index}: cudaMallocFromPoolAsync of {nbytes} bytes: "
                                   f"more than the device's {self.capacity} bytes")
        _activate(self.index)
        try:
            ptr = int(check(rt.cudaMallocFromPoolAsync(max(nbytes, 1), pool, q.stream)))
        except OutOfMemoryError as exc:
            free, total = self.memory_info()
            raise OutOfMemoryError(
                f"cuda:{self.index}: cudaMallocFromPoolAsync of {nbytes} bytes failed: the pool "
                f"reserves {self.pool_get(pool, 5)} bytes ({self.pool_get(pool, 7)} in use); "
                f"{free} of {total} bytes of the device free") from exc
        self._ranges.add(ptr, nbytes)
        self._pooled.add(ptr)
        return ptr

    def pool_free(self, ptr: int, q: CudaQueue) -> None:
        """``cudaFreeAsync`` on the queue's stream."""
        _activate(self.index)
        check(rt.cudaFreeAsync(ptr, q.stream))
        self._ranges.drop(ptr)
        self._pooled.discard(ptr)

    def pool_free_now(self, ptr: int) -> None:
        """``cudaFreeAsync`` on the legacy stream, then its synchronize (``srt.free``)."""
        _activate(self.index)
        legacy = rt.cudaStream_t(rt.cudaStreamLegacy)
        check(rt.cudaFreeAsync(ptr, legacy))
        self._ranges.drop(ptr)
        self._pooled.discard(ptr)
        check(rt.cudaStreamSynchronize(legacy))

    def pool_trim(self, pool: Any, keep: int) -> None:
        """``cudaMemPoolTrimTo``."""
        check(rt.cudaMemPoolTrimTo(pool, min(keep, _SIZE_MAX)))

    def pool_destroy(self, pool: Any) -> None:
        """``cudaMemPoolDestroy``: CUDA releases the memory once its allocations are freed."""
        check(rt.cudaMemPoolDestroy(pool))
        self._pools.pop(int(pool), None)


_opened: dict[int, CudaDevice] = {}  # every opened device, for peer copies


class _Ranges:
    """Live address ranges, ``base -> size``, safe from any thread: a SortedDict is pure Python,
    so two threads updating it at once, or a finalizer that the garbage collector runs inside an
    update, could corrupt it (finalizers' releases go through :attr:`reclaim`)."""

    __slots__ = ("_lock", "_map", "reclaim")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._map: SortedDict = SortedDict()
        self.reclaim = Reclaim(self._lock)

    def add(self, ptr: int, nbytes: int) -> None:
        with self._lock:
            self._map[ptr] = nbytes
        self.reclaim.drain()

    def drop(self, ptr: int) -> None:
        with self._lock:
            self._map.pop(ptr, None)
        self.reclaim.drain()

    def __contains__(self, ptr: int) -> bool:
        return ptr in self._map

    def room(self, ptr: int) -> int | None:
        """Bytes from ``ptr`` to the end of the range holding it, or None."""
        with self._lock:
            i = self._map.bisect_right(ptr) - 1
            if i < 0:
                return None
            base, size = self._map.peekitem(i)
        end = base + max(size, 1)
        return end - ptr if ptr < end else None


class CudaBackend(Backend):
    """Every GPU the CUDA runtime sees."""

    name = "cuda"

    def __init__(self) -> None:
        err, count = rt.cudaGetDeviceCount()
        if err != _SUCCESS or count == 0:
            driver = rt.cudaDriverGetVersion()[1] if err == _OLD_DRIVER else 0
            exc = BackendUnavailableError(
                "the cuda backend cannot be used here: "
                + why_unusable(err, driver, rt.cudaRuntimeGetVersion()[1]))
            if err != _SUCCESS:  # the CUDA error itself, not the class's cudaErrorNoDevice
                exc.code, exc.name = int(err), rt.cudaGetErrorName(err)[1].decode()
            raise exc
        try:
            check(drv.cuInit(0))
        except Exception as exc:  # the driver library itself may be missing
            raise BackendUnavailableError(f"the CUDA driver could not be loaded: {exc}") from exc
        self._count = int(count)
        self._host = _Ranges()  # pinned host allocations

    def device_count(self) -> int:
        return self._count

    def open_device(self, index: int) -> CudaDevice:
        return CudaDevice(index, self._host)

    def malloc_host(self, nbytes: int) -> int:
        _too_big(nbytes, "cudaMallocHost")
        try:
            ptr = int(check(rt.cudaMallocHost(max(nbytes, 1))))
        except OutOfMemoryError as exc:
            raise OutOfMemoryError(f"cudaMallocHost of {nbytes} bytes failed") from exc
        self._host.add(ptr, nbytes)
        return ptr

    def owns_host(self, ptr: int) -> bool:
        return ptr in self._host

    def free_host(self, ptr: int) -> None:
        if ptr not in self._host:
            raise InvalidAddressError(f"free_host of {hex(ptr)}: not a live pinned host allocation")
        check(rt.cudaFreeHost(ptr))
        self._host.drop(ptr)
