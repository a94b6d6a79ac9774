"""``acl.media``: DVPP memory (``acl.media.dvpp_malloc`` / ``dvpp_free``), ordinary device
memory here (``srt.malloc`` / ``srt.free``); the DVPP processing calls are not offered."""

from __future__ import annotations

from typing import Any

from .. import host_memory
from .context import current_context
from .errors import api, not_offered
from .memory import alloc_size, free_as_acl

__all__ = ["dvpp_free", "dvpp_malloc"]


@api(None)
def dvpp_malloc(size: int) -> int:
    """``acldvppMalloc`` -> ``(ptr, ret)``: device memory, ``srt.malloc``."""
    return host_memory.malloc(alloc_size(size), current_context().device)


@api()
def dvpp_free(dev_ptr: int) -> None:
    """``acldvppFree``: ``srt.free``, judged as ``aclrtFree`` is (``acl.rt.free``)."""
    free_as_acl(dev_ptr, "acldvppFree")


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise not_offered("acl.media", name, {})
