"""Stream capture state machine (DESIGN.md §5)."""

from __future__ import annotations

from typing import Any


def check_device_sync(device: Any) -> None:
    """Refuse a device synchronize while one of its streams captures."""


def check_unsafe(what: str) -> None:
    """Gate the mode-dependent ("unsafe") synchronous calls during capture."""
