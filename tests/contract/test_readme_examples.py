"""The README's Python examples run, in order, as one program."""

from __future__ import annotations

import os
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_examples_run(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 5  # streams, pools, operators, graphs, sanitizer
    import streamrt as srt

    srt.sanitizer.clear()  # findings of earlier tests (STREAMRT_SANITIZE runs) do not count
    cwd = os.getcwd()
    os.chdir(tmp_path)  # the graph example writes graph.dot
    try:
        namespace: dict = {}
        for block in blocks:
            exec(compile(block, str(README), "exec"), namespace)  # noqa: S102
        assert [f.kind for f in srt.sanitizer.report()] == ["race"]  # the planted bug is named
    finally:
        os.chdir(cwd)
        srt.sanitizer.disable()
        srt.sanitizer.clear()
    assert (tmp_path / "graph.dot").exists()
