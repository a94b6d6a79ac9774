"""The legacy default stream's implicit ordering with blocking streams (DESIGN.md §2).

CUDA legacy semantics: before an operation on the legacy default stream of a device, it waits
for the tail of every blocking stream of that device; before an operation on a blocking stream,
it waits for the legacy stream's tail. A real wait is enqueued only when the stream's clock does
not already cover that tail. While a blocking stream captures, any use of the legacy stream is
refused (graph/refusals.py), as CUDA leaves it unusable until the capture ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .graph.refusals import check_legacy
from .weak import members

if TYPE_CHECKING:
    from .stream import Stream

# set once any capture has begun (before the capture is visible, so another thread's use of a
# legacy stream cannot miss it): until then the capture check costs nothing
capturing = False


def order(s: Stream) -> None:
    """Order ``s`` (a blocking or legacy stream) after the other side's tail, where needed."""
    dev = s.device
    if s._legacy:
        if capturing:
            check_legacy(s)
        for b in members(dev._blocking):
            if b._pos > s._clock.get(b.id, 0):
                snap = b._snapshot()  # position and clock of one moment (see Stream._snapshot)
                s._order_after(b, snap[b.id], snap, "legacy stream ordering")
    else:
        legacy = dev._legacy
        if legacy is not None and legacy._pos > s._clock.get(legacy.id, 0):
            snap = legacy._snapshot()
            s._order_after(legacy, snap[legacy.id], snap, "legacy stream ordering")


def check_capture(s: Stream) -> None:
    """Refuse any use of a legacy stream (a synchronize, a query, a wait: not only an enqueue)
    while a blocking stream of its device captures."""
    if capturing and s._legacy:
        check_legacy(s)
