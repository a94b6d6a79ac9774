"""Node parameters: the validation shared by building a graph and by an exec's setters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..device import range_of
from ..errors import InvalidAddressError, InvalidTypeError
from ..event import Event
from ..validate import check_byte, check_ptr, check_size, host_view, is_int

__all__ = ["host_params", "memcpy_params", "memset_params"]


def _event(event: Any) -> Event:
    if not isinstance(event, Event):
        raise InvalidTypeError(f"an event node needs an Event, not {type(event).__name__}")
    event._check_alive()
    return event


def memcpy_params(dst: Any, src: Any, nbytes: int) -> dict[str, Any]:
    """Validate MEMCPY parameters; ranges inside graph memory are checked when mapped."""
    n = check_size(nbytes)
    for end, writable in ((dst, True), (src, False)):
        if is_int(end):
            _check_range(int(end), n)
        else:
            host_view(end, n, writable=writable)
    return {"dst": dst, "src": src, "nbytes": n}


def memset_params(ptr: Any, value: Any, nbytes: int) -> dict[str, Any]:
    """Validate MEMSET parameters."""
    n = check_size(nbytes)
    ptr = check_ptr(ptr)
    value = check_byte(value)
    _check_range(ptr, n)
    return {"ptr": ptr, "value": value, "nbytes": n}


def host_params(fn: Any, args: Sequence[Any]) -> dict[str, Any]:
    """Validate HOST parameters."""
    if not callable(fn):
        raise InvalidTypeError(f"a host node needs a callable, not {type(fn).__name__}")
    return {"fn": fn, "args": tuple(args)}


def _check_range(ptr: int, n: int) -> None:
    found = range_of(ptr)
    if found is None:
        raise InvalidAddressError(f"{hex(ptr)} is not inside any allocation")
    dev, r = found
    if ptr - r.base + n > r.size:
        raise InvalidAddressError(f"range {hex(ptr)}+{n} leaves its allocation")
    if r.kind == "arena" and dev is not None:  # a pool's: the range must lie in one live block
        dev._impl.endpoint(ptr, n)
