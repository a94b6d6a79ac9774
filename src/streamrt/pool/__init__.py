"""Stream-ordered memory pools (DESIGN.md §3, API.md §3)."""

from __future__ import annotations

from .arena_pool import MemPool, device_of, find_pool, pool_of, usable_bytes
from .attrs import MemPoolAttr

__all__ = ["MemPool", "MemPoolAttr", "device_of", "find_pool", "pool_of", "usable_bytes"]
