"""The demo on cuda: every demo kernel has a CUDA body that NVRTC compiles (no GPU needed), and
``streamrt demo --device cuda:0`` passes on a GPU."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import streamrt.demos
from streamrt import cli
from streamrt.backends.cuda.nvrtc import compile_cubin, nvrtc_available, parse_signature
from streamrt.demos import guarded, run
from streamrt.errors import ExecutorError, InvalidValueError, NotSupportedError
from streamrt.kernel import Kernel
from tests.conftest import cuda_reason


def _demo_kernels() -> dict[str, Kernel]:
    """Every kernel defined at module level in streamrt/demos/, by module and attribute."""
    found: dict[str, Kernel] = {}
    for info in pkgutil.iter_modules(streamrt.demos.__path__):
        mod = importlib.import_module(f"streamrt.demos.{info.name}")
        for attr, value in vars(mod).items():
            if isinstance(value, Kernel) and value.fn.__module__ == mod.__name__:
                found[f"{info.name}.{attr}"] = value
    return found


KERNELS = _demo_kernels()


def test_the_demo_kernels_are_found():
    # a guard for the discovery itself: an empty list would make the tests below vacuous
    assert {"streams._fill", "pools.add_custom", "graphs.foo", "graphs.bar",
            "_gate.gate_kernel"} <= set(KERNELS)


@pytest.mark.parametrize("key", sorted(KERNELS))
def test_demo_kernel_has_a_matching_cuda_body(key):
    k = KERNELS[key]
    assert k.cuda_source and k.signature is not None, f"{key} has no CUDA body"
    assert f'extern "C" __global__ void {k.name}(' in k.cuda_source
    params = list(inspect.signature(k.fn).parameters)
    assert params[0] == "ctx"
    assert len(parse_signature(k.signature)) == len(params) - 1, (
        f"{key}: signature {k.signature!r} vs Python parameters {params[1:]}")


@pytest.mark.parametrize("key", sorted(KERNELS))
def test_demo_kernel_compiles_for_sm_90(key, tmp_path, monkeypatch):
    why = nvrtc_available()
    if why is not None:
        pytest.skip(f"NVRTC is not usable here: {why}")
    monkeypatch.setenv("STREAMRT_CACHE_DIR", str(tmp_path))  # keep ~/.cache untouched
    k = KERNELS[key]
    cubin = compile_cubin(k.cuda_source, k.name, "sm_90")
    assert cubin.startswith(b"\x7fELF")


def test_guarded_tells_missing_features_from_failures():
    lines: list[str] = []
    failures: list[str] = []
    with guarded("no kernel", failures, lines.append):
        raise NotSupportedError("kernel 'x' has no CUDA body")
    with guarded("no plan", failures, lines.append):
        raise ExecutorError("softmax has no CUDA implementation", 561003)
    assert failures == [] and all(line.startswith("  [n/a]") for line in lines)
    with guarded("bad value", failures, lines.append):
        raise InvalidValueError("wrong")
    assert len(failures) == 1 and "[FAILED]" in lines[-1]


def test_run_summary_counts_steps_shown_as_na(monkeypatch):
    def section(dev, out):
        with guarded("a step", [], out):
            raise NotSupportedError("not here")
        return []

    monkeypatch.setattr(streamrt.demos, "sections", lambda: {"streams": section})
    lines: list[str] = []
    assert run("cpu:0", out=lines.append) == 0
    assert lines[-1] == "all checks passed (1 step(s) n/a on cpu:0, see above)"


@pytest.mark.cuda
@pytest.mark.timeout(600)  # the first run compiles every demo and operator kernel with NVRTC
def test_demo_passes_on_cuda(capsys):
    reason = cuda_reason()
    if reason is not None:
        pytest.skip(f"no usable CUDA device here: {reason}")
    code = cli.main(["demo", "--device", "cuda:0"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "[FAILED]" not in text and "streamrt demo on cuda:0" in text
