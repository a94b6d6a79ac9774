"""The pyACL programs on the cuda backend (a GPU, or the fake CUDA runtime with
STREAMRT_CUDA_FAKE=1): there ``acl.util``'s buffers are not mapped (the backend has no
``register``), so copies take the buffers themselves."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cuda_reason

ROOT = Path(__file__).resolve().parents[3]
PROGRAMS = Path(__file__).resolve().parent / "programs"
BOOT = ("import os, sys\n"
        "if os.environ.get('STREAMRT_CUDA_FAKE') == '1':\n"
        "    from tests.cuda.fake import install\n"
        "    install()\n"
        "from streamrt.acl.__main__ import main\n"
        "sys.exit(main(sys.argv[1:]))\n")


@pytest.mark.cuda
@pytest.mark.parametrize(("program", "line"), [
    ("vector_roundtrip.py", "run success"), ("pool_pipeline.py", "run success"),
    ("error_codes.py", "run success")])
def test_program_runs_on_cuda(program, line):
    reason = cuda_reason()
    if reason:
        pytest.skip(reason)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}",
           "STREAMRT_DEVICE": "cuda"}
    r = subprocess.run([sys.executable, "-c", BOOT, str(PROGRAMS / program)],
                       capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert line in r.stdout
