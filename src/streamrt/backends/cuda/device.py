"""One GPU of the cuda backend: memory, graph memory, the address ranges of both, and kernels.

State and invariants:
- ``_allocs``: every live ``cudaMalloc`` of the device, ``ptr -> size``. ``_ranges``: every
  allocation of the device that has memory behind it (``cudaMalloc``, pool blocks, mapped graph
  memory); ``_reserved``: graph memory's address ranges, mapped or not. Copies and fills are
  checked against ``_ranges`` (and the backend's pinned host ranges, and other GPUs' for a peer
  copy) before CUDA sees the pointer. :meth:`CudaDevice.range_of` reads ``_ranges``,
  ``_reserved``, then pinned memory: a hit in ``_reserved`` alone is unmapped graph memory.
  :data:`opened`: every device opened, for peer copies and the backend's ``range_of``.
- Pools: :class:`.CudaPools` (``pools``), whose blocks are in ``_ranges`` too, as is foreign
  memory a DLPack import registered (``_external``: base -> imports holding it).
- Graph memory is CUDA's virtual memory management: an address range is reserved when a
  MEM_ALLOC node is made and memory is mapped there per exec (what CUDA's own graph memory is
  built on).
- Kernels: compiled by NVRTC for the device's architecture once per process (and on disk; PTX
  for the newest architecture NVRTC knows when it does not know the GPU's), loaded per device
  with ``cuModuleLoadData`` (``_functions``: kernel -> loaded function and argument packer).
  Kernels see device memory only through their CUDA body: no views (nothing in base's ``LAST_VIEWS``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sortedcontainers import SortedDict

from ...errors import InvalidAddressError, NotSupportedError, OutOfMemoryError
from ...reclaim import Reclaim
from ..base import DeviceImpl, Flat, Mark, MemRange, NodeOp
from . import hostfn, nvrtc
from .errors import check, error_for
from .graph import NativeGraph
from .mark import CudaMark
from .pools import CudaPools
from .queue import CudaQueue
from .runtime import activate, drv, rt, too_big

if TYPE_CHECKING:
    from ...graph.node import Node


_SMEM_DEFAULT = 48 << 10  # dynamic shared memory any function may take without opting in


class CudaDevice(DeviceImpl):
    """Device ``cuda:N``: memory through ``cudaMalloc``, pools through ``cudaMemPool``."""

    pools: CudaPools
    runner_per_stream = False  # one cudaGraphExec_t per device, launched on any of its streams
    # the graph of an exec is built on the launching device, its kernels loaded there
    graph_spans_devices = False
    graph_conditionals_native = True  # native conditional nodes (conditional.py)

    def __init__(self, index: int, pinned: Ranges) -> None:
        self.index = index
        self._pinned = pinned  # the backend's pinned host allocations (copy endpoints too)
        activate(index)
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
        self._ranges = Ranges(index)  # every live allocation, pools too
        self._reserved = Ranges(index, mapped=False)  # graph memory's address ranges
        # finalizers' releases (graph address ranges, a conditional handle's value): never a CUDA
        # call on the driver's trampoline thread (refused there) or on the host-function worker
        # (a device-synchronizing cudaFree there waits for the host function it runs in)
        self.reclaim = self._reclaim
        self.pools = CudaPools(self, self._ranges)
        self._functions: dict[Any, tuple] = {}
        self._smem_opted: dict[int, int] = {}  # CUfunction -> the dynamic shared memory it may take
        self._external: dict[int, int] = {}  # imported foreign memory: base -> imports holding it
        self._ext_lock = threading.Lock()  # guards _external (lock order: before _ranges')
        self._ext_reclaim = Reclaim(self._ext_lock)
        self._lock = threading.Lock()
        opened[index] = self

    def _reclaim(self, fn: Callable[..., Any], *args: Any) -> None:
        if hostfn.on_worker() or hostfn.on_driver_thread():
            hostfn.deferred.append((self._reserved.reclaim, (fn, *args)))
        else:
            self._reserved.reclaim(fn, *args)

    def malloc(self, nbytes: int) -> int:
        too_big(nbytes, f"cuda:{self.index}: cudaMalloc")
        activate(self.index)
        try:
            ptr = int(check(rt.cudaMalloc(max(nbytes, 1))))
        except OutOfMemoryError as exc:
            free, total = self.memory_info()
            raise OutOfMemoryError(f"cuda:{self.index}: cudaMalloc of {nbytes} bytes failed: "
                                   f"{free} of {total} bytes free") from exc
        self._allocs[ptr] = nbytes
        self._ranges.add(ptr, nbytes, "malloc")
        return ptr

    def free(self, ptr: int) -> None:
        if ptr not in self._allocs:
            raise InvalidAddressError(
                f"free of {hex(ptr)}: not the start of a live allocation on cuda:{self.index}")
        activate(self.index)
        check(rt.cudaFree(ptr))
        del self._allocs[ptr]
        self._ranges.drop(ptr)

    def used(self) -> int:
        free, total = self.memory_info()
        return total - free

    def memory_info(self) -> tuple[int, int]:
        activate(self.index)
        free, total = check(rt.cudaMemGetInfo())
        return int(free), int(total)

    def owns(self, ptr: int) -> bool:
        return ptr in self._allocs

    def range_of(self, ptr: int) -> MemRange | None:
        return self._ranges.find(ptr) or self._reserved.find(ptr) or self._pinned.find(ptr)

    def ranges(self) -> list[MemRange]:
        """Every live allocation of the device: memory, pool blocks, graph memory (mapped or not)."""
        live = self._ranges.all()
        mapped = {r.base for r in live}
        return live + [r for r in self._reserved.all() if r.base not in mapped]

    def free_all(self) -> None:
        """Device reset: the pools' memory first (:meth:`.CudaPools.reset`), then every
        ``cudaMalloc`` (the frontend synchronized the device)."""
        self.pools.reset()
        for ptr in list(self._allocs):
            self.free(ptr)

    def device_of(self, ptr: int) -> int:
        if self._ranges.room(ptr) is not None or self._reserved.room(ptr) is not None:
            return self.index  # the common case first: this device's memory
        for other in tuple(opened.values()):  # unified addressing: another GPU's
            if other is not self and (other._ranges.room(ptr) is not None
                                      or other._reserved.room(ptr) is not None):
                return other.index
        return -1  # pinned host memory, or none of streamrt's

    # -- peer access: cudaDeviceCanAccessPeer / cudaDeviceEnablePeerAccess (from this device) -----
    def can_access_peer(self, peer: Any) -> bool:
        return isinstance(peer, CudaDevice) and bool(
            check(rt.cudaDeviceCanAccessPeer(self.index, peer.index)))

    def enable_peer_access(self, peer: Any) -> None:
        activate(self.index)  # the access is the current device's
        check(rt.cudaDeviceEnablePeerAccess(peer.index, 0))

    def disable_peer_access(self, peer: Any) -> None:
        activate(self.index)
        check(rt.cudaDeviceDisablePeerAccess(peer.index))

    def create_queue(self, name: str, *, priority: int = 0, non_blocking: bool = False,
                     legacy: bool = False) -> CudaQueue:
        return CudaQueue(self, name, priority, non_blocking, legacy)

    def wrap_queue(self, name: str, handle: int) -> tuple[CudaQueue, bool, int]:
        """A queue over a foreign ``cudaStream_t`` of this device, not owned by it; its flags and
        priority read from CUDA (``cudaStreamGetFlags``, ``cudaStreamGetPriority``)."""
        activate(self.index)
        stream = rt.cudaStream_t(handle)
        flags = int(check(rt.cudaStreamGetFlags(stream)))
        priority = int(check(rt.cudaStreamGetPriority(stream)))
        non_blocking = bool(flags & rt.cudaStreamNonBlocking)
        return (CudaQueue(self, name, priority, non_blocking, False, external=handle),
                non_blocking, priority)

    def register_device(self, ptr: int, nbytes: int) -> bool:
        """Foreign device memory (a DLPack import) becomes an endpoint: an "external" range,
        counted per base so that two imports of one buffer each keep it."""
        try:
            with self._ext_lock:
                count = self._external.get(ptr)
                if count is None:
                    room = self._ranges.room(ptr)
                    if room is not None and room >= max(nbytes, 1):
                        return False  # inside a live allocation (streamrt's own memory)
                    self._ranges.add(ptr, nbytes, "external")
                self._external[ptr] = (count or 0) + 1
            return True
        finally:
            self._ext_reclaim.drain()

    def unregister_device(self, ptr: int) -> None:
        """Called from a finalizer (through :attr:`reclaim`): deferred while ``_ext_lock`` is
        held, and the range's drop while the ranges' lock is."""
        self._ext_reclaim(self._unregister, ptr)

    def _unregister(self, ptr: int) -> None:
        with self._ext_lock:
            count = self._external.pop(ptr, 0) - 1
            if count > 0:
                self._external[ptr] = count
            else:
                self._ranges.reclaim(self._ranges.drop, ptr)

    def endpoint(self, ptr: int, nbytes: int) -> int:
        # unified addressing: a copy may read or write another GPU's memory (a peer copy)
        room = self._ranges.room(ptr) or self._pinned.room(ptr)
        for other in () if room is not None else opened.values():
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
        types = nvrtc.parse_signature(kernel.signature)
        if self._target is None:
            self._target = nvrtc.target_for(*self._cc)
        image = nvrtc.compile_module(kernel.cuda_source, kernel.name, self._target, kernel.options)
        with self._lock:
            activate(self.index)
            module = check(drv.cuModuleLoadData(image))
            err, fn = drv.cuModuleGetFunction(module, kernel.name.encode())
            if err != 0:  # CUDA_ERROR_NOT_FOUND: the source names its kernel otherwise
                raise error_for(err, f"kernel {kernel.name!r}: its CUDA source has no "
                                f'extern "C" __global__ function of that name')
            hit = self._functions[kernel] = (fn, nvrtc.packer(types))
        return hit

    def opt_in_shared(self, fn: Any, nbytes: int) -> int:
        """``nbytes`` of dynamic shared memory for launches of ``fn``: past the 48 KiB every
        function may take, ``fn`` is opted in first (``cuFuncSetAttribute`` of
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, as a CUDA program must); more than this
        GPU gives is refused (InvalidValueError)."""
        if nbytes <= _SMEM_DEFAULT or self._smem_opted.get(int(fn), 0) >= nbytes:
            return nbytes
        with self._lock:
            activate(self.index)
            attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            err, = drv.cuFuncSetAttribute(fn, attr, nbytes)
            if err != 0:
                raise error_for(err, f"{nbytes} bytes of dynamic shared memory: more than "
                                     f"{self.model} gives a block")
            self._smem_opted[int(fn)] = nbytes
        return nbytes

    def graph_runner(self, flat: Flat, op_of: Callable[[int, Node], NodeOp],
                     marks: dict[int, Mark] | None = None, *,
                     use_node_priority: bool = False) -> NativeGraph:
        """Build and instantiate the CUDA graph of a flattened frontend graph (from its nodes:
        ``op_of`` is not used)."""
        return NativeGraph(self, flat, marks or {},  # type: ignore[arg-type]
                           use_node_priority=use_node_priority)

    def graph_mark(self, name: str) -> CudaMark:
        return CudaMark(self, name)

    def graph_node_check(self) -> Callable[[Node], str | None]:
        """A kernel node needs a CUDA body (what ``function`` loads) to be a CUDA kernel node."""
        return _cuda_body_missing

    # -- CUDA's own graph allocator (cudaGraphAddMemAllocNode's): none of the frontend's graph
    # memory, which is mapped with the VMM calls below, but counted in the device's attributes
    def graph_mem_native(self) -> tuple[int, int, int, int]:
        """``cudaDeviceGetGraphMemAttribute`` of the four attributes, in their enum's order."""
        activate(self.index)
        used, used_high, reserved, reserved_high = (
            int(check(rt.cudaDeviceGetGraphMemAttribute(self.index, attr))) for attr in _GRAPH_MEM_ATTRS)
        return used, used_high, reserved, reserved_high

    def graph_mem_reset_high(self) -> None:
        """``cudaDeviceSetGraphMemAttribute`` of both highs to 0 (which resets them to current)."""
        activate(self.index)
        for attr in _GRAPH_MEM_ATTRS[1::2]:
            check(rt.cudaDeviceSetGraphMemAttribute(self.index, attr, drv.cuuint64_t(0)))

    def graph_mem_trim(self) -> None:
        """``cudaDeviceGraphMemTrim``."""
        activate(self.index)
        check(rt.cudaDeviceGraphMemTrim(self.index))

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
        activate(self.index)
        ptr = int(check(drv.cuMemAddressReserve(nbytes, 0, 0, 0)))
        self._reserved.add(ptr, nbytes, "graph")
        return ptr

    def graph_release(self, ptr: int, nbytes: int) -> None:
        """``cuMemAddressFree`` (from a finalizer: deferred when on the driver's thread)."""
        self._reserved.drop(ptr)
        hostfn.release(lambda: check(drv.cuMemAddressFree(ptr, nbytes)))

    def graph_map(self, ranges: list[tuple[int, int, int]], nbytes: int) -> Any:
        """``cuMemCreate`` one physical allocation, ``cuMemMap`` each range at its offset and make
        it readable and writable by this device (``cuMemSetAccess``)."""
        activate(self.index)
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
                self._ranges.add(ptr, size, "graph")
        except BaseException:
            self.graph_unmap(mapped, handle)
            raise
        return handle

    def graph_unmap(self, ranges: list[tuple[int, int, int]], handle: Any) -> None:
        """``cuMemUnmap`` each range, then ``cuMemRelease`` the physical allocation."""
        activate(self.index)
        for ptr, _off, size in ranges:
            self._ranges.drop(ptr)
            check(drv.cuMemUnmap(ptr, size))
        check(drv.cuMemRelease(handle))


opened: dict[int, CudaDevice] = {}  # every opened device, for peer copies

_GRAPH_MEM_ATTRS = (  # cudaGraphMemAttributeType: used current, used high, reserved current, high
    rt.cudaGraphMemAttributeType.cudaGraphMemAttrUsedMemCurrent,
    rt.cudaGraphMemAttributeType.cudaGraphMemAttrUsedMemHigh,
    rt.cudaGraphMemAttributeType.cudaGraphMemAttrReservedMemCurrent,
    rt.cudaGraphMemAttributeType.cudaGraphMemAttrReservedMemHigh,
)


def _cuda_body_missing(node: Node) -> str | None:
    """Why a kernel node cannot be a CUDA kernel node (None: it can)."""
    k = node._params["kernel"]
    if k.cuda_source and k.signature is not None:
        return None
    return (f"kernel {k.name!r} has no CUDA body: declare it with @srt.kernel(cuda=SOURCE, "
            "signature='ptr, i32, ...') to run it in a graph on cuda")


class Ranges:
    """Live address ranges of one device (-1: pinned host memory), ``base -> (size, kind)``
    (kinds as :class:`~..base.MemRange`'s; ``mapped``: whether memory is behind them), safe from
    any thread: a SortedDict is pure Python, so two threads updating it at once, or a finalizer
    that the garbage collector runs inside an update, could corrupt it (finalizers' releases go
    through :attr:`reclaim`). A range of 0 bytes holds its base, as CUDA allocates one byte."""

    __slots__ = ("_lock", "_map", "device", "mapped", "reclaim")

    def __init__(self, device: int, *, mapped: bool = True) -> None:
        self.device = device
        self.mapped = mapped
        self._lock = threading.Lock()
        self._map: SortedDict = SortedDict()
        self.reclaim = Reclaim(self._lock)

    def add(self, ptr: int, nbytes: int, kind: str) -> None:
        with self._lock:
            self._map[ptr] = (max(nbytes, 1), kind)
        self.reclaim.drain()

    def drop(self, ptr: int) -> None:
        with self._lock:
            self._map.pop(ptr, None)
        self.reclaim.drain()

    def __contains__(self, ptr: int) -> bool:
        return ptr in self._map

    def _hit(self, ptr: int) -> tuple[int, tuple[int, str]] | None:
        with self._lock:
            i = self._map.bisect_right(ptr) - 1
            if i < 0:
                return None
            hit = self._map.peekitem(i)
        return hit if ptr < hit[0] + hit[1][0] else None

    def find(self, ptr: int) -> MemRange | None:
        """The range holding ``ptr``, or None."""
        hit = self._hit(ptr)
        if hit is None:
            return None
        base, (size, kind) = hit
        return MemRange(base, size, self.device, kind, self.mapped)

    def all(self) -> list[MemRange]:
        """Every range, in address order."""
        with self._lock:
            items = list(self._map.items())
        return [MemRange(base, size, self.device, kind, self.mapped) for base, (size, kind) in items]

    def room(self, ptr: int) -> int | None:
        """Bytes from ``ptr`` to the end of the range holding it, or None."""
        hit = self._hit(ptr)
        return None if hit is None else hit[0] + hit[1][0] - ptr
