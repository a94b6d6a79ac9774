"""examples/acl/: the seeds' programs in pyACL's spelling run, check their results and, under
the sanitizer, report nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "acl"


@pytest.mark.parametrize("sanitize", [False, True], ids=["plain", "sanitized"])
@pytest.mark.parametrize("runner", [[], ["-m", "streamrt.acl"]], ids=["python", "runner"])
def test_pool_seed000_runs_and_checks_its_sum(runner, sanitize):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("STREAMRT_SANITIZE", None)
    if sanitize:
        env["STREAMRT_SANITIZE"] = "1"
    r = subprocess.run([sys.executable, *runner, str(EXAMPLES / "pool_seed000.py")],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "add_custom 40 + 2 = 42" in r.stdout and "every ret == ACL_SUCCESS" in r.stdout


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
    (tmp_path / "add_custom_kernels.py").write_text((EXAMPLES / "add_custom_kernels.py").read_text())
    (tmp_path / "planted.py").write_text(planted)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "STREAMRT_SANITIZE": "1"}
    r = subprocess.run([sys.executable, str(tmp_path / "planted.py")], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode != 0
    assert "ret=507053" in r.stdout + r.stderr, r.stdout + r.stderr
