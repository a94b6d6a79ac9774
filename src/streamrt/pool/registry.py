"""Which pool owns what: live pool pointers, pool arenas, the pools a synchronize reaches.

State (module-level; each change is one dict or set operation, atomic under the GIL, so a
lookup never takes a lock):
- ``_owners``: live pool pointer -> its pool, of either kind. A pointer always returns to the
  pool that owns it (``s.free`` looks it up here), and a pool with live allocations is not
  collected.
- ``_busy``: arena pools holding frees that no synchronize has proven yet. Work may still use
  that memory, so such a pool stays alive until a synchronize promotes them.
- ``_pools``: every arena pool, weakly; a host synchronize of any device reaches each of them
  (``_on_any_sync``: events carry clocks, so one device's synchronize can prove another's frees).
- ``_requested``: base of each live ``srt.malloc`` and graph allocation -> the bytes asked
  for (host_memory and graph.memory keep it).
- ``_arenas``: base of each reserved arena -> a weak reference to the pool sub-allocating it;
  an entry lives from the arena's reservation to its release (or the pool's collection).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from ..device import Device, range_of
from ..errors import InvalidAddressError
from ..sync import sync_listeners
from ..weak import members

if TYPE_CHECKING:
    from .arena_pool import ArenaPool
    from .mempool import MemPool

__all__ = ["arenas", "device_of", "find_pool", "live_blocks", "pool_of", "requested",
           "usable_bytes"]

_owners: dict[int, MemPool] = {}
_busy: set[ArenaPool] = set()
_pools: weakref.WeakSet[ArenaPool] = weakref.WeakSet()
_arenas: dict[int, weakref.ref[ArenaPool]] = {}
# base of each live ``srt.malloc`` allocation and graph allocation -> the bytes requested (the
# backend's range is them rounded up): what may be used from there (``usable_bytes``)
_requested: dict[int, int] = {}


def requested(base: int) -> int | None:
    """The bytes requested for the ``srt.malloc`` or graph allocation at ``base`` (None: not one)."""
    return _requested.get(base)


def find_pool(ptr: int) -> MemPool | None:
    """The pool owning the live allocation that starts at ``ptr``, or None."""
    return _owners.get(ptr)


def pool_of(ptr: int) -> MemPool:
    """The pool owning ``ptr``; raises :class:`InvalidAddressError` for anything else."""
    pool = _owners.get(ptr)
    if pool is None:
        raise InvalidAddressError(
            f"free of {hex(ptr)}: not a live stream-ordered allocation (double free, an interior "
            "pointer, or memory from srt.malloc, which srt.free releases)"
        )
    return pool


def live_blocks() -> list[tuple[int, int]]:
    """``(ptr, nbytes)`` of every live pool allocation, of every pool."""
    out = []
    for ptr, pool in list(_owners.items()):  # a copy: other threads allocate meanwhile
        size = pool._usable(ptr)
        if size is not None:
            out.append((ptr, size))
    return out


def arenas() -> set[int]:
    """The base addresses of the arenas pools have reserved (a pool's arena is not itself an
    allocation the program owns: its live blocks are)."""
    return set(_arenas)


def usable_bytes(ptr: int) -> int | None:
    """Bytes from ``ptr`` to the end of the live allocation holding it (a pool block or an
    ``srt.malloc`` allocation: pointer arithmetic inside one is legal); None when in none."""
    return placement(ptr)[1]


def placement(ptr: int) -> tuple[Device | None, int | None]:
    """``(device_of(ptr), usable_bytes(ptr))`` from one lookup."""
    pool = _owners.get(ptr)
    if pool is not None:
        return pool.device, pool._usable(ptr)
    found = range_of(ptr)
    if found is None or found[0] is None:  # nothing there, or pinned host memory
        return None, None
    dev, r = found
    ref = _arenas.get(r.base)
    if ref is not None:  # inside a pool's arena: inside one of its blocks, if live
        arena_pool = ref()
        return dev, None if arena_pool is None else arena_pool._room(ptr)
    n = _requested.get(ptr)
    if n is not None:  # at an allocation's base: what was requested
        return dev, n
    n = _requested.get(r.base) if r.kind == "malloc" else None
    return dev, max((r.base + n if n is not None else r.end) - ptr, 0)


def device_of(ptr: int) -> Device | None:
    """The device whose memory holds ``ptr`` (None: pinned host memory, or no allocation)."""
    pool = _owners.get(ptr)
    if pool is not None:
        return pool.device
    found = range_of(ptr)
    return None if found is None else found[0]


def _on_any_sync(device: Device) -> None:
    for pool in members(_pools):  # another thread may create or drop a pool meanwhile
        pool._on_sync()


sync_listeners.append(_on_any_sync)
