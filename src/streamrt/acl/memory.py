"""Memory in ACL's terms: ``acl.rt.malloc(size, policy)`` / ``free``, ``malloc_host`` /
``free_host``, ``memcpy(dst, dest_max, src, count, kind)`` / ``memcpy_async(..., stream)``,
``memset(ptr, max, value, count)`` / ``memset_async(..., stream)`` and ``get_mem_info(attr)``,
each a call of ``srt.malloc`` / ``srt.memcpy`` / ``s.memcpy`` / ``s.memset`` /
``dev.memory_info``.

What ACL checks and streamrt has no reason to: a size over ``destMax``, a size of 0 for an
allocation, a malloc policy outside ``aclrtMemMallocPolicy``, and a copy kind that does not
match its pointers (``ACL_MEMCPY_HOST_TO_DEVICE`` from device memory, say): each is
``ACL_ERROR_INVALID_PARAM``, checked before anything is enqueued."""

from __future__ import annotations

from typing import Any

from .. import host_memory, sanitizer
from ..errors import InvalidTypeError, InvalidValueError
from . import constants as C
from . import util
from .context import current_context
from .errors import api
from .streams import stream_of

__all__ = ["free", "free_as_acl", "free_host", "get_mem_info", "malloc", "malloc_host", "memcpy",
           "memcpy_async", "memset", "memset_async"]

_POLICY_FLAGS = C.ACL_MEM_TYPE_LOW_BAND_WIDTH | C.ACL_MEM_TYPE_HIGH_BAND_WIDTH
# kind -> (dst is host, src is host); None: either
_KINDS: dict[int, tuple[bool, bool] | None] = {
    C.ACL_MEMCPY_HOST_TO_HOST: (True, True),
    C.ACL_MEMCPY_HOST_TO_DEVICE: (False, True),
    C.ACL_MEMCPY_DEVICE_TO_HOST: (True, False),
    C.ACL_MEMCPY_DEVICE_TO_DEVICE: (False, False),
    C.ACL_MEMCPY_DEFAULT: None,
}
_KIND_NAMES = {C.ACL_MEMCPY_HOST_TO_HOST: "HOST_TO_HOST", C.ACL_MEMCPY_HOST_TO_DEVICE:
               "HOST_TO_DEVICE", C.ACL_MEMCPY_DEVICE_TO_HOST: "DEVICE_TO_HOST",
               C.ACL_MEMCPY_DEVICE_TO_DEVICE: "DEVICE_TO_DEVICE"}


def _count(count: Any, limit: Any, what: str) -> int:
    for name, v in ((what, count), ("max", limit)):
        if type(v) is not int:
            raise InvalidTypeError(f"{name} must be an int, not {type(v).__name__}")
        if v < 0:
            raise InvalidValueError(f"{name} must be >= 0, not {v}")
    if count > limit:
        raise InvalidValueError(f"{what} {count} is more than the destination's max {limit}")
    return int(count)


def alloc_size(size: Any) -> int:
    if type(size) is not int:
        raise InvalidTypeError(f"size must be an int, not {type(size).__name__}")
    if size <= 0:
        raise InvalidValueError(f"size must be > 0, not {size}")
    return int(size)


def _show(end: Any) -> str:
    return hex(end) if isinstance(end, int) else repr(end)


def _ends(dst: Any, src: Any, count: int, kind: Any) -> tuple[Any, Any]:
    """The copy's two ends for ``s.memcpy``, once ``kind`` is known to match them."""
    if type(kind) is not int or kind not in _KINDS:
        raise InvalidValueError(f"kind {kind!r} is not an aclrtMemcpyKind (ACL_MEMCPY_*)")
    want = _KINDS[kind]
    if want is not None:
        for end, host, side in ((dst, want[0], "destination"), (src, want[1], "source")):
            if util.is_host(end) != host:
                raise InvalidValueError(
                    f"ACL_MEMCPY_{_KIND_NAMES[kind]}: the {side} {_show(end)} is "
                    f"{'device' if host else 'host'} memory, not {'host' if host else 'device'}")
    return util.endpoint(dst, count), util.endpoint(src, count)


@api(None)
def malloc(size: int, policy: int) -> int:
    """``aclrtMalloc`` -> ``(ptr, ret)``: ``srt.malloc`` on the context's device (every policy
    is device memory alike)."""
    n = alloc_size(size)
    if type(policy) is not int or not 0 <= (policy & ~_POLICY_FLAGS) <= \
            C.ACL_MEM_MALLOC_NORMAL_ONLY_P2P:
        raise InvalidValueError(f"policy {policy!r} is not an aclrtMemMallocPolicy")
    return host_memory.malloc(n, current_context().device)


def free_as_acl(dev_ptr: Any, what: str) -> None:
    """``srt.free`` (which waits for the device, as ``cudaFree``); under the sanitizer judged as
    ACL's free, which waits for no stream work: an access the host has not synchronized is
    reported (``sanitizer.check_host_free``)."""
    if not sanitizer.enabled():
        host_memory.free(dev_ptr)
        return
    with sanitizer.check_host_free(dev_ptr if type(dev_ptr) is int else 0, what):
        host_memory.free(dev_ptr)


@api()
def free(dev_ptr: int) -> None:
    """``aclrtFree``: ``srt.free`` (see ``free_as_acl``)."""
    free_as_acl(dev_ptr, "aclrtFree")


@api(None)
def malloc_host(size: int) -> int:
    """``aclrtMallocHost`` -> ``(ptr, ret)``: ``srt.malloc_host``."""
    return host_memory.malloc_host(alloc_size(size))


@api()
def free_host(host_ptr: int) -> None:
    """``aclrtFreeHost``: ``srt.free_host``."""
    host_memory.free_host(host_ptr)


@api()
def memcpy(dst: int, dest_max: int, src: int, count: int, kind: int) -> None:
    """``aclrtMemcpy``: ``srt.memcpy``, synchronous."""
    n = _count(count, dest_max, "count")
    d, s = _ends(dst, src, n, kind)
    host_memory.memcpy(d, s, n)


@api()
def memcpy_async(dst: int, dest_max: int, src: int, count: int, kind: int, stream: Any) -> None:
    """``aclrtMemcpyAsync``: ``s.memcpy``, in stream order."""
    n = _count(count, dest_max, "count")
    st = stream_of(stream)
    d, s = _ends(dst, src, n, kind)
    st.memcpy(d, s, n)


@api()
def memset(dev_ptr: int, max_count: int, value: int, count: int) -> None:
    """``aclrtMemset``: ``srt.memset``, synchronous."""
    host_memory.memset(dev_ptr, value, _count(count, max_count, "count"))


@api()
def memset_async(dev_ptr: int, max_count: int, value: int, count: int, stream: Any) -> None:
    """``aclrtMemsetAsync``: ``s.memset``, in stream order."""
    n = _count(count, max_count, "count")
    stream_of(stream).memset(dev_ptr, value, n)


@api(0, 0)
def get_mem_info(attr: int) -> tuple[int, int]:
    """``aclrtGetMemInfo`` -> ``(free, total, ret)``: ``dev.memory_info()`` for every kind."""
    if type(attr) is not int or not C.ACL_DDR_MEM <= attr <= C.ACL_HBM_MEM_P2P_NORMAL:
        raise InvalidValueError(f"attr {attr!r} is not an aclrtMemAttr")
    return current_context().device.memory_info()
