"""API.md §8: the command line (help, info, demo, usage errors)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import _events

pytestmark = [pytest.mark.api, pytest.mark.timeout(120)]




CLI = [sys.executable, "-m", "streamrt.cli"]


def _cli(*args, timeout=240):
    exe = os.path.join(os.path.dirname(sys.executable), "streamrt")
    cmd = [exe, *args] if os.path.exists(exe) else [sys.executable, "-m", "streamrt", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_cli_help():
    r = _cli("--help")
    assert r.returncode == 0
    for w in ("demo", "bench", "info"):
        assert w in r.stdout


def test_cli_demo_help_flags():
    r = _cli("demo", "--help")
    assert r.returncode == 0
    for w in ("--device", "--only", "--trace"):
        assert w in r.stdout
    r = _cli("bench", "--help")
    assert r.returncode == 0
    for w in ("--quick", "--json", "--markdown"):
        assert w in r.stdout


def test_cli_info():
    r = _cli("info")
    assert r.returncode == 0 and "cpu" in r.stdout


@pytest.mark.parametrize("only", ["streams", "pools", "ops", "graphs"])
def test_cli_demo_only(only):
    r = _cli("demo", "--only", only, "--device", "cpu:0")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.strip()


def test_cli_demo_trace(tmp_path):
    path = tmp_path / "d.json"
    r = _cli("demo", "--only", "streams", "--trace", str(path))
    assert r.returncode == 0, r.stderr
    assert len(_events(path)) > 0


def test_cli_bad_usage():
    assert _cli("nonsense").returncode != 0
    assert _cli("demo", "--only", "nope").returncode != 0
    assert _cli("demo", "--device", "cuda:99").returncode != 0
