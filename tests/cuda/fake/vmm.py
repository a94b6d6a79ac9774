"""Virtual memory management (``cuMem*``) with real address-space tricks.

A reservation is ``mmap(PROT_NONE, MAP_NORESERVE)``; a physical allocation is a ``memfd`` of its
size; a mapping maps the memfd ``MAP_SHARED|MAP_FIXED`` over part of a reservation, so two
virtual ranges mapped to one allocation share their bytes; an unmap puts ``PROT_NONE`` anonymous
memory back; freeing a reservation unmaps it. Sizes, offsets and addresses must be multiples of
the granularity (2 MiB), else CUDA_ERROR_INVALID_VALUE. A mapped range is device memory of its
allocation's device for copies, fills and kernels once ``cuMemSetAccess`` made it accessible
(a copy or fill touching it before then fails; a kernel is not checked).
"""

from __future__ import annotations

import os
from typing import Any

from cuda.bindings import driver as drv

from . import memory, state, streams
from .binding import driver
from .memory import (
    MAP_ANONYMOUS,
    MAP_FIXED,
    MAP_NORESERVE,
    MAP_PRIVATE,
    MAP_SHARED,
    PROT_NONE,
    PROT_RW,
    libc,
    mmap,
)
from .state import DRV_SUCCESS, GRANULARITY, LOCK, R


def _placeholder(addr: int, size: int) -> None:
    mmap(addr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED)


class Reservation:
    def __init__(self, base: int, size: int) -> None:
        self.base, self.size = base, size


class Allocation:
    def __init__(self, size: int, device: int, fd: int) -> None:
        self.handle = state.new_handle()
        self.size, self.device, self.fd = size, device, fd
        self.released = False
        self.mappings = 0


RESERVATIONS: dict[int, Reservation] = {}
ALLOCATIONS: dict[int, Allocation] = {}
MAPPINGS: dict[int, tuple[int, Allocation]] = {}  # base -> (size, allocation)


def _aligned(*values: int) -> bool:
    return all(v % GRANULARITY == 0 for v in values)


def _reservation_of(ptr: int, size: int) -> Reservation | None:
    for r in RESERVATIONS.values():
        if r.base <= ptr and ptr + size <= r.base + r.size:
            return r
    return None


@driver("cuMemGetAllocationGranularity", 1)
def cuMemGetAllocationGranularity(prop: Any, option: Any) -> tuple:
    if prop is None:
        return (R.CUDA_ERROR_INVALID_VALUE, None)
    return (DRV_SUCCESS, GRANULARITY)


@driver("cuMemAddressReserve", 1)
def cuMemAddressReserve(size: int, alignment: int, addr: Any, flags: int) -> tuple:
    size, align = int(size), int(alignment) or GRANULARITY
    if size <= 0 or not _aligned(size) or align & (align - 1) or int(flags):
        return (R.CUDA_ERROR_INVALID_VALUE, None)
    align = max(align, GRANULARITY)
    with LOCK:
        raw = mmap(0, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)
        base = -(-raw // align) * align
        if base > raw:
            libc.munmap(raw, base - raw)
        tail = raw + size + align - (base + size)
        if tail:
            libc.munmap(base + size, tail)
        RESERVATIONS[base] = Reservation(base, size)
    return (DRV_SUCCESS, drv.CUdeviceptr(base))


@driver("cuMemAddressFree")
def cuMemAddressFree(ptr: Any, size: int) -> tuple:
    base, size = memory.address(ptr), int(size)
    with LOCK:
        r = RESERVATIONS.get(base)
        if r is None or r.size != size:
            return (R.CUDA_ERROR_INVALID_VALUE,)
        for m in [m for m in MAPPINGS if base <= m < base + size]:
            _unmap(m)
        del RESERVATIONS[base]
        libc.munmap(base, size)
    return (DRV_SUCCESS,)


@driver("cuMemCreate", 1)
def cuMemCreate(size: int, prop: Any, flags: int) -> tuple:
    size = int(size)
    if prop is None or size <= 0 or not _aligned(size) or int(flags):
        return (R.CUDA_ERROR_INVALID_VALUE, None)
    dev = int(prop.location.id)
    if prop.type != drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED \
            or prop.location.type != drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE \
            or not 0 <= dev < len(streams.DEVICES):
        return (R.CUDA_ERROR_INVALID_VALUE, None)
    with LOCK:
        if size > memory.free_bytes(dev):
            return (R.CUDA_ERROR_OUT_OF_MEMORY, None)
        fd = os.memfd_create("streamrt-fake-cuda", 0)
        os.ftruncate(fd, size)
        a = Allocation(size, dev, fd)
        ALLOCATIONS[a.handle] = a
        streams.DEVICES[dev].used += size
    return (DRV_SUCCESS, drv.CUmemGenericAllocationHandle(a.handle))


def _maybe_close(a: Allocation) -> None:
    if a.released and not a.mappings and a.fd >= 0:
        os.close(a.fd)
        a.fd = -1
        streams.DEVICES[a.device].used -= a.size


@driver("cuMemRelease")
def cuMemRelease(handle: Any) -> tuple:
    with LOCK:
        a = ALLOCATIONS.pop(state.as_int(handle), None)
        if a is None:
            return (R.CUDA_ERROR_INVALID_VALUE,)
        a.released = True  # the memory lives on while mapped
        _maybe_close(a)
    return (DRV_SUCCESS,)


@driver("cuMemMap")
def cuMemMap(ptr: Any, size: int, offset: int, handle: Any, flags: int) -> tuple:
    base, size, offset = memory.address(ptr), int(size), int(offset)
    with LOCK:
        a = ALLOCATIONS.get(state.as_int(handle))
        if a is None or int(flags) or size <= 0 or not _aligned(base, size, offset) \
                or offset + size > a.size or _reservation_of(base, size) is None:
            return (R.CUDA_ERROR_INVALID_VALUE,)
        if any(m < base + size and base < m + s for m, (s, _) in MAPPINGS.items()):
            return (R.CUDA_ERROR_INVALID_VALUE,)  # already mapped there
        mmap(base, size, PROT_RW, MAP_SHARED | MAP_FIXED, a.fd, offset)
        MAPPINGS[base] = (size, a)
        a.mappings += 1
        memory.DEVICE_MEM[base] = memory.Region(base, size, "vmm", a.device, owner=a,
                                                accessible=False)
    return (DRV_SUCCESS,)


@driver("cuMemSetAccess")
def cuMemSetAccess(ptr: Any, size: int, desc: Any, count: int) -> tuple:
    base, size = memory.address(ptr), int(size)
    descs = list(desc or [])[: int(count)]
    with LOCK:
        covered = [m for m, (s, _) in MAPPINGS.items() if base <= m and m + s <= base + size]
        if not descs or len(descs) != int(count) or not covered \
                or sum(MAPPINGS[m][0] for m in covered) != size:
            return (R.CUDA_ERROR_INVALID_VALUE,)
        rw = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        for m in covered:
            r = memory.DEVICE_MEM[m]
            r.accessible = any(d.flags == rw and int(d.location.id) == r.device for d in descs)
    return (DRV_SUCCESS,)


def _unmap(base: int) -> None:
    size, a = MAPPINGS.pop(base)
    _placeholder(base, size)
    memory.DEVICE_MEM.pop(base, None)
    a.mappings -= 1
    _maybe_close(a)


@driver("cuMemUnmap")
def cuMemUnmap(ptr: Any, size: int) -> tuple:
    base, size = memory.address(ptr), int(size)
    with LOCK:
        inside = [m for m, (s, _) in MAPPINGS.items() if base <= m and m + s <= base + size]
        if not _aligned(base, size) or not inside \
                or sum(MAPPINGS[m][0] for m in inside) != size:
            return (R.CUDA_ERROR_INVALID_VALUE,)
        for m in inside:
            _unmap(m)
    return (DRV_SUCCESS,)
