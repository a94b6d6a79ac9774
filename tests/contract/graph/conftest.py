"""The graph contract on every backend: explicit and captured graphs, executable graphs (launch,
parameters, update, event nodes) and graph memory.

Each test here gets ``dev``, device 0 of each backend, and ``bufs``, three zeroed buffers of ``N`` float32
on it."""

from __future__ import annotations

import pytest

import streamrt as srt

N = 16  # float32 elements of each of ``bufs``


@pytest.fixture
def dev(any_dev):
    """Each backend's device 0: graphs, their capture, execution and memory are a contract of every
    backend."""
    return any_dev


@pytest.fixture
def bufs(dev):
    ptrs = [srt.malloc(N * 4, dev) for _ in range(3)]
    for p in ptrs:
        srt.memset(p, 0, N * 4)
    yield ptrs
    for p in ptrs:
        srt.free(p)
