"""Unmodified pyACL programs (``import acl``) run under ``python -m streamrt.acl`` and print
their success line; the runner resolves ``acl`` to the facade for that run only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PROGRAMS = Path(__file__).resolve().parent / "programs"


def run(args, *, sanitize=False, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("STREAMRT_SANITIZE", None)
    if sanitize:
        env["STREAMRT_SANITIZE"] = "1"
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=cwd)


CASES = [
    ("vector_roundtrip.py", [], "vector_roundtrip device 0 n 1024: run success"),
    ("vector_roundtrip.py", ["--device", "1", "--n", "77"],
     "vector_roundtrip device 1 n 77: run success"),
    ("pool_pipeline.py", ["--blocks", "5", "--block_size", "1000"],
     "pool_pipeline: 5 blocks of 1000 bytes, run success"),
    ("error_codes.py", [], "error_codes: run success"),
    ("scrub_and_free.py", [], "scrub_and_free n 4096: run success"),
]


@pytest.mark.parametrize("sanitize", [False, True], ids=["plain", "sanitized"])
@pytest.mark.parametrize(("program", "args", "line"), CASES,
                         ids=[f"{c[0][:-3]}{'-' if c[1] else ''}{'_'.join(c[1])}" for c in CASES])
def test_program_runs_unmodified_and_prints_its_success_line(program, args, line, sanitize):
    r = run(["-m", "streamrt.acl", str(PROGRAMS / program), *args], sanitize=sanitize)
    assert r.returncode == 0, r.stdout + r.stderr
    assert line in r.stdout.splitlines()[-1]


def test_a_missing_stream_wait_is_reported_by_the_sanitizer(tmp_path):
    # the same program with its aclrtStreamWaitEvent removed: the copy back races the copy in
    src = (PROGRAMS / "vector_roundtrip.py").read_text()
    planted = tmp_path / "planted.py"
    planted.write_text("\n".join(line for line in src.splitlines()
                                 if "acl.rt.stream_wait_event" not in line))
    r = run(["-m", "streamrt.acl", str(planted)], sanitize=True)
    assert r.returncode != 0
    assert "synchronize_stream failed ret=507053" in r.stderr  # ACL_ERROR_RT_DEVICE_MEM_ERROR
    assert "race" in r.stderr and "planted.py" in r.stderr  # the lines of the two copies



def test_a_missing_synchronize_before_acl_free_is_reported_by_the_sanitizer(tmp_path):
    # aclrtFree waits for no stream work: with the synchronize before it removed, the wiping
    # kernel may still run on freed memory (srt.free, cudaFree's order, would hide it)
    src = (PROGRAMS / "scrub_and_free.py").read_text().splitlines()
    kept = [line for line in src if "# before aclrtFree" not in line]
    assert len(kept) == len(src) - 1
    planted = tmp_path / "planted.py"
    planted.write_text("\n".join(kept) + "\n")
    (tmp_path / "scrub_kernels.py").write_text((PROGRAMS / "scrub_kernels.py").read_text())
    free_line = next(i for i, line in enumerate(kept, 1) if "acl.rt.free(dev)" in line)
    launch_line = next(i for i, line in enumerate(kept, 1) if "acl.rt.launch_kernel(" in line)
    r = run(["-m", "streamrt.acl", str(planted)], sanitize=True)
    assert r.returncode != 0
    assert "acl.rt.free failed ret=507053" in r.stderr  # ACL_ERROR_RT_DEVICE_MEM_ERROR
    assert "use-after-free: kernel 'scrub'" in r.stderr
    assert f"planted.py:{launch_line}" in r.stderr  # where the kernel was enqueued
    assert "aclrtFree of 0x" in r.stderr and f"planted.py:{free_line}" in r.stderr
    plain = run(["-m", "streamrt.acl", str(planted)])  # unsanitized, the bug goes unseen
    assert plain.returncode == 0 and "run success" in plain.stdout

def test_acl_is_the_facade_only_inside_the_runner(tmp_path):
    prog = tmp_path / "which.py"
    prog.write_text("import sys, acl, acl.rt\nfrom acl import util\n"
                    "import streamrt.acl as f\n"
                    "assert acl is f and acl.rt is f.rt and util is f.util\n"
                    "print('argv', sys.argv[1:], __name__)\n")
    r = run(["-m", "streamrt.acl", str(prog), "--x", "1"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "argv ['--x', '1'] __main__"
    plain = run(["-c", "import streamrt.acl, sys; import acl"])
    assert plain.returncode != 0 and "No module named 'acl'" in plain.stderr


def test_the_programs_directory_is_on_its_path(tmp_path):
    (tmp_path / "helper.py").write_text("VALUE = 42\n")
    (tmp_path / "main.py").write_text("import helper, acl\nprint(helper.VALUE, acl.ACL_SUCCESS)\n")
    r = run(["-m", "streamrt.acl", str(tmp_path / "main.py")], cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "42 0"


def test_runner_usage_errors_and_exit_codes(tmp_path):
    r = run(["-m", "streamrt.acl"])
    assert r.returncode == 2 and "usage" in r.stderr
    r = run(["-m", "streamrt.acl", str(tmp_path / "none.py")])
    assert r.returncode == 2 and "no such file" in r.stderr
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(3)\n")
    assert run(["-m", "streamrt.acl", str(tmp_path / "exits.py")]).returncode == 3
    (tmp_path / "raises.py").write_text("raise RuntimeError('from the program')\n")
    r = run(["-m", "streamrt.acl", str(tmp_path / "raises.py")])
    assert r.returncode == 1 and "from the program" in r.stderr
