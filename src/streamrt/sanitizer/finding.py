"""Findings: the stream-ordering bugs the sanitizer reports, each with its kind and operations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..instrument import OpInfo

KINDS = ("race", "use-after-free", "use-before-alloc", "out-of-bounds", "invalid-address",
         "workspace", "leak")


@dataclass
class Finding:
    """One stream-ordering bug: what, where, and the two operations involved."""

    kind: str
    ptr: int
    nbytes: int
    message: str
    op: Any = None
    other: Any = None
    streams: tuple = field(default_factory=tuple)

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


def _finding(kind: str, ptr: int, nbytes: int, op: Any, other: Any, msg: str) -> Finding:
    streams = tuple(x.where() if isinstance(x, OpInfo) else x.describe()
                    for x in (op, other) if x is not None)
    return Finding(kind, ptr, nbytes, msg, op, other, streams)
