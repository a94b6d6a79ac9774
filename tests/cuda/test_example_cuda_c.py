"""examples/cuda_c_everywhere.py on cuda:0: the same CUDA C kernels the cpu backend emulates
(tests/contract/test_examples_run.py runs it there) give numpy's results through NVRTC."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import streamrt as srt
from tests.conftest import cuda_reason

pytestmark = pytest.mark.cuda

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cuda_c_everywhere.py"


def test_cuda_c_everywhere_on_cuda(capsys):
    reason = cuda_reason()
    if reason is not None:
        pytest.skip(f"no usable CUDA device here: {reason}")
    spec = importlib.util.spec_from_file_location("cuda_c_everywhere", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.run(srt.Device("cuda:0"))  # its checks against numpy raise AssertionError on a mismatch
    assert "cuda:0: vector add, block sum" in capsys.readouterr().out
