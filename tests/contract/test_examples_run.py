"""The seed programs in examples/ run and succeed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.py"))


def test_examples_exist():
    assert {p.name for p in EXAMPLES} >= {
        "stream_ordered_pool.py", "two_phase_invoke.py", "graph_capture.py",
        "jacobi_until_converged.py"}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_run(path):
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip()
