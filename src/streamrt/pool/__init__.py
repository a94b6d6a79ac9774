"""Stream-ordered memory pools (DESIGN.md §3, API.md §3)."""

from __future__ import annotations

from .arena_pool import MemPool
from .attrs import MemPoolAttr
from .registry import device_of, find_pool, pool_of, usable_bytes

__all__ = ["MemPool", "MemPoolAttr", "device_of", "find_pool", "pool_of", "usable_bytes"]
