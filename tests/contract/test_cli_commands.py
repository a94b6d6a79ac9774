"""The streamrt command, run in a subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import streamrt as streamrt_pkg


def streamrt(*args: str, timeout: int = 120, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamrt.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=None if env is None else {**os.environ, **env})


def test_cli_info():
    r = streamrt("info")
    assert r.returncode == 0, r.stderr
    assert "cpu:0" in r.stdout and "cpu:1" in r.stdout
    assert "STREAMRT_CPU_DELAY_US" in r.stdout and "cuda" in r.stdout
    # whether CUDA C kernels can run on the cpu backend here, and if not why
    from streamrt.emu.build import unavailable

    why = unavailable()
    assert ("CUDA C kernels on cpu (the emulator): yes" in r.stdout) == (why is None), r.stdout
    # every setting the package reads is listed
    src = Path(streamrt_pkg.__file__).parent
    read = {m for f in src.rglob("*.py") for m in re.findall(r"STREAMRT_[A-Z_]+", f.read_text())}
    assert read and all(k in r.stdout for k in read), read - set(re.findall(r"STREAMRT_\w+",
                                                                           r.stdout))


def test_cli_demo_runs_and_checks():
    r = streamrt("demo")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all checks passed" in r.stdout
    assert "[FAILED]" not in r.stdout
    assert "reuse_internal_dependency" in r.stdout  # the pool section says which rule served
    assert "42" in r.stdout


@pytest.mark.parametrize("section", ["streams", "pools", "ops", "graphs"])
def test_cli_demo_only(section):
    r = streamrt("demo", "--only", section, "--device", "cpu:1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cpu:1" in r.stdout


@pytest.mark.parametrize("args", [("demo", "--bogus"), ("nosuch",), ("demo", "--only", "x"),
                                  ("--bogus",), ()])
def test_cli_usage_errors_are_clean(args):
    r = streamrt(*args)
    assert r.returncode == 2
    assert "usage:" in r.stderr and "Traceback" not in r.stderr
    if "--bogus" in args:  # the flag is named (not "arguments are required: cmd")
        assert "unrecognized arguments: --bogus" in r.stderr


def test_cli_unknown_device_is_clean():
    r = streamrt("demo", "--device", "cpu:42")
    assert r.returncode == 2
    assert "cpu:42" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("cmd", [(), ("demo",), ("bench",), ("info",)])
def test_cli_help(cmd):
    r = streamrt(*cmd, "--help")
    assert r.returncode == 0 and "usage:" in r.stdout


def test_cli_bench_quick_emits_json_and_markdown(tmp_path):
    import json

    js, md = tmp_path / "b.json", tmp_path / "b.md"
    # a smoke run (every count cut to a few): the whole set, end to end, in seconds, also under
    # the sanitizer (whose suite runs this too); the figures are not what is checked here
    r = streamrt("bench", "--quick", "--json", str(js), "--markdown", str(md), timeout=100,
                 env={"STREAMRT_BENCH_SMOKE": "1"})
    assert r.returncode in (0, 1), r.stderr  # 1: some target missed; still a complete table
    doc = json.loads(js.read_text())
    assert doc["quick"] is True and doc["runs"] == 1
    assert {"cores", "cpu", "python", "numpy", "streamrt"} <= set(doc["machine"])
    rows = doc["rows"]
    assert {row["bench"] for row in rows} >= {
        "eager_launch", "pool_alloc", "pool_footprint", "ops_cache", "graph_replay",
        "graph_instantiate", "graph_branches", "sanitizer_overhead"}
    for row in rows:
        assert {"claim", "ours", "peer", "unit", "ratio", "target", "pass"} <= set(row)
        assert row["ratio"] > 0
    assert (r.returncode == 0) == all(row["pass"] for row in rows)
    table = md.read_text()
    assert table.startswith("| claim | ours | peer / limit | ratio | target | pass |")
    assert table.count("\n|") == len(rows) + 1 and "Machine:" in table


def test_cli_demo_trace_writes_the_whole_demo(tmp_path):
    import json

    path = tmp_path / "demo.json"
    r = streamrt("demo", "--trace", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert str(path) in r.stdout
    events = json.loads(path.read_text())["traceEvents"]
    cats = {e.get("cat") for e in events if e["ph"] == "X"}
    assert {"kernel", "memcpy", "graph", "host"} <= cats  # streams, ops, graphs sections
    assert any(e["ph"] == "C" for e in events) and any(e["ph"] == "i" for e in events)


def test_cli_demo_exit_status_and_arguments(monkeypatch, tmp_path):
    # in process, with the demo replaced: failed checks give exit 1, with or without --trace
    from streamrt import cli, demos

    calls = []
    result = {"failed": 3}

    def fake_run(device=None, only=None, out=print):
        calls.append((device, only))
        return result["failed"]

    monkeypatch.setattr(demos, "run", fake_run)
    assert cli.main(["demo", "--device", "cpu:1", "--only", "pools"]) == 1
    assert cli.main(["demo", "--only", "ops", "--trace", str(tmp_path / "t.json")]) == 1
    result["failed"] = 0
    assert cli.main(["demo"]) == 0
    assert cli.main(["demo", "--trace", str(tmp_path / "u.json")]) == 0
    assert calls == [("cpu:1", "pools"), (None, "ops"), (None, None), (None, None)]


def test_cli_bench_exit_status_and_arguments(monkeypatch):
    from streamrt import bench, cli

    calls = []

    def fake_run_all(**kw):
        calls.append(kw)
        return len(calls) % 2  # 1, then 0

    monkeypatch.setattr(bench, "run_all", fake_run_all)
    assert cli.main(["bench", "--quick", "--json", "a.json", "--markdown", "b.md"]) == 1
    assert cli.main(["bench"]) == 0
    assert cli.main(["bench", "--only", "pool_alloc", "--only", "ops_cache", "--runs", "3"]) == 1
    assert calls == [dict(quick=True, json_path="a.json", markdown_path="b.md", only=None, runs=1),
                     dict(quick=False, json_path=None, markdown_path=None, only=None, runs=1),
                     dict(quick=False, json_path=None, markdown_path=None,
                          only=["pool_alloc", "ops_cache"], runs=3)]
    for bad in (["--only", "bogus"], ["--runs", "0"], ["--runs", "two"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(["bench", *bad])
        assert exc.value.code == 2
    assert len(calls) == 3


def _fake_bench(tmp_path, monkeypatch, script: str) -> None:
    from streamrt import bench

    (tmp_path / "fake_one.py").write_text(script)
    monkeypatch.setattr(bench, "BENCH_DIR", tmp_path)
    monkeypatch.setattr(bench, "ORDER", ("fake_one", "absent"))


def test_bench_runs_only_the_named_script_and_labels_extrapolated_rows(tmp_path, monkeypatch):
    from streamrt import bench

    _fake_bench(tmp_path, monkeypatch, (
        "def run(quick):\n"
        "    return {'rows': [dict(claim='big', ours=2.0, peer=1.0, unit='us', ratio=2.0,\n"
        "                          target='<= 3x', extrapolated=True, **{'pass': True})]}\n"))
    assert bench.collect(only=["absent"]) == []
    full, quick = bench.collect(only=["fake_one"]), bench.collect(quick=True, only=["fake_one"])
    assert full[0]["claim"] == "big" and full[0]["bench"] == "fake_one"
    assert quick[0]["claim"] == "big (extrapolated from --quick sizes)"


def test_bench_several_runs_give_medians_ranges_and_pass_only_if_every_run_passed(
        tmp_path, monkeypatch, capsys):
    import json

    from streamrt import bench

    _fake_bench(tmp_path, monkeypatch, (
        "import pathlib\n"
        "def run(quick):\n"  # each run loads the script afresh: the run count lives in a file
        "    f = pathlib.Path(__file__).with_suffix('.count')\n"
        "    n = int(f.read_text()) if f.exists() else 0\n"
        "    f.write_text(str(n + 1))\n"
        "    r = [1.0, 4.0, 2.0][n]\n"
        "    return {'rows': [dict(claim='c', ours=r, peer=1.0, unit='us', ratio=r,\n"
        "                          target='<= 3x', **{'pass': r <= 3})]}\n"))
    js = tmp_path / "out.json"
    assert bench.run_all(runs=3, json_path=str(js)) == 1  # the second run missed the target
    doc = json.loads(js.read_text())
    (row,) = doc["rows"]
    assert (row["ratio"], row["ratio_min"], row["ratio_max"]) == (2.0, 1.0, 4.0)
    assert row["pass"] is False and row["passed_runs"] == 2 and len(doc["each_run"]) == 3
    out = capsys.readouterr().out
    assert "median (range over 3 runs)" in out and "| 2.00x (1.00-4.00) |" in out
    assert "| NO (2/3) |" in out


def test_cli_info_in_process(capsys):
    from streamrt import cli

    assert cli.main(["info"]) == 0
    assert "cpu:0" in capsys.readouterr().out


SETTINGS = {  # (variable, value) -> what `streamrt info` says is in effect; None: refused
    ("STREAMRT_SANITIZE", "off"): "sanitizer off",
    ("STREAMRT_SANITIZE", "No"): "sanitizer off",
    ("STREAMRT_SANITIZE", "COLLECT"): "sanitizer on",
    ("STREAMRT_SANITIZE", "true"): "sanitizer on",
    ("STREAMRT_LAUNCH_BLOCKING", "yes"): "launch blocking True",
    ("STREAMRT_LAUNCH_BLOCKING", "false"): "launch blocking False",
    ("STREAMRT_CPU_DELAY_US", " 7 "): "cpu delay 7 us",
    ("STREAMRT_SANITIZE", "2"): "sanitizer on",  # an integer: non-zero is on, as before
    ("STREAMRT_LAUNCH_BLOCKING", "2"): "launch blocking True",
    ("STREAMRT_PURE_PYTHON", "yes"): "kernel views in Python",
    ("STREAMRT_PURE_PYTHON", "maybe"): None,
    ("STREAMRT_SANITIZE", "loud"): None,
    ("STREAMRT_LAUNCH_BLOCKING", "maybe"): None,
    ("STREAMRT_OPS_LOG", "verbose"): None,
    ("STREAMRT_CPU_DELAY_US", "-5"): None,  # every worker died of it, and synchronize hung
    ("STREAMRT_CPU_DELAY_US", "abc"): None,
    ("STREAMRT_CPU_DEVICES", "abc"): None,
    ("STREAMRT_CPU_DEVICES", "-1"): None,
    ("STREAMRT_CPU_MEMORY", "-1"): None,  # every allocation failed
    ("STREAMRT_TRACE", "/proc/no/such/dir/t.json"): None,  # found only at exit, after the run
}


@pytest.mark.parametrize("setting", list(SETTINGS), ids="=".join)
def test_cli_settings_are_read_strictly(setting):
    # "false" or "off" once switched the sanitizer on, and a bad value was taken for another
    import os

    name, value = setting
    r = subprocess.run([sys.executable, "-m", "streamrt.cli", "info"], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, **{name: value}))
    want = SETTINGS[setting]
    if want is None:
        assert r.returncode != 0 and name in r.stderr and "InvalidValueError" in r.stderr or (
            r.returncode == 2 and f"streamrt info: environment variable {name}" in r.stderr)
    else:
        assert r.returncode == 0, r.stderr
        assert want in r.stdout
