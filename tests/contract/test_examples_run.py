"""The seed programs in examples/ run and succeed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from streamrt import emu

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.py"))


def test_examples_exist():
    assert {p.name for p in EXAMPLES} >= {
        "stream_ordered_pool.py", "two_phase_invoke.py", "graph_capture.py",
        "jacobi_until_converged.py", "cuda_c_everywhere.py"}


# examples whose kernels are CUDA C: on the cpu backend they need the emulator's g++
NEEDS_GXX = {"cuda_c_everywhere"}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_run(path):
    if path.stem in NEEDS_GXX and emu.unavailable() is not None:
        pytest.skip(f"{path.name} runs CUDA C on the cpu backend, which needs g++: "
                    f"{emu.unavailable()}")
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip()
