"""``aclrtResetDevice``: what a device reset destroys, and in which order.

It sits above everything it destroys (captures, graph execs and their memory, streams, events,
pools, allocations); ``Device.reset`` imports it when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import StreamRTError
from .event import UNRECORDED
from .graph import memory as graph_memory
from .graph.capture import abandon
from .sync import synchronize_device
from .weak import members

if TYPE_CHECKING:
    from .device import Device

__all__ = ["reset_device"]


def reset_device(device: Device) -> None:
    """``aclrtResetDevice``: synchronize, then destroy the device's graph execs, streams, pools,
    events and memory."""
    abandon(device)  # captures with a stream of the device end, returning no graph
    try:
        synchronize_device(device)
    except StreamRTError:
        pass  # a reset discards pending failures along with everything else
    for ge in members(device._execs):
        if not ge._destroyed:
            ge.destroy()  # before the memory goes: it unmaps and frees its graph memory
    for mem in list(graph_memory.held):  # retired memory kept for live allocations: gone too
        if any(arena[0] is device for arena in mem.arenas):
            mem.release(force=True)
    for s in members(device._streams):
        s._destroy_quiet()
    device._legacy = None
    device._retired.clear()
    for e in members(device._events):  # destroyed, as aclrtResetDevice destroys them
        e._rec = UNRECORDED  # and its record, which names streams that are gone
        e.destroy()
    for pool in members(device._pools):
        pool._reset()
    device._default_pool = None
    device._pool = None
    device._impl.free_all()
