"""``benchmarks/sanitizer_overhead.py`` runs end to end (a smoke run) and reports every row.

As the GPU benchmarks' test does: the script in a subprocess, ``--quick --json`` with
``STREAMRT_BENCH_SMOKE=1`` (a few items, one round). Checked: the rows (on vs off, live
allocations, history, the pipeline) with streamrt's figure, the peer's, their ratio, and no
finding in any configuration; times and ratios are never asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLAIMS = (
    "sanitizer on vs off, tiny-kernel launches",
    "live allocations (one of 64 MiB, made first",
    "live allocations (one of 64 MiB, made last",
    "unordered reads in history vs none",
    "sanitizer on vs off, 2-stream pipeline",
)


def test_bench_sanitizer_overhead_smoke_run_reports_every_row_without_findings():
    env = dict(os.environ, STREAMRT_BENCH_SMOKE="1")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sanitizer_overhead.py"),
                           "--quick", "--json"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout.splitlines()[-1])
    rows = res["rows"]
    assert len(rows) == len(CLAIMS)
    for row, claim in zip(rows, CLAIMS, strict=True):
        assert claim in row["claim"], (claim, row["claim"])
        assert {"claim", "ours", "peer", "unit", "ratio", "target", "pass"} <= set(row)
        assert row["ours"] > 0 and row["peer"] > 0 and row["ratio"] > 0, row
        assert row["findings"] == 0, row  # a correct program: no finding, on or off
    assert res["findings"] == 0
    assert rows[-1]["target"] == "info" and rows[-1]["same_result"] is True
