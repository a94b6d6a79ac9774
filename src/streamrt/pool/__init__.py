"""Stream-ordered memory pools (DESIGN.md §3, API.md §3), by composition.

- ``mempool.py``: ``MemPool``, the interface every kind implements and the factory that makes
  the kind a device calls for;
- ``arena_pool.py``: ``ArenaPool``, the frontend's pool: blocks, frees, synchronize points;
  ``arena.py`` (its address range and mapped granules), ``block.py`` (blocks, the block list's
  splices and index, coalescing), ``fast.py`` (the malloc/free fast paths, splices in line),
  ``freelist.py`` (free lists: best fit, proof order),
  ``reuse.py`` (the reuse steps) and ``release.py`` (synchronize, trim, destroy, reset),
  functions over its state;
- ``native.py``: ``NativePool``, on the backend's own pools (``cudaMemPool_t``);
- ``attrs.py``: ``MemPoolAttr``, ``PoolOptions``, attribute parsing and properties;
- ``registry.py``: which pool owns what (live pointers, arenas), the synchronize hook.
"""

from __future__ import annotations

from .arena_pool import ArenaPool
from .attrs import MemPoolAttr, PoolOptions
from .mempool import MemPool
from .native import NativePool
from .registry import device_of, find_pool, pool_of, usable_bytes

__all__ = ["ArenaPool", "MemPool", "MemPoolAttr", "NativePool", "PoolOptions", "device_of",
           "find_pool", "pool_of", "usable_bytes"]
