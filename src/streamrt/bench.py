"""``streamrt bench``: run every benchmark script of ``benchmarks/`` and tabulate claim vs peer.

Each script exposes ``run(quick: bool) -> dict`` whose ``"rows"`` is a list of
``{"claim", "ours", "peer", "unit", "ratio", "target", "pass"}`` dicts (ours/peer in the unit).
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
ORDER = (
    "eager_launch", "pool_alloc", "pool_footprint", "ops_cache", "graph_replay",
    "graph_instantiate", "graph_branches", "sanitizer_overhead",
)


def _load(name: str) -> Any:
    if str(BENCH_DIR) not in sys.path:  # the scripts share benchmarks/_common.py
        sys.path.insert(0, str(BENCH_DIR))
    path = BENCH_DIR / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"streamrt_bench_{name}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def collect(quick: bool = False, progress: Any = None) -> list[dict]:
    """Run the available benchmark scripts; returns every row (missing scripts are skipped)."""
    names = [n for n in ORDER if (BENCH_DIR / f"{n}.py").exists()]
    rows: list[dict] = []
    for i, name in enumerate(names):
        if progress:
            progress(i, len(names), name)
        t0 = time.perf_counter()
        result = _load(name).run(quick=quick)
        for row in result.get("rows", []):
            rows.append({"bench": name, "seconds": round(time.perf_counter() - t0, 2), **row})
    if progress:
        progress(len(names), len(names), "done")
    return rows


def machine() -> str:
    """One line naming the machine and software the figures come from."""


    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{os.cpu_count()} cores ({cpu}, {platform.machine()}), Python "
            f"{platform.python_version()}, numpy {np.__version__}")


def markdown(rows: list[dict]) -> str:
    """The results as a Markdown table (for the README)."""
    out = ["| claim | ours | peer / limit | ratio | target | pass |", "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| {r['claim']} | {_fmt(r['ours'])} {r['unit']} | {_fmt(r['peer'])} {r['unit']} "
            f"| {r['ratio']:.2f}x | {r['target']} | {'yes' if r['pass'] else 'NO'} |"
        )
    return "\n".join(out)


def _fmt(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _bar(i: int, n: int, name: str) -> None:
    width = 24
    done = int(width * i / max(n, 1))
    sys.stderr.write(f"\r[{'#' * done}{'.' * (width - done)}] {i}/{n} {name:24s}")
    if i == n:
        sys.stderr.write("\n")
    sys.stderr.flush()


def run_all(quick: bool = False, json_path: str | None = None,
            markdown_path: str | None = None) -> int:
    """Entry point of ``streamrt bench``; returns the exit status."""
    if not BENCH_DIR.is_dir():
        print(f"streamrt bench: no benchmarks directory at {BENCH_DIR} (run from a source checkout)",
              file=sys.stderr)
        return 2
    rows = collect(quick=quick, progress=_bar)
    table = markdown(rows)
    print(table)
    print(f"\nmachine: {machine()}")
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=2))
    if markdown_path:
        Path(markdown_path).write_text(table + f"\n\nMachine: {machine()}.\n")
    return 0 if all(r["pass"] for r in rows) else 1
