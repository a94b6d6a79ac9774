"""Stream-ordered pools in ACL's terms: ``acl.rt.mem_pool_create(props)`` / ``mem_pool_destroy``,
``mem_pool_malloc_async(size, pool, stream)`` / ``mem_pool_free_async(ptr, stream)``,
``mem_pool_set_attr`` / ``mem_pool_get_attr`` (``ACL_RT_MEM_POOL_ATTR_*``, numbered as
``srt.MemPoolAttr``) and ``mem_pool_trim_to``, each a call of ``srt.MemPool``.

``props`` is ``aclrtMemPoolProps``: a dict of its C field names (``{"allocType",
"handleType", "location": {"id", "type"}, "maxSize"}``, ``"reserved"`` ignored) or a
:class:`MemPoolProps`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..device import Device
from ..errors import InvalidHandleError, InvalidTypeError, InvalidValueError
from ..pool import MemPool, MemPoolAttr
from . import constants as C
from .context import current_context
from .errors import api
from .streams import stream_of

__all__ = ["MemLocation", "MemPoolProps", "mem_pool_create", "mem_pool_destroy",
           "mem_pool_free_async", "mem_pool_get_attr", "mem_pool_malloc_async",
           "mem_pool_set_attr", "mem_pool_trim_to"]


@dataclass
class MemLocation:
    """``aclrtMemLocation``: where pool memory lives (a device, by index)."""

    id: int = 0
    type: int = C.ACL_MEM_LOCATION_TYPE_DEVICE


@dataclass
class MemPoolProps:
    """``aclrtMemPoolProps``, with the C fields' names."""

    allocType: int = C.ACL_MEM_ALLOCATION_TYPE_PINNED  # noqa: N815 (ACL's field names)
    handleType: int = C.ACL_MEM_HANDLE_TYPE_NONE  # noqa: N815
    location: MemLocation = field(default_factory=MemLocation)
    maxSize: int = 0  # noqa: N815 (0: no limit beyond the device)


def _props(props: Any) -> MemPoolProps:
    if isinstance(props, MemPoolProps):
        return props
    if not isinstance(props, dict):
        raise InvalidTypeError(f"props must be a dict of aclrtMemPoolProps' fields or a "
                               f"MemPoolProps, not {type(props).__name__}")
    unknown = set(props) - {"allocType", "handleType", "location", "maxSize", "reserved"}
    if unknown:
        raise InvalidValueError(f"aclrtMemPoolProps has no field {sorted(unknown)}")
    loc = props.get("location", {})
    if isinstance(loc, dict):
        if set(loc) - {"id", "type"}:
            raise InvalidValueError(f"aclrtMemLocation has no field {sorted(set(loc) - {'id', 'type'})}")
        loc = MemLocation(**loc)
    if not isinstance(loc, MemLocation):
        raise InvalidTypeError(f"location must be a dict or a MemLocation, not {type(loc).__name__}")
    return MemPoolProps(props.get("allocType", C.ACL_MEM_ALLOCATION_TYPE_PINNED),
                        props.get("handleType", C.ACL_MEM_HANDLE_TYPE_NONE), loc,
                        props.get("maxSize", 0))


def _pool(pool: Any) -> MemPool:
    if not isinstance(pool, MemPool):
        raise InvalidHandleError(f"{pool!r} is not a memory pool (acl.rt.mem_pool_create)")
    return pool


def _attr(attr: Any) -> MemPoolAttr:
    try:
        return MemPoolAttr(attr)
    except (ValueError, TypeError):
        raise InvalidValueError(f"attr {attr!r} is not an aclrtMemPoolAttr "
                                "(ACL_RT_MEM_POOL_ATTR_*, 1-8)") from None


@api(None)
def mem_pool_create(props: Any) -> MemPool:
    """``aclrtMemPoolCreate`` -> ``(pool, ret)``: ``srt.MemPool(device, max_size=maxSize)``."""
    p = _props(props)
    if p.allocType != C.ACL_MEM_ALLOCATION_TYPE_PINNED:
        raise InvalidValueError(f"allocType {p.allocType!r}: only ACL_MEM_ALLOCATION_TYPE_PINNED")
    if p.handleType != C.ACL_MEM_HANDLE_TYPE_NONE:
        raise InvalidValueError(f"handleType {p.handleType!r}: only ACL_MEM_HANDLE_TYPE_NONE")
    if p.location.type != C.ACL_MEM_LOCATION_TYPE_DEVICE:
        raise InvalidValueError(f"location.type {p.location.type!r}: only "
                                "ACL_MEM_LOCATION_TYPE_DEVICE")
    if type(p.location.id) is not int:
        raise InvalidTypeError(f"location.id must be an int, not {type(p.location.id).__name__}")
    dev = Device(f"{current_context().device.backend}:{p.location.id}")
    return MemPool(dev, max_size=p.maxSize)


@api()
def mem_pool_destroy(pool: MemPool) -> None:
    """``aclrtMemPoolDestroy``: ``pool.destroy()``."""
    _pool(pool).destroy()


@api(None)
def mem_pool_malloc_async(size: int, pool: MemPool, stream: Any) -> int:
    """``aclrtMemPoolMallocAsync`` -> ``(ptr, ret)``: ``s.malloc(size, pool)``."""
    if type(size) is not int or size <= 0:
        raise InvalidValueError(f"size must be an int > 0, not {size!r}")
    return stream_of(stream).malloc(size, _pool(pool))


@api()
def mem_pool_free_async(ptr: int, stream: Any) -> None:
    """``aclrtMemPoolFreeAsync``: ``s.free(ptr)``."""
    stream_of(stream).free(ptr)


@api()
def mem_pool_set_attr(pool: MemPool, attr: int, value: int) -> None:
    """``aclrtMemPoolSetAttr``: ``pool.set_attr``."""
    _pool(pool).set_attr(_attr(attr), value)


@api(None)
def mem_pool_get_attr(pool: MemPool, attr: int) -> int:
    """``aclrtMemPoolGetAttr`` -> ``(value, ret)``: ``pool.get_attr``."""
    return _pool(pool).get_attr(_attr(attr))


@api()
def mem_pool_trim_to(pool: MemPool, min_bytes_to_keep: int) -> None:
    """``aclrtMemPoolTrimTo``: ``pool.trim_to``."""
    _pool(pool).trim_to(min_bytes_to_keep)
