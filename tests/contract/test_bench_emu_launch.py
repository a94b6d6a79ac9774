"""``benchmarks/emu_launch.py`` runs end to end (a smoke run) and reports its rows.

The script in a subprocess, ``--quick --json`` with ``STREAMRT_BENCH_SMOKE=1``: the emulated
vector add checks its result against numpy before it times anything; the rows carry streamrt's
figure, the peer's and their ratio. Times and ratios are never asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamrt.emu.build import unavailable

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(unavailable() is not None, reason=f"CUDA C cannot run on cpu here: {unavailable()}")
def test_bench_emu_launch_smoke_run_reports_both_rows():
    env = dict(os.environ, STREAMRT_BENCH_SMOKE="1")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "emu_launch.py"),
                           "--quick", "--json"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout.splitlines()[-1])["rows"]
    assert len(rows) == 2
    for row in rows:
        assert "CUDA C vector add of" in row["claim"] and "vs np.add" in row["claim"]
        assert {"claim", "ours", "peer", "unit", "ratio", "target", "pass"} <= set(row)
        assert row["ours"] > 0 and row["peer"] > 0 and row["ratio"] > 0, row
        assert row["target"] == "reported"
