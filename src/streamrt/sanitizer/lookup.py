"""The address index of every remembered generation (live or freed), for the accesses the
exact-base and live-base lookups cannot place (``checker``): the generations whose memory holds
an address, found without scanning those that cannot reach it.

State and invariants (guarded by the checker's lock): per size class k, the generations whose
memory (``cap - lo``) spans fewer than ``2**k`` bytes, by base; one that holds an address lies
less than ``2**k`` below it, so each class is searched over that window only.
"""

from __future__ import annotations

from sortedcontainers import SortedList

from .generation import _Gen

_NONE = 1 << 62


class SizeIndex:
    """Generations by size class and base (see the module docstring)."""

    __slots__ = ("_classes", "_by_uid")

    def __init__(self) -> None:
        self._classes: dict[int, SortedList] = {}
        self._by_uid: dict[int, _Gen] = {}

    def clear(self) -> None:
        self._classes.clear()
        self._by_uid.clear()

    def add(self, g: _Gen) -> None:
        self._by_uid[g.uid] = g
        k = (g.cap - g.lo).bit_length()
        cls = self._classes.get(k)
        if cls is None:
            cls = self._classes[k] = SortedList()
        cls.add((g.lo, g.uid))

    def discard(self, g: _Gen) -> None:
        if self._by_uid.pop(g.uid, None) is not None:
            self._classes[(g.cap - g.lo).bit_length()].discard((g.lo, g.uid))

    def around(self, lo: int, hi: int) -> list[_Gen]:
        """The generations whose memory holds ``lo``, else those overlapping ``[lo, hi)``."""
        found: list[_Gen] = []
        for stop in (lo + 1, hi):
            for k, cls in self._classes.items():
                for _base, uid in cls.irange((lo - (1 << k) + 1,), (stop - 1, _NONE)):
                    g = self._by_uid[uid]
                    if g.lo < stop and lo < g.cap:
                        found.append(g)
            if found:
                break
        return found
