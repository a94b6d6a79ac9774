"""Process-wide hook lists that let lower layers observe stream events without import cycles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Called as ``fn(device)`` after every host synchronize (pools apply their release threshold).
sync_listeners: list[Callable[[Any], None]] = []
