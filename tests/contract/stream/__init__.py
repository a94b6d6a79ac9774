"""Contract tests of the stream objects on every backend (see conftest.py)."""
