"""Contract tests of the graph objects on every backend (see conftest.py)."""
