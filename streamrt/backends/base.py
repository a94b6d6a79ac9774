"""The small Backend interface: raw device memory, in-order queues, and a kernel context.

Semantics (vector clocks, legacy-stream ordering, pools, capture) live in the frontend; a
backend only provides these primitives. A queue runs its operations in submission order and
counts the ones it has completed, so that "position p of stream S is done" is one comparison.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any


class Queue(ABC):
    """An in-order work queue (one per stream): operations run in submission order."""

    done: int  # number of submitted operations that have completed

    @abstractmethod
    def submit(self, fn: Callable[..., Any], args: tuple) -> None:
        """Enqueue ``fn(*args)``; returns at once."""

    @abstractmethod
    def wait_done(self, pos: int) -> None:
        """Block the calling host thread until ``done >= pos``."""

    @abstractmethod
    def take_errors(self, upto: int | None = None) -> list[tuple[int, BaseException, str]]:
        """Remove and return the failures of operations at positions ``<= upto`` (all if None)."""

    @abstractmethod
    def close(self) -> None:
        """Stop accepting work; operations already submitted still run."""


class DeviceImpl(ABC):
    """One device of a backend: memory and queues."""

    index: int
    capacity: int

    @abstractmethod
    def malloc(self, nbytes: int) -> int:
        """Allocate device memory synchronously; returns a pointer."""

    @abstractmethod
    def free(self, ptr: int) -> None:
        """Release an allocation made by :meth:`malloc` (caller has synchronized)."""

    @abstractmethod
    def used(self) -> int:
        """Bytes currently allocated on the device."""

    @abstractmethod
    def owns(self, ptr: int) -> bool:
        """True when ``ptr`` is the start of a live :meth:`malloc` allocation of this device."""

    @abstractmethod
    def free_all(self) -> None:
        """Release every allocation of the device (device reset)."""

    @abstractmethod
    def create_queue(self, name: str) -> Queue:
        """Create an in-order queue for a new stream."""


class Backend(ABC):
    """A family of devices (``cpu``, ``cuda``)."""

    name: str

    @abstractmethod
    def device_count(self) -> int:
        """Number of devices this backend offers here."""

    @abstractmethod
    def open_device(self, index: int) -> DeviceImpl:
        """Create the implementation object of device ``index``."""

    @abstractmethod
    def malloc_host(self, nbytes: int) -> int:
        """Allocate pinned host memory usable as a copy endpoint; returns a pointer."""

    @abstractmethod
    def free_host(self, ptr: int) -> None:
        """Release pinned host memory."""
