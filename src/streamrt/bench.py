"""``streamrt bench``: run the benchmark scripts of ``benchmarks/`` and tabulate claim vs peer.

Each script exposes ``run(quick: bool) -> dict`` whose ``"rows"`` is a list of
``{"claim", "ours", "peer", "unit", "ratio", "target", "pass"}`` dicts (ours/peer in the unit),
optionally ``"extrapolated": True`` for a row whose ``--quick`` sizes stand in for the claim's.
``--runs N`` repeats the whole set N times: the table then gives each row's median and range,
and a row passes only if it passed in every run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
ORDER = (
    "eager_launch", "pool_alloc", "pool_footprint", "ops_cache", "graph_replay",
    "graph_instantiate", "graph_branches", "sanitizer_overhead", "emu_launch",
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


def collect(quick: bool = False, progress: Any = None,
            only: Sequence[str] | None = None) -> list[dict]:
    """Run the available benchmark scripts (``only``: those named); returns every row."""
    names = [n for n in ORDER if (BENCH_DIR / f"{n}.py").exists() and (not only or n in only)]
    rows: list[dict] = []
    for i, name in enumerate(names):
        if progress:
            progress(i, len(names), name)
        t0 = time.perf_counter()
        result = _load(name).run(quick=quick)
        for row in result.get("rows", []):
            row = {"bench": name, "seconds": round(time.perf_counter() - t0, 2), **row}
            if quick and row.get("extrapolated") and "extrapolat" not in row["claim"]:
                row["claim"] += " (extrapolated from --quick sizes)"
            rows.append(row)
    if progress:
        progress(len(names), len(names), "done")
    return rows


def summarize(runs: list[list[dict]]) -> list[dict]:
    """One row per claim over whole runs: medians, the ratio's range, passed in every run."""
    out = []
    for same in zip(*runs, strict=True):
        ratios = [r["ratio"] for r in same]
        out.append({**same[0], "ours": _median([r["ours"] for r in same]),
                    "peer": _median([r["peer"] for r in same]), "ratio": _median(ratios),
                    "ratio_min": min(ratios), "ratio_max": max(ratios),
                    "pass": all(r["pass"] for r in same),
                    "passed_runs": sum(bool(r["pass"]) for r in same), "runs": len(same)})
    return out


def _median(values: list[Any]) -> Any:
    if not all(isinstance(v, int | float) for v in values):
        return values[0]
    return statistics.median(values)


def machine_info() -> dict[str, Any]:
    """The machine and software the figures come from (for the JSON output)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cores": os.cpu_count(), "cpu": cpu, "arch": platform.machine(),
            "platform": platform.platform(), "python": platform.python_version(),
            "numpy": np.__version__, "streamrt": __version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def machine() -> str:
    """One line naming the machine and software the figures come from."""
    m = machine_info()
    return (f"{m['cores']} cores ({m['cpu']}, {m['arch']}), Python {m['python']}, "
            f"numpy {m['numpy']}, streamrt {m['streamrt']}")


def markdown(rows: list[dict]) -> str:
    """The results as a Markdown table (for the README); summarized rows show their range."""
    runs = rows[0].get("runs", 1) if rows else 1
    ratio = "ratio" if runs == 1 else f"ratio: median (range over {runs} runs)"
    out = [f"| claim | ours | peer / limit | {ratio} | target | pass |", "|---|---|---|---|---|---|"]
    for r in rows:
        span = "" if runs == 1 else f" ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})"
        ok = "yes" if r["pass"] else "NO"
        if runs > 1 and not r["pass"]:
            ok += f" ({r['passed_runs']}/{runs})"
        out.append(
            f"| {r['claim']} | {_fmt(r['ours'])} {r['unit']} | {_fmt(r['peer'])} {r['unit']} "
            f"| {r['ratio']:.2f}x{span} | {r['target']} | {ok} |"
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
            markdown_path: str | None = None, only: Sequence[str] | None = None,
            runs: int = 1) -> int:
    """Entry point of ``streamrt bench``; returns the exit status."""
    if not BENCH_DIR.is_dir():
        print(f"streamrt bench: no benchmarks directory at {BENCH_DIR} (run from a source checkout)",
              file=sys.stderr)
        return 2
    results = []
    for i in range(runs):
        if runs > 1:
            print(f"run {i + 1}/{runs}", file=sys.stderr)
        results.append(collect(quick=quick, progress=_bar, only=only))
    rows = summarize(results) if runs > 1 else results[0]
    table = markdown(rows)
    print(table)
    print(f"\nmachine: {machine()}")
    if json_path:
        doc = {"machine": machine_info(), "quick": quick, "runs": runs, "rows": rows}
        if runs > 1:
            doc["each_run"] = results
        Path(json_path).write_text(json.dumps(doc, indent=2))
    if markdown_path:
        Path(markdown_path).write_text(table + f"\n\nMachine: {machine()}.\n")
    return 0 if all(r["pass"] for r in rows) else 1
