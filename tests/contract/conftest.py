"""Fixtures of the contract tests (the root tests/conftest.py has the shared ones)."""

from __future__ import annotations

import pytest


@pytest.fixture
def bdev(any_dev):
    """Device 0 of each backend (conftest's ``any_dev``)."""
    return any_dev
