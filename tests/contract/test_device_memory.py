"""A device's memory: ``memory_info`` follows allocations; its capacity is enforced."""

from __future__ import annotations

import os
import subprocess
import sys

import streamrt as srt


def test_device_memory_info_tracks_allocations():
    d = srt.Device("cpu:1")
    free0, total = d.memory_info()
    p = srt.malloc(1 << 20, device=d)
    free1, total1 = d.memory_info()
    assert total1 == total and free0 - free1 == 1 << 20
    srt.free(p)
    assert d.memory_info()[0] == free0


def test_device_capacity_enforced():
    code = (
        "import streamrt as srt\n"
        "p = srt.malloc(40 << 20)\n"
        "try:\n    srt.malloc(40 << 20)\nexcept srt.OutOfMemoryError as e:\n    print('oom', e)\n"
        "srt.free(p); q = srt.malloc(40 << 20); print('ok')\n"
    )
    env = dict(os.environ, STREAMRT_CPU_MEMORY=str(64 << 20))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True)
    assert out.stdout.startswith("oom") and out.stdout.strip().endswith("ok")
