#!/usr/bin/env bash
# GPU check of streamrt, install-free: the cuda-marked tests and the benchmarks/gpu_*.py scripts.
#
#   scripts/gpu_check.sh [OUTDIR]      (default OUTDIR: <repo>/gpu-check-out)
#
# Environment: PYTHON (default python3), GPU_CHECK_QUICK=1 (benchmarks in --quick mode),
# GPU_CHECK_BUDGET_S (default 345: the whole script stays under 6 minutes).
# Writes exactly six files to OUTDIR (the device runner brings back at most eight):
#   env.txt           nvidia-smi, package versions, `streamrt info`, the host-function probe
#   pytest.log        pytest -m cuda output;  pytest-junit.xml  its JUnit XML
#   bench.log         every benchmark's stderr, exit status and raw JSON
#   summary.json      pytest exit code and counts, each benchmark's rows or error, overall verdict
#   table.md          the benchmark rows as a Markdown table with the GPU model (also printed)
# Exit status: 0 when pytest passed and ran at least one cuda test; non-zero otherwise (benchmark
# results are reported, never fatal).
set -uo pipefail

START=$SECONDS
BUDGET=${GPU_CHECK_BUDGET_S:-345}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) || exit 2
OUTARG=${1:-$ROOT/gpu-check-out}
mkdir -p "$OUTARG" || { echo "gpu_check: cannot create $OUTARG" >&2; exit 2; }
OUT=$(cd "$OUTARG" && pwd) || exit 2  # absolute: the rest runs from the repo root
cd "$ROOT" || exit 2
PY=${PYTHON:-python3}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # pure Python package: no install needed
export PYTHONDONTWRITEBYTECODE=1                     # leave the checkout as it was
QUICK=()
[[ "${GPU_CHECK_QUICK:-0}" == 1 ]] && QUICK=(--quick)
BENCHES=(gpu_launch gpu_graph gpu_pool gpu_ops)
TMP=$(mktemp -d) || exit 2
trap 'rm -rf "$TMP"' EXIT
rm -f "$OUT"/{env.txt,pytest.log,pytest-junit.xml,bench.log,summary.json,table.md}  # no stale results

left() { echo $((BUDGET - (SECONDS - START))); }
note() { echo "[gpu_check $((SECONDS - START))s] $*" >&2; }

# --- environment ------------------------------------------------------------------------------
note "environment -> $OUT/env.txt"
GPU_LINE="no GPU visible (nvidia-smi not found)"
if command -v nvidia-smi >/dev/null 2>&1; then
    GPU_LINE=$(timeout 15 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 \
               | paste -sd ';' -) || GPU_LINE="nvidia-smi failed: ${GPU_LINE:-no output}"
fi
{
    echo "# date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')   host: $(uname -srm)   cpus: $(nproc 2>/dev/null)"
    echo "# gpu: $GPU_LINE"
    echo "## nvidia-smi"
    if command -v nvidia-smi >/dev/null 2>&1; then timeout 15 nvidia-smi; else echo "nvidia-smi: not found"; fi
    echo "## python packages"
    timeout 60 "$PY" - <<'EOF'
import importlib
import importlib.metadata as md
import sys

print("python", sys.version.split()[0], sys.executable)
for dist in ("numpy", "pytest", "pytest-timeout", "cuda-bindings", "cuda-python", "nvidia-cuda-nvrtc",
             "nvidia-cuda-nvrtc-cu12", "cupy-cuda12x", "cupy-cuda13x", "cupy", "torch"):
    try:
        print(f"{dist:24s} {md.version(dist)}")
    except md.PackageNotFoundError:
        pass
for name, probe in (
    ("cuda.bindings", lambda m: "driver API %s" % m.driver.cuDriverGetVersion()[1]),
    ("cupy", lambda m: "CUDA runtime %s, %d device(s)" % (m.cuda.runtime.runtimeGetVersion(),
                                                          m.cuda.runtime.getDeviceCount())),
    ("torch", lambda m: "CUDA %s, cuda available: %s" % (m.version.cuda, m.cuda.is_available())),
):
    try:
        mod = importlib.import_module(name)
        if name == "cuda.bindings":
            importlib.import_module("cuda.bindings.driver")
            mod.driver.cuInit(0)
        print(f"{name:24s} {getattr(mod, '__version__', '?')}: {probe(mod)}")
    except Exception as exc:  # report, never fail: this file is for reading
        print(f"{name:24s} not usable: {type(exc).__name__}: {str(exc)[:200]}")
EOF
    echo "## streamrt info"
    if [[ -f src/streamrt/__main__.py || -f streamrt/__main__.py ]]; then
        timeout 30 "$PY" -m streamrt info
    else  # no __main__.py in this version: the CLI module runs as a script
        timeout 30 "$PY" -m streamrt.cli info
    fi
    echo "(exit status $?)"
    # first, so a stall it finds is on record before pytest runs into it: which CUDA calls wait
    # behind a running host function (streamrt's trampoline holds the driver's thread meanwhile)
    echo "## host-function probe (scripts/probe_hostfn.py)"
    timeout -k 5 60 "$PY" scripts/probe_hostfn.py
    echo "(exit status $?)"
} >"$OUT/env.txt" 2>&1

# --- cuda-marked tests ------------------------------------------------------------------------
T=$(( $(left) - 100 ))   # keep 100 s for the benchmarks: pytest gets its 240 s unless env.txt was slow
(( T > 240 )) && T=240
(( T < 30 )) && T=30
# a hung test must not cost the whole run its report: stacks are dumped after 45 s, and with
# pytest-timeout installed the test fails after 60 s and the others still run
PER_TEST=(-o faulthandler_timeout=45)
timeout 30 "$PY" -m pytest --help 2>/dev/null | grep -q -- "--timeout=" && PER_TEST+=(--timeout 60)
note "pytest -m cuda (timeout ${T}s) -> $OUT/pytest.log"
timeout -k 10 "$T" "$PY" -m pytest -q -m cuda -p no:cacheprovider -rs "${PER_TEST[@]}" \
    --junitxml="$OUT/pytest-junit.xml" tests >"$OUT/pytest.log" 2>&1
PYTEST_RC=$?
[[ $PYTEST_RC == 124 || $PYTEST_RC == 137 ]] && echo "gpu_check: pytest killed after ${T}s" >>"$OUT/pytest.log"
note "pytest exit status $PYTEST_RC"

# --- benchmarks -------------------------------------------------------------------------------
: >"$OUT/bench.log"
for b in "${BENCHES[@]}"; do
    T=$(( $(left) - 15 ))
    (( T > 60 )) && T=60
    if (( T < 10 )); then
        echo "not run: the ${BUDGET}s time budget is spent" >"$TMP/$b.err"
        echo "-1 0" >"$TMP/$b.rc"
        echo "=== $b: not run (time budget spent)" >>"$OUT/bench.log"
        continue
    fi
    note "$b (timeout ${T}s)"
    t0=$SECONDS
    timeout -k 5 "$T" "$PY" "benchmarks/$b.py" --json "${QUICK[@]}" >"$TMP/$b.json" 2>"$TMP/$b.err"
    rc=$?
    echo "$rc $((SECONDS - t0))" >"$TMP/$b.rc"
    {
        echo "=== $b: exit status $rc, $((SECONDS - t0)) s (timeout ${T}s)"
        echo "--- stderr"; cat "$TMP/$b.err"
        echo "--- stdout"; cat "$TMP/$b.json"; echo
    } >>"$OUT/bench.log"
done

# --- summary ----------------------------------------------------------------------------------
note "summary -> $OUT/summary.json, $OUT/table.md"
OUT="$OUT" TMP="$TMP" PYTEST_RC="$PYTEST_RC" GPU_LINE="$GPU_LINE" BENCHES="${BENCHES[*]}" \
ELAPSED=$((SECONDS - START)) "$PY" - <<'EOF'
import json
import os
import sys
import xml.etree.ElementTree as ET

out, tmp = os.environ["OUT"], os.environ["TMP"]
rc = int(os.environ["PYTEST_RC"])
pytest = {"exit_code": rc, "tests": None, "passed": None, "failures": None, "errors": None,
          "skipped": None, "ran": None, "failed_tests": [], "skip_reasons": []}
try:
    root = ET.parse(os.path.join(out, "pytest-junit.xml")).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    for key in ("tests", "failures", "errors", "skipped"):
        pytest[key] = sum(int(s.get(key, 0)) for s in suites)
    pytest["ran"] = pytest["tests"] - pytest["skipped"]
    pytest["passed"] = pytest["ran"] - pytest["failures"] - pytest["errors"]
    reasons = {}
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            pytest["failed_tests"].append(name)
        sk = case.find("skipped")
        if sk is not None:
            msg = (sk.get("message") or "").strip()[:300]
            reasons[msg] = reasons.get(msg, 0) + 1
    pytest["skip_reasons"] = [{"reason": k, "count": v} for k, v in
                              sorted(reasons.items(), key=lambda kv: -kv[1])][:10]
except (OSError, ET.ParseError) as exc:
    pytest["junit_error"] = f"{type(exc).__name__}: {exc}"

if rc in (124, 137):
    why = "pytest timed out"
elif rc == 5:
    why = "pytest collected no cuda-marked tests"
elif rc != 0:
    why = f"pytest failed (exit status {rc}): {len(pytest['failed_tests'])} failing tests"
elif not pytest["ran"]:
    tops = "; ".join(f"{r['reason']} (x{r['count']})" for r in pytest["skip_reasons"][:3])
    why = f"no cuda test ran: all {pytest['tests'] or 0} collected were skipped" + (f": {tops}" if tops else "")
else:
    why = f"pytest passed: {pytest['passed']} cuda tests ran"
ok = rc == 0 and bool(pytest["ran"])

benches = {}
for name in os.environ["BENCHES"].split():
    def read(ext, name=name):
        try:
            with open(os.path.join(tmp, f"{name}.{ext}")) as f:
                return f.read()
        except OSError:
            return ""
    b_rc, secs = (read("rc").split() + ["?", "?"])[:2]
    entry = {"exit_code": int(b_rc) if b_rc.lstrip("-").isdigit() else None,
             "seconds": int(secs) if secs.isdigit() else None, "rows": []}
    doc = None
    for line in reversed(read("json").splitlines()):  # the JSON document is the last line
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                pass
            break
    if doc is None:
        tail = read("err").strip().splitlines()[-6:]
        if b_rc == "-1":  # never started: the shell wrote why
            entry["error"] = " | ".join(tail)
        else:
            entry["error"] = (f"exit status {b_rc}" + (" (timed out)" if b_rc in ("124", "137") else "")
                              + ": " + " | ".join(tail))[:1500]
    else:
        entry["rows"] = doc.get("rows", [])
        for key in ("skipped", "notes"):
            if doc.get(key):
                entry[key] = doc[key]
    benches[name] = entry

summary = {"ok": ok, "verdict": why, "gpu": os.environ["GPU_LINE"],
           "elapsed_s": int(os.environ["ELAPSED"]), "pytest": pytest, "benchmarks": benches}
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)


def fmt(v, unit=""):
    if v is None:
        return "n/a"
    return (f"{v:.3g}" if isinstance(v, float) else str(v)) + unit


lines = [f"GPU: {os.environ['GPU_LINE']}", "",
         f"pytest -m cuda: {why} (exit status {rc}; tests {fmt(pytest['tests'])}, "
         f"failures {fmt(pytest['failures'])}, errors {fmt(pytest['errors'])}, "
         f"skipped {fmt(pytest['skipped'])})", "",
         "| bench | claim | ours | peer | ratio | target | pass | note |",
         "|---|---|---|---|---|---|---|---|"]
for name, e in benches.items():
    if "error" in e:
        lines.append(f"| {name} | (not run) | | | | | NO | {e['error'][:300].replace('|', '/')} |")
    elif "skipped" in e:
        lines.append(f"| {name} | (skipped) | | | | | skipped | {e['skipped'][:300].replace('|', '/')} |")
    for r in e["rows"]:
        unit = r.get("unit", "")
        note = (r.get("error") or "")[:200].replace("|", "/")
        lines.append(f"| {name} | {r.get('claim')} | {fmt(r.get('ours'), ' ' + unit)} "
                     f"| {fmt(r.get('peer'), ' ' + unit)} | {fmt(r.get('ratio'), 'x')} | {r.get('target')} "
                     f"| {'yes' if r.get('pass') else 'NO'} "
                     f"| {note} |")
    for n in e.get("notes", []):
        lines.append(f"| {name} | note: {n} | | | | | | |")
table = "\n".join(lines) + "\n"
with open(os.path.join(out, "table.md"), "w") as f:
    f.write(table)
print(table)
print(f"{'OK' if ok else 'FAILED'}: {why}")
sys.exit(0 if ok else 1)
EOF
STATUS=$?
if (( STATUS > 1 )); then  # the summary step itself broke: still leave a verdict behind
    printf '{"ok": false, "verdict": "summary step failed (exit status %s)", "pytest": {"exit_code": %s}}\n' \
        "$STATUS" "$PYTEST_RC" >"$OUT/summary.json"
    echo "gpu_check: summary step failed (exit status $STATUS); pytest exit status $PYTEST_RC" >&2
fi
note "done in $((SECONDS - START))s, exit status $STATUS"
exit "$STATUS"
