"""A newcomer's script, made of the README's examples, with one deliberate mistake of issue 24's
points 3-5 each: the error it gets names the line of the mistake (the traceback's last frame in
the script for a refusal at the call, the message's ``launched at file:line`` for a kernel's
failure that surfaces at a later synchronize).

Each script runs in a fresh interpreter, as a user runs it; the mistake's line is the one
marked ``# MISTAKE``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import streamrt as srt

PRELUDE = """\
import numpy as np
import streamrt as srt

@srt.kernel
def scale(ctx, ptr, n, factor):
    x = ctx.array(ptr, (n,), np.float32)
    x *= factor

n = 1 << 10
s = srt.Stream(non_blocking=True)
ptr = srt.malloc(n * 4)
s.memcpy(ptr, np.ones(n, np.float32), n * 4)
"""

# (point, error class name, body); the body's line marked MISTAKE is the one the error names
SCRIPTS = {
    "3-missing-kernel-argument": ("InvalidTypeError", """\
        s.launch(scale, ptr, n)  # MISTAKE: factor left out
        s.synchronize()
        """),
    "3-kernel-fails-when-it-runs": ("LaunchError", """\
        s.launch(scale, ptr, 2 * n, 3.0)  # MISTAKE: twice the elements ptr holds
        out = np.empty(n, np.float32)
        s.memcpy(out, ptr, n * 4)
        s.synchronize()
        """),
    "3-tensor-larger-than-its-memory": ("InvalidValueError", """\
        desc = srt.TensorDesc((1000,), np.float32)
        t = srt.Tensor(desc, srt.malloc(64))  # MISTAKE: 4000 bytes described over 64
        s.synchronize()
        """),
    "4-kernel-on-another-device": ("LaunchError", """\
        other = srt.Stream(srt.Device("cpu:1"))
        other.launch(scale, ptr, n, 2.0)  # MISTAKE: cpu:1 kernel on cpu:0 memory
        other.synchronize()
        """),
    "4-copy-to-another-device": ("InvalidAddressError", """\
        dst = srt.malloc(n * 4, srt.Device("cpu:1"))
        s.memcpy(dst, ptr, n * 4)  # MISTAKE: no peer access enabled
        s.synchronize()
        """),
    "5-set-current-through-the-class": ("InvalidTypeError", """\
        srt.Device.set_current("cpu:0")  # MISTAKE: a string, through the class
        s.synchronize()
        """),
    "5-write-a-string": ("InvalidTypeError", """\
        srt.write(ptr, "hello")  # MISTAKE: text is not data
        """),
    "5-capture-info-of-a-destroyed-stream": ("InvalidHandleError", """\
        t = srt.Stream()
        t.destroy()
        info = t.capture_info()  # MISTAKE: t is gone
        """),
}


def _run(tmp_path: Path, name: str, body: str) -> tuple[subprocess.CompletedProcess[str], Path, int]:
    src = PRELUDE + textwrap.dedent(body)
    line = next(i for i, text in enumerate(src.splitlines(), 1) if "# MISTAKE" in text)
    path = tmp_path / f"newcomer_{name.replace('-', '_')}.py"
    path.write_text(src)
    env = dict(os.environ)
    env.pop("STREAMRT_SANITIZE", None)  # the plain runtime's errors, as a newcomer runs it
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)
    return proc, path, line


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_error_names_the_line_of_the_mistake(tmp_path: Path, name: str) -> None:
    kind, body = SCRIPTS[name]
    proc, path, line = _run(tmp_path, name, body)
    assert proc.returncode != 0, f"{name}: the mistake ran without an error\n{proc.stdout}"
    err = proc.stderr
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"streamrt.errors.{kind}") or last.startswith(f"streamrt.{kind}") \
        or f"{kind}:" in last, err
    # a streamrt error, never an AttributeError or TypeError from inside the runtime
    assert issubclass(getattr(srt, kind), srt.StreamRTError)
    frames = re.findall(rf'File "{re.escape(str(path))}", line (\d+)', err)
    named = {int(n) for n in frames} | {int(n) for n in re.findall(
        rf"{re.escape(path.name)}:(\d+)", err)}
    if kind == "LaunchError":  # surfaced at a synchronize: the message names the launch
        assert f"launched at {path.name}:{line}" in err or f"{path}:{line}" in err, err
    else:  # refused at the call: the traceback's innermost frame in the script is that line
        assert frames and int(frames[-1]) == line, err
    assert line in named
