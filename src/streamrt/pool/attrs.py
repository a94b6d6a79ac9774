"""Memory pool attributes and options: ``MemPoolAttr`` (numbered as ``cudaMemPoolAttr``), the
validated :class:`PoolOptions` a pool is made with, and one property per attribute.

Every kind of pool reads and writes attributes through ``get_attr``/``set_attr``; the properties
here are written once for all of them (:func:`with_attr_properties` on
:class:`~streamrt.pool.mempool.MemPool`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from ..errors import InvalidTypeError, InvalidValueError, NamedIntEnum
from ..validate import is_bool, is_int


class MemPoolAttr(NamedIntEnum):
    """Pool attributes, numbered as ``cudaMemPoolAttr`` / ``aclrtMemPoolAttr``."""

    REUSE_FOLLOW_EVENT_DEPENDENCIES = 1
    REUSE_ALLOW_OPPORTUNISTIC = 2
    REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3
    RELEASE_THRESHOLD = 4
    RESERVED_MEM_CURRENT = 5
    RESERVED_MEM_HIGH = 6
    USED_MEM_CURRENT = 7
    USED_MEM_HIGH = 8


# the three reuse flags
FLAGS = frozenset((MemPoolAttr.REUSE_FOLLOW_EVENT_DEPENDENCIES, MemPoolAttr.REUSE_ALLOW_OPPORTUNISTIC,
                   MemPoolAttr.REUSE_ALLOW_INTERNAL_DEPENDENCIES))
# the attributes that are options (the three flags and the threshold) -> their PoolOptions field
OPTIONS = {attr: attr.name.lower() for attr in (*sorted(FLAGS), MemPoolAttr.RELEASE_THRESHOLD)}

_DOCS = {
    MemPoolAttr.REUSE_FOLLOW_EVENT_DEPENDENCIES:
        "Step 3: reuse blocks whose free is ordered before the allocation by events.",
    MemPoolAttr.REUSE_ALLOW_OPPORTUNISTIC:
        "Step 4: reuse blocks whose free has already executed, without a dependency.",
    MemPoolAttr.REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        "Step 6: reuse a pending block by making the allocating stream wait on its free.",
    MemPoolAttr.RELEASE_THRESHOLD:
        "Reserved bytes kept at a synchronize before free chunks are released.",
    MemPoolAttr.RESERVED_MEM_CURRENT: "Bytes reserved from the device (read-only).",
    MemPoolAttr.RESERVED_MEM_HIGH:
        "High watermark of reserved bytes; write 0 to reset it to the current value.",
    MemPoolAttr.USED_MEM_CURRENT: "Bytes of live allocations (read-only).",
    MemPoolAttr.USED_MEM_HIGH:
        "High watermark of used bytes; write 0 to reset it to the current value.",
}


def flag(value: Any, what: str) -> bool:
    """A reuse flag: a bool (numpy's too), or 0/1."""
    if is_bool(value):
        return bool(value)
    if is_int(value) and value in (0, 1):
        return bool(value)
    raise InvalidValueError(f"{what} must be a bool (or 0/1), got {value!r}")


def nonneg(value: Any, what: str) -> int:
    """A size in bytes: an int (numpy's too) >= 0. Sizes past what CUDA's uint64 attributes
    hold are accepted (``2**64`` for "keep everything"): the cuda backend clamps them."""
    if not is_int(value):
        raise InvalidTypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < 0:
        raise InvalidValueError(f"{what} must be >= 0, got {value}")
    return int(value)


@dataclass(frozen=True, slots=True)
class PoolOptions:
    """A pool's options, validated at construction: the two sizes (ints >= 0) and the three
    reuse flags (bools), named as ``srt.MemPool``'s keywords. Frozen: a pool changes one by
    replacing the whole value (:meth:`with_attr`)."""

    max_size: int = 0
    release_threshold: int = 0
    reuse_follow_event_dependencies: bool = True
    reuse_allow_opportunistic: bool = True
    reuse_allow_internal_dependencies: bool = True

    def __post_init__(self) -> None:
        for f in fields(self):  # in declaration order: the first bad keyword is reported
            v = getattr(self, f.name)
            object.__setattr__(self, f.name, nonneg(v, f.name) if f.type in ("int", int) else flag(v, f.name))

    def with_attr(self, attr: MemPoolAttr, value: int) -> PoolOptions:
        """These options with one of :data:`OPTIONS` set to ``value`` (validated again)."""
        return replace(self, **{OPTIONS[attr]: value})


def parse(attr: Any) -> MemPoolAttr:
    """An attribute given as a MemPoolAttr or its number."""
    if not is_int(attr):
        raise InvalidTypeError(f"a memory pool attribute is a srt.MemPoolAttr or its number "
                               f"(1-8), not {type(attr).__name__}")
    try:
        return MemPoolAttr(int(attr))
    except ValueError:
        raise InvalidValueError(f"unknown memory pool attribute {attr!r} (1-8)") from None


def value(attr: MemPoolAttr, v: Any) -> int:
    """A value ``set_attr`` may write: a flag as 0/1, the threshold, or 0 to a watermark."""
    if attr in FLAGS:
        return int(flag(v, attr.name))
    if attr is MemPoolAttr.RELEASE_THRESHOLD:
        return nonneg(v, "release_threshold")
    if attr in (MemPoolAttr.RESERVED_MEM_HIGH, MemPoolAttr.USED_MEM_HIGH):
        if nonneg(v, attr.name) != 0:
            raise InvalidValueError(f"{attr.name} can only be reset, by writing 0")
        return 0
    raise InvalidValueError(f"{attr.name} is read-only")


def _property(attr: MemPoolAttr) -> property:
    if attr in FLAGS:  # the flags read as bools
        return property(lambda self: bool(self.get_attr(attr)),
                        lambda self, v: self.set_attr(attr, v), doc=_DOCS[attr])
    return property(lambda self: self.get_attr(attr), lambda self, v: self.set_attr(attr, v),
                    doc=_DOCS[attr])


def with_attr_properties(cls: type) -> type:
    """Class decorator: a property per attribute (``pool.release_threshold`` and so on)."""
    for attr in MemPoolAttr:
        setattr(cls, attr.name.lower(), _property(attr))
    return cls
