"""Stream-ordered memory pools (``cudaMemPool_t``): a simple model, stream-ordered and consistent.

A pool reserves device memory in blocks (whole multiples of 2 MiB, one per reservation); an
allocation takes a whole free block (best fit) or reserves a new one. A freed block may be reused

- by the stream that freed it, at once (stream order makes that safe);
- by any stream once a host synchronize (stream, event, device; ``cudaFree``) waited for the
  free, whatever the reuse flags;
- by another stream once the free has completed (ReuseAllowOpportunistic), or once that stream
  depends on the free through an event wait or the legacy stream (ReuseFollowEventDependencies;
  a free that merely completed is no dependency).

When neither applies and the pool cannot grow (``maxSize`` or device memory), a block whose free
is still pending on another stream is taken and the allocating stream is made to wait for that
free (ReuseAllowInternalDependencies, as the driver inserts such a dependency). Reserved >= used
always. At every stream, event and device synchronize of a device, its pools release free blocks
whose frees have completed, down to (never below) each pool's release threshold;
``cudaMemPoolTrimTo`` does the same down to its argument. Memory reserved beyond ``maxSize`` (or
the device's free memory) fails with cudaErrorMemoryAllocation after the pool has released what
it safely could.
"""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver as drv
from cuda.bindings import runtime as rt

from . import capture, memory, state, streams
from .binding import runtime
from .state import GRANULARITY, LOCK, SUCCESS, E

FOLLOW, OPPORTUNISTIC, INTERNAL, THRESHOLD = 1, 2, 3, 4
RESERVED_CUR, RESERVED_HIGH, USED_CUR, USED_HIGH = 5, 6, 7, 8


class Block:
    def __init__(self, base: int, size: int) -> None:
        self.base = base
        self.size = size
        self.used = 0  # bytes of the live allocation in it (0: free)
        self.freed_on: streams.FakeStream | None = None
        self.freed_at = 0  # seq of the free operation on freed_on

    def free_completed(self) -> bool:
        return self.freed_on is None or self.freed_on.done >= self.freed_at


class Pool:
    def __init__(self, device: int, max_size: int, default: bool) -> None:
        self.handle = state.new_handle()
        self.device = device
        self.max_size = max_size or memory.capacity()
        self.default = default
        self.attrs = {FOLLOW: 1, OPPORTUNISTIC: 1, INTERNAL: 1, THRESHOLD: 0}
        self.blocks: list[Block] = []
        self.reserved_high = 0
        self.used_high = 0
        self.destroyed = False

    @property
    def reserved(self) -> int:
        return sum(b.size for b in self.blocks)

    @property
    def used(self) -> int:
        return sum(b.used for b in self.blocks)

    def reusable(self, b: Block, s: streams.FakeStream) -> bool:
        if b.used:
            return False
        if b.freed_on is None or b.freed_on is s or b.freed_on.host_seen >= b.freed_at:
            return True  # same stream, or a host synchronize saw the free: whatever the flags
        if self.attrs[OPPORTUNISTIC] and b.free_completed():
            return True
        return bool(self.attrs[FOLLOW]) and s.ordered_after(b.freed_on, b.freed_at)

    def release(self, keep: int) -> None:
        """Give back free blocks whose frees completed while more than ``keep`` bytes are
        reserved, never going below ``keep`` (cudaMemPoolTrimTo: "the pool will be guaranteed to
        have at least minBytesToKeep bytes reserved after the operation")."""
        for b in sorted(self.blocks, key=lambda b: -b.size):
            if self.reserved <= keep:
                break
            if not b.used and b.free_completed() and self.reserved - b.size >= keep:
                self._drop(b)
        if self.destroyed:
            for b in list(self.blocks):
                if not b.used and b.free_completed():
                    self._drop(b)
            if not self.blocks:
                DYING.discard(self)

    def _drop(self, b: Block) -> None:
        self.blocks.remove(b)
        memory.DEVICE_MEM.pop(b.base, None)
        streams.DEVICES[self.device].used -= b.size
        memory.host_free(b.base, b.size)

    def reserve(self, size: int) -> Block | None:
        size = -(-size // GRANULARITY) * GRANULARITY
        if self.reserved + size > self.max_size or size > memory.free_bytes(self.device):
            self.release(0)  # what can safely go, then try once more
            if self.reserved + size > self.max_size or size > memory.free_bytes(self.device):
                return None
        base = memory.host_alloc(size)
        if not base:
            return None
        b = Block(base, size)
        self.blocks.append(b)
        memory.DEVICE_MEM[base] = memory.Region(base, size, "pool", self.device, owner=b)
        streams.DEVICES[self.device].used += size
        self.reserved_high = max(self.reserved_high, self.reserved)
        return b


POOLS: dict[int, Pool] = {}
DYING: set[Pool] = set()  # destroyed pools still holding memory
DEFAULTS: dict[int, Pool] = {}  # device -> its default pool
OWNER: dict[int, tuple[Pool, Block]] = {}  # live allocation -> (pool, block)


def release_at_sync(device: int) -> None:
    """A synchronize of ``device`` completed: its pools release down to their thresholds."""
    with LOCK:
        for p in [*POOLS.values(), *DYING]:
            if p.device == device:
                p.release(p.attrs[THRESHOLD])


def _pool(handle: Any) -> Pool | None:
    p = POOLS.get(state.as_int(handle))
    return None if p is None or p.destroyed else p


@runtime("cudaDeviceGetDefaultMemPool")
def cudaDeviceGetDefaultMemPool(device: int) -> tuple:
    d = int(device)
    if not 0 <= d < len(streams.DEVICES):
        return (E.cudaErrorInvalidDevice, None)
    with LOCK:
        p = DEFAULTS.get(d)
        if p is None:
            p = DEFAULTS[d] = Pool(d, 0, default=True)
            POOLS[p.handle] = p
    return (SUCCESS, rt.cudaMemPool_t(p.handle))


@runtime("cudaMemPoolCreate")
def cudaMemPoolCreate(props: Any) -> tuple:
    if props is None:
        return (E.cudaErrorInvalidValue, None)
    if props.allocType != rt.cudaMemAllocationType.cudaMemAllocationTypePinned \
            or props.location.type != rt.cudaMemLocationType.cudaMemLocationTypeDevice \
            or not 0 <= props.location.id < len(streams.DEVICES):
        return (E.cudaErrorInvalidValue, None)
    with LOCK:
        p = Pool(props.location.id, int(props.maxSize), default=False)
        POOLS[p.handle] = p
    return (SUCCESS, rt.cudaMemPool_t(p.handle))


@runtime("cudaMemPoolDestroy")
def cudaMemPoolDestroy(pool: Any) -> tuple:
    with LOCK:
        p = _pool(pool)
        if p is None:
            return (E.cudaErrorInvalidValue,)
        if p.default:
            return (E.cudaErrorInvalidValue,)  # a device's default pool cannot be destroyed
        p.destroyed = True  # memory goes once its allocations are freed
        del POOLS[p.handle]
        DYING.add(p)
        p.release(0)
    return (SUCCESS,)


@runtime("cudaMemPoolGetAttribute")
def cudaMemPoolGetAttribute(pool: Any, attr: Any) -> tuple:
    a = int(attr)
    with LOCK:
        p = _pool(pool)
        if p is None or not 1 <= a <= 8:
            return (E.cudaErrorInvalidValue, None)
        if a <= INTERNAL:
            return (SUCCESS, p.attrs[a])  # the binding gives these as int
        value = {THRESHOLD: p.attrs[THRESHOLD], RESERVED_CUR: p.reserved,
                 RESERVED_HIGH: p.reserved_high, USED_CUR: p.used, USED_HIGH: p.used_high}[a]
    return (SUCCESS, drv.cuuint64_t(value))  # and these as cuuint64_t


@runtime("cudaMemPoolSetAttribute")
def cudaMemPoolSetAttribute(pool: Any, attr: Any, value: Any) -> tuple:
    a, v = int(attr), int(value)
    with LOCK:
        p = _pool(pool)
        if p is None or not 1 <= a <= 8 or a in (RESERVED_CUR, USED_CUR):
            return (E.cudaErrorInvalidValue,)
        if a in (RESERVED_HIGH, USED_HIGH):
            if v != 0:
                return (E.cudaErrorInvalidValue,)  # a watermark may only be reset
            if a == RESERVED_HIGH:
                p.reserved_high = p.reserved
            else:
                p.used_high = p.used
            return (SUCCESS,)
        p.attrs[a] = v
    return (SUCCESS,)


@runtime("cudaMemPoolTrimTo")
def cudaMemPoolTrimTo(pool: Any, keep: int) -> tuple:
    with LOCK:
        p = _pool(pool)
        if p is None:
            return (E.cudaErrorInvalidValue,)
        p.release(int(keep))
    return (SUCCESS,)


@runtime("cudaMallocFromPoolAsync")
def cudaMallocFromPoolAsync(size: int, pool: Any, stream: Any) -> tuple:
    n = int(size)
    with LOCK:
        p = _pool(pool)
        s = streams.resolve(stream)
        if s is None:
            return (E.cudaErrorInvalidResourceHandle, None)
        capture.unsupported(s, "cudaMallocFromPoolAsync")  # a memory alloc node: not modelled
        if p is None or n == 0:
            return (E.cudaErrorInvalidValue, None)
        need = memory.rounded(n)
        fits = [b for b in p.blocks if b.size >= need and p.reusable(b, s)]
        b = min(fits, key=lambda b: b.size) if fits else p.reserve(need)
        if b is None and p.attrs[INTERNAL]:  # cannot grow: wait for a pending free instead
            pending = [b for b in p.blocks if b.size >= need and not b.used]
            b = min(pending, key=lambda b: b.size) if pending else None
        if b is None:
            return (E.cudaErrorMemoryAllocation, None)
        if b.freed_on is not None and b.freed_on is not s and not b.free_completed():
            # an event dependency already orders s after the free; an internal one is added now
            s.enqueue(lambda: None, "pool reuse wait", [(b.freed_on, b.freed_at)])
        b.used, b.freed_on, b.freed_at = need, None, 0
        p.used_high = max(p.used_high, p.used)
        OWNER[b.base] = (p, b)
    return (SUCCESS, b.base)


@runtime("cudaFreeAsync")
def cudaFreeAsync(ptr: Any, stream: Any) -> tuple:
    addr = memory.address(ptr)
    with LOCK:
        s = streams.resolve(stream)
        if s is None:
            return (E.cudaErrorInvalidResourceHandle,)
        capture.unsupported(s, "cudaFreeAsync")  # a memory free node: not modelled
        hit = OWNER.pop(addr, None)
        if hit is None:
            return (E.cudaErrorInvalidValue,)
        p, b = hit
        b.used = 0
        b.freed_on, b.freed_at = s, s.enqueue(lambda: None, "free")
        if p.destroyed:
            p.release(0)
    return (SUCCESS,)
