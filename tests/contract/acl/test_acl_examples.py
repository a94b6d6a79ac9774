"""examples/acl/: the three seeds' programs in pyACL's spelling run, check their results and,
under the sanitizer, report nothing; a planted bug is reported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "acl"


SEEDS = {
    "pool_seed000.py": "add_custom 40 + 2 = 42",
    "two_phase_seed001.py": "match numpy; a bad shape is refused in phase 1 (161002",
    "graph_seed002.py": "replayed (src 4.0, dst 5.0), updated in place",
}


def test_each_seed_has_its_acl_program():
    assert {p.name for p in EXAMPLES.glob("*_seed*.py")} == set(SEEDS)


@pytest.mark.parametrize("sanitize", [False, True], ids=["plain", "sanitized"])
@pytest.mark.parametrize("runner", [[], ["-m", "streamrt.acl"]], ids=["python", "runner"])
@pytest.mark.parametrize("example", sorted(SEEDS))
def test_seed_program_runs_and_checks_its_results(example, runner, sanitize):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("STREAMRT_SANITIZE", None)
    if sanitize:
        env["STREAMRT_SANITIZE"] = "1"
    r = subprocess.run([sys.executable, *runner, str(EXAMPLES / example)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert SEEDS[example] in r.stdout, r.stdout
    assert r.stderr == "", r.stderr  # the sanitizer's report (leaks at exit too) says nothing


def test_pool_seed000_with_a_free_on_an_unordered_stream_is_reported(tmp_path):
    # planted: the output ptr3 is freed on another stream, unordered with stream1's kernel that
    # writes it and the copy that reads it back (the seed frees in stream1's order)
    src = (EXAMPLES / "pool_seed000.py").read_text()
    planted = src.replace(
        'check("aclrtMemPoolFreeAsync", acl.rt.mem_pool_free_async(ptr3, stream1))',
        'other, _ = acl.rt.create_stream()\n'
        '    check("aclrtMemPoolFreeAsync", acl.rt.mem_pool_free_async(ptr3, other))\n'
        '    check("sync other", acl.rt.synchronize_stream(other))')
    assert planted != src
    (tmp_path / "kernels.py").write_text((EXAMPLES / "kernels.py").read_text())
    (tmp_path / "planted.py").write_text(planted)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "STREAMRT_SANITIZE": "1"}
    r = subprocess.run([sys.executable, str(tmp_path / "planted.py")], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode != 0
    assert "ret=507053" in r.stdout + r.stderr, r.stdout + r.stderr
