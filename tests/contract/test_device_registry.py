"""Devices: registry, specs, current device per thread, counts per backend, environment switches."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

import streamrt as srt


def test_device_same_spec_same_object():
    assert srt.Device("cpu:1") is srt.Device("cpu:1")
    assert srt.Device("cpu:0") is srt.Device(srt.Device("cpu:0"))
    d = srt.Device("cpu:1")
    assert (d.backend, d.index, d.name) == ("cpu", 1, "cpu:1")


def test_device_int_spec_is_index_on_current_backend():
    with srt.Device("cpu:0"):
        assert srt.Device(1) is srt.Device("cpu:1")


def test_device_none_is_current_and_with_restores():
    d0, d1 = srt.Device("cpu:0"), srt.Device("cpu:1")
    d0.set_current()
    assert srt.Device() is d0 and srt.current_device() is d0
    with d1:
        assert srt.current_device() is d1
        with d0:
            assert srt.current_device() is d0
        assert srt.current_device() is d1
    assert srt.current_device() is d0


def test_device_current_is_per_thread():
    srt.Device("cpu:0").set_current()
    seen = []

    def other():
        srt.Device("cpu:1").set_current()
        seen.append(srt.current_device())

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == [srt.Device("cpu:1")]
    assert srt.current_device() is srt.Device("cpu:0")


@pytest.mark.parametrize("arg", ["cpu:1", 1, None])
def test_device_set_current_through_the_class_is_refused(arg):
    # Device.set_current("cpu:1") made the str the current device: every later call then raised
    # AttributeError
    d0 = srt.Device("cpu:0")
    d0.set_current()
    with pytest.raises(srt.InvalidTypeError, match=r"srt\.Device\(.*\)\.set_current\(\)"):
        srt.Device.set_current(arg)
    assert srt.current_device() is d0
    assert srt.Device() is d0 and srt.Stream().device is d0


@pytest.mark.parametrize("spec", ["gpu:0", "cpu:x", "cpu:99", "cpu:-1"])
def test_device_bad_spec(spec):
    with pytest.raises(srt.InvalidDeviceError):
        srt.Device(spec)


def test_device_bad_spec_type():
    with pytest.raises(srt.InvalidTypeError):
        srt.Device(1.5)


def test_device_count():
    assert srt.device_count() == 2
    assert srt.device_count("cpu") == 2
    with pytest.raises(srt.InvalidDeviceError):
        srt.device_count("tpu")


def test_device_cuda_unavailable_is_clear():
    # no GPU here: zero devices and a clear BackendUnavailableError naming what is missing
    try:
        import cuda.bindings  # noqa: F401
    except ImportError:
        assert srt.device_count("cuda") == 0
        with pytest.raises(srt.BackendUnavailableError, match="cuda-bindings"):
            srt.Device("cuda:0")
    else:  # pragma: no cover - only on machines with cuda-bindings
        pytest.skip("cuda-bindings installed: covered by the cuda tests")


def test_device_import_does_not_import_cuda():
    # what ``import streamrt`` adds: cuda-bindings 12's .pth file imports ``cuda`` at startup
    code = ("import sys; before = set(sys.modules); import streamrt; "
            "print(sorted(m for m in set(sys.modules) - before if m.startswith('cuda')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_device_env_switches():
    code = (
        "import streamrt as srt; d = srt.Device('cpu:3'); "
        "print(srt.device_count(), d.memory_info()[1])"
    )
    env = dict(os.environ, STREAMRT_CPU_DEVICES="4", STREAMRT_CPU_MEMORY=str(64 << 20))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True)
    assert out.stdout.split() == ["4", str(64 << 20)]


def test_device_backend_without_index_follows_current():
    # "cpu" names the current device when it is a cpu one (as "cuda" does with cudaGetDevice)
    with srt.Device("cpu:1"):
        assert srt.Device("cpu") is srt.Device("cpu:1")
    with srt.Device("cpu:0"):
        assert srt.Device("cpu") is srt.Device("cpu:0")


def test_device_count_is_per_backend():
    from streamrt.backends import device_count as backend_count

    assert srt.device_count("cuda") == backend_count("cuda")  # not the cpu count
