"""Device and pinned host memory (real host memory), copies and fills in stream order.

Device memory is host memory at real host addresses, so kernels (run on the CPU) and numpy can
use it. Tables of live regions say what an address is: device memory (``cudaMalloc``, pool
reservations, VMM mappings), pinned host memory (``cudaMallocHost``), or neither, which is taken
for *pageable* host memory (an address that is neither cannot be told from host memory here).

Copies follow ``cudaMemcpyAsync``'s documented host synchronisation:
- pageable -> device: the source is staged at the call (the caller may reuse it on return);
- device -> pageable: the call returns once the copy has completed (it waits for the stream);
- host -> host (pageable or pinned): fully synchronous, in stream order;
- everything else (device and pinned endpoints): asynchronous, in stream order.
New device and pinned memory is filled with 0xFF bytes (NaN as floats, -1 as ints): CUDA does
not clear it, so code that reads memory it never wrote shows. Freed memory is never handed out
again and made inaccessible: a copy or fill touching it fails (cudaErrorInvalidValue) and a
kernel touching it crashes the process (on a GPU: an illegal address), instead of silently
corrupting other memory.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from typing import Any

from sortedcontainers import SortedDict

from . import capture, state, streams
from .binding import runtime
from .state import LOCK, SUCCESS, E

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]
libc.mmap.restype = ctypes.c_void_p
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.munmap.restype = ctypes.c_int
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.mprotect.restype = ctypes.c_int
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.madvise.restype = ctypes.c_int

PROT_NONE, PROT_RW = 0, 3
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS, MAP_NORESERVE = 0x01, 0x02, 0x10, 0x20, 0x4000
MADV_DONTNEED = 4
MAP_FAILED = ctypes.c_void_p(-1).value
PAGE = os.sysconf("SC_PAGE_SIZE")

ALIGN = 512  # cudaMalloc returns at least 256-byte aligned pointers (these are page aligned)
FILL = 0xFF
PAGEABLE_STAGED = 64 << 10  # pageable host-to-device copies up to this size return at once


def mmap(addr: int, size: int, prot: int, flags: int, fd: int = -1, offset: int = 0) -> int:
    p = libc.mmap(addr or None, size, prot, flags, fd, offset)
    if p in (None, MAP_FAILED):
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return p


@dataclass(eq=False)
class Region:
    """A live range of device or pinned memory."""

    base: int
    size: int
    kind: str  # "malloc", "pool" (a pool's reservation), "vmm" (a mapping), "pinned"
    device: int  # -1 for pinned host memory
    owner: Any = None  # the pool block or VMM mapping behind it
    accessible: bool = True  # VMM: cuMemSetAccess done

    @property
    def end(self) -> int:
        return self.base + self.size


DEVICE_MEM: SortedDict = SortedDict()  # base -> Region (device memory of every device)
PINNED: SortedDict = SortedDict()  # base -> Region


def _find(table: SortedDict, ptr: int) -> Region | None:
    i = table.bisect_right(ptr) - 1
    if i < 0:
        return None
    r = table.peekitem(i)[1]
    return r if ptr < r.base + max(r.size, 1) else None


def find(ptr: int) -> Region | None:
    """The device or pinned region holding ``ptr``."""
    return _find(DEVICE_MEM, ptr) or _find(PINNED, ptr)


class BadRange(Exception):
    """An access that starts inside a region and runs past its end (or into an unmapped range)."""


def classify(ptr: int, nbytes: int) -> tuple[str, Region | None]:
    """("device" | "pinned" | "pageable", region) of ``[ptr, ptr + nbytes)``."""
    r = find(ptr)
    if r is None:
        if was_freed(ptr) or was_freed(ptr + max(nbytes, 1) - 1):
            raise BadRange(f"{ptr:#x}+{nbytes} touches freed device or pinned memory")
        return "pageable", None
    if ptr + nbytes > r.end or not r.accessible:
        raise BadRange(f"{ptr:#x}+{nbytes} runs past {r.kind} region {r.base:#x}+{r.size}")
    return ("pinned" if r.kind == "pinned" else "device"), r


def host_alloc(nbytes: int) -> int:
    """``nbytes`` (> 0) of fresh page-aligned memory, filled with FILL; 0 when out of memory."""
    size = -(-nbytes // PAGE) * PAGE
    try:
        p = mmap(0, size, PROT_RW, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)
    except OSError:
        return 0
    ctypes.memset(p, FILL, nbytes)
    return p


# freed ranges: never mapped again, inaccessible (a stray access faults loudly instead of
# corrupting whatever the host would put there next); base -> size
FREED: SortedDict = SortedDict()


def host_free(ptr: int, nbytes: int) -> None:
    size = -(-nbytes // PAGE) * PAGE
    libc.madvise(ptr, size, MADV_DONTNEED)
    libc.mprotect(ptr, size, PROT_NONE)
    FREED[ptr] = size


def was_freed(ptr: int) -> bool:
    i = FREED.bisect_right(ptr) - 1
    if i < 0:
        return False
    base, size = FREED.peekitem(i)
    return ptr < base + size


def rounded(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def capacity() -> int:
    """Bytes of memory per device: ``STREAMRT_CUDA_FAKE_MEMORY`` (default 1 GiB)."""
    return int(os.environ.get("STREAMRT_CUDA_FAKE_MEMORY", state.GiB))


def free_bytes(device: int) -> int:
    return max(capacity() - streams.DEVICES[device].used, 0)


def address(x: Any) -> int:
    """A pointer argument (int, ``CUdeviceptr``, buffer object) as an address."""
    if x is None:
        return 0
    try:
        return int(x)
    except TypeError:
        import numpy as np

        return int(np.frombuffer(x, np.uint8).ctypes.data)


# -- allocation ------------------------------------------------------------------------------------
@runtime("cudaMalloc")
def cudaMalloc(size: int) -> tuple:
    size = int(size)
    unsafe = capture.unsafe_call()
    if unsafe is not None:
        return (unsafe, None)
    if size == 0:
        return (SUCCESS, 0)
    with LOCK:
        d = state.current_device()
        if rounded(size) > free_bytes(d):
            return (E.cudaErrorMemoryAllocation, None)
        ptr = host_alloc(size)
        if not ptr:
            return (E.cudaErrorMemoryAllocation, None)
        DEVICE_MEM[ptr] = Region(ptr, size, "malloc", d)
        streams.DEVICES[d].used += rounded(size)
    return (SUCCESS, ptr)


@runtime("cudaFree")
def cudaFree(ptr: Any) -> tuple:
    p = address(ptr)
    unsafe = capture.unsafe_call()
    if unsafe is not None:
        return (unsafe,)
    if p == 0:
        return (SUCCESS,)  # cudaFree(NULL): nothing (initialises the context)
    with LOCK:
        r = DEVICE_MEM.get(p)
        if r is None or r.kind != "malloc":
            return (E.cudaErrorInvalidValue,)
    # cudaFree synchronizes the device, except on a stream's worker (the fake's GPU: only a
    # finalizer the garbage collector ran there calls CUDA on it, a conditional handle's value
    # say), where that would wait for the worker itself: memory a finalizer frees is in no
    # pending work's use
    if not threading.current_thread().name.startswith("fake-cuda:"):
        streams.synchronize_device(r.device)
    with LOCK:
        if DEVICE_MEM.get(p) is not r:
            return (E.cudaErrorInvalidValue,)  # freed meanwhile by another thread
        del DEVICE_MEM[p]
        streams.DEVICES[r.device].used -= rounded(r.size)
        host_free(p, r.size)
    return (SUCCESS,)


@runtime("cudaMallocHost")
def cudaMallocHost(size: int) -> tuple:
    size = int(size)
    if size == 0:
        return (SUCCESS, 0)
    if size > 64 * state.GiB:
        return (E.cudaErrorMemoryAllocation, None)
    with LOCK:
        ptr = host_alloc(size)
        if not ptr:
            return (E.cudaErrorMemoryAllocation, None)
        PINNED[ptr] = Region(ptr, size, "pinned", -1)
    return (SUCCESS, ptr)


@runtime("cudaFreeHost")
def cudaFreeHost(ptr: Any) -> tuple:
    p = address(ptr)
    if p == 0:
        return (SUCCESS,)
    with LOCK:
        if p not in PINNED:
            return (E.cudaErrorInvalidValue,)
    for d in range(len(streams.DEVICES)):  # as cudaFree, it synchronizes
        streams.synchronize_device(d)
    with LOCK:
        r = PINNED.pop(p, None)
        if r is None:
            return (E.cudaErrorInvalidValue,)
        host_free(p, r.size)
    return (SUCCESS,)


@runtime("cudaMemGetInfo")
def cudaMemGetInfo() -> tuple:
    with LOCK:
        d = state.current_device()
        return (SUCCESS, free_bytes(d), capacity())


# -- copies and fills ------------------------------------------------------------------------------
def _memmove(dst: int, src: int, n: int) -> None:
    ctypes.memmove(dst, src, n)


@runtime("cudaMemcpyAsync")
def cudaMemcpyAsync(dst: Any, src: Any, count: int, kind: Any, stream: Any) -> tuple:
    d, s_, n = address(dst), address(src), int(count)
    if int(kind) not in (0, 1, 2, 3, 4):
        return (E.cudaErrorInvalidMemcpyDirection,)
    with LOCK:
        s = streams.resolve(stream)
        if s is None:
            return (E.cudaErrorInvalidResourceHandle,)
        if n == 0:
            return (SUCCESS,)
        try:
            dkind, _ = classify(d, n)
            skind, _ = classify(s_, n)
        except BadRange:
            return (E.cudaErrorInvalidValue,)
        # captured: a memcpy node, reading and writing when it runs (pageable memory too)
        res = capture.intercept(s, "memcpy", lambda: _memmove(d, s_, n))
        if res is not None:
            return (res,)
        if skind == "pageable" and dkind == "device":
            staged = ctypes.create_string_buffer(ctypes.string_at(s_, n), n)  # taken now
            seq = s.enqueue(lambda: _memmove(d, ctypes.addressof(staged), n), "memcpy from pageable")
            # a small copy is staged whole; a larger one goes through the driver's pinned staging
            # buffers chunk by chunk, each reused once the stream copied it: the call returns
            # about when the stream reaches the copy ("might be synchronous", API sync behavior)
            wait = n > PAGEABLE_STAGED
        else:
            seq = s.enqueue(lambda: _memmove(d, s_, n), f"memcpy {skind}->{dkind}")
            wait = dkind != "device" and (skind != "device" or dkind == "pageable")
    if wait:  # to pageable memory, or host to host: returns once the copy is done
        streams.wait_done(s, seq)
    return (SUCCESS,)


@runtime("cudaMemsetAsync")
def cudaMemsetAsync(ptr: Any, value: int, count: int, stream: Any) -> tuple:
    p, n, v = address(ptr), int(count), int(value) & 0xFF
    with LOCK:
        s = streams.resolve(stream)
        if s is None:
            return (E.cudaErrorInvalidResourceHandle,)
        if n == 0:
            return (SUCCESS,)
        try:
            k, _ = classify(p, n)
        except BadRange:
            return (E.cudaErrorInvalidValue,)
        if k == "pageable":
            return (E.cudaErrorInvalidValue,)
        res = capture.intercept(s, "memset", lambda: ctypes.memset(p, v, n))
        if res is not None:
            return (res,)
        s.enqueue(lambda: ctypes.memset(p, v, n), "memset")
    return (SUCCESS,)
