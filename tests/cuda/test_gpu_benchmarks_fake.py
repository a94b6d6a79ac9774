"""The GPU benchmark scripts (``benchmarks/gpu_*.py``) run end to end on the fake CUDA runtime.

A GPU session is rare and short: a script bug (a raw cuda-bindings peer calling a function wrong,
a crash in a report) must show here first. Each script runs in a subprocess with
``tests/cuda/fake`` installed, in ``--quick --json`` mode with ``STREAMRT_BENCH_SMOKE=1`` (a few
items, one repetition: the emulated kernels are slow). Checked: the exit status, that every row
has streamrt's figure, the peer's and their ratio (CuPy and PyTorch peers are absent here: their
rows and notes say so), and that no row reports an error. Times and ratios are never asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(os.environ.get("STREAMRT_CUDA_FAKE") != "1",
                       reason="runs the GPU benchmarks on the fake CUDA runtime: set STREAMRT_CUDA_FAKE=1"),
]

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ("gpu_launch", "gpu_graph", "gpu_pool", "gpu_ops")
# the scripts exit 0 whatever their verdict (``pass`` in the JSON); none documents another status
OK_STATUS = (0,)
# the peer of a script whose rows all compare with a library that is absent here
LIBRARY_PEER = {"gpu_ops": "cupy"}

LAUNCHER = """
import runpy, sys
from tests.cuda.fake import install
install()
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _run(name: str) -> tuple[dict, subprocess.CompletedProcess]:
    from tests.cuda.emu import emu
    from tests.cuda.fake import installed, unavailable

    # here (conftest) the fake is installed already: only the kernel emulator may be missing
    why = emu.unavailable() if installed() else unavailable()
    if why is not None:
        pytest.skip(f"the fake CUDA runtime cannot run here: {why}")
    env = dict(os.environ, STREAMRT_BENCH_SMOKE="1", STREAMRT_CUDA_FAKE="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "benchmarks"), str(ROOT),
                                           os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    proc = subprocess.run([sys.executable, "-c", LAUNCHER, str(ROOT / "benchmarks" / f"{name}.py"),
                           "--quick", "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"{name}: no JSON on stdout (exit {proc.returncode})\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1]), proc


@pytest.mark.parametrize("name", SCRIPTS)
def test_gpu_benchmark_runs_on_fake(name: str) -> None:
    res, proc = _run(name)
    assert proc.returncode in OK_STATUS, f"{name}: exit {proc.returncode}\n{proc.stderr}"
    assert "skipped" not in res, f"{name} skipped on the fake: {res['skipped']}"
    assert res["rows"], f"{name}: no rows"
    assert isinstance(res["pass"], bool)
    library = LIBRARY_PEER.get(name)
    for r in res["rows"]:
        claim = r["claim"]
        assert isinstance(r["ours"], float) and r["ours"] > 0, f"{name}: {claim}: no streamrt figure: {r}"
        if library is not None:  # CuPy is not here: the row says so, and nothing else went wrong
            assert r["peer"] is None and r["ratio"] is None, r
            assert r.get("error") == f"{library}: not installed or sees no GPU", r
            assert any(n.startswith(f"{library}: not installed") for n in res["notes"]), res["notes"]
            continue
        assert "error" not in r, f"{name}: {claim}: {r['error']}"
        assert isinstance(r["peer"], float) and r["peer"] > 0, f"{name}: {claim}: no peer figure: {r}"
        assert isinstance(r["ratio"], float), f"{name}: {claim}: no ratio: {r}"
        assert r["target"] == "info" or r["target"].startswith("<= "), r
    assert "Traceback" not in proc.stderr, proc.stderr
