"""The native pool part of the backend contract (imported by base.py, where backends find it):
a backend's own stream-ordered pools, which the frontend's MemPool runs on."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import Queue

__all__ = ["NativePools"]


class NativePools(ABC):
    """A backend's own stream-ordered pools (``cudaMemPool_t``): pools are opaque handles."""

    @abstractmethod
    def default(self) -> Any:
        """The device's default pool (``cudaDeviceGetDefaultMemPool``)."""

    @abstractmethod
    def create(self, max_size: int) -> Any:
        """A new pool (``cudaMemPoolCreate``); ``max_size`` 0 is no limit."""

    @abstractmethod
    def get(self, pool: Any, attr: int) -> int:
        """An attribute (``cudaMemPoolGetAttribute``, values 1-8 as in CUDA)."""

    @abstractmethod
    def set(self, pool: Any, attr: int, value: int) -> None:
        """Set an attribute (``cudaMemPoolSetAttribute``)."""

    @abstractmethod
    def malloc(self, pool: Any, nbytes: int, queue: Queue) -> int:
        """Allocate in stream order on ``queue`` (``cudaMallocFromPoolAsync``)."""

    @abstractmethod
    def free(self, ptr: int, queue: Queue) -> None:
        """Free in stream order on ``queue`` (``cudaFreeAsync``)."""

    @abstractmethod
    def free_now(self, ptr: int) -> None:
        """Free and wait for it (``srt.free`` of a pool block)."""

    @abstractmethod
    def trim(self, pool: Any, keep: int) -> None:
        """``cudaMemPoolTrimTo``."""

    @abstractmethod
    def destroy(self, pool: Any) -> None:
        """``cudaMemPoolDestroy``."""
