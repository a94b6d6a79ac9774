"""Peer access on the cuda backend (API.md §9.2), on the fake runtime's two GPUs or real ones:
the frontend's rules over ``cudaDeviceCanAccessPeer`` / ``cudaDeviceEnablePeerAccess`` /
``cudaDeviceDisablePeerAccess``. (The fake does not fault a kernel touching another GPU's
memory: kernels' peer faults are the GPU's, checked on hardware.)"""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt

pytestmark = pytest.mark.cuda


@srt.kernel(cuda='extern "C" __global__ void peer_fill(float* p, int n, float v) '
                 "{ for (int i = 0; i < n; ++i) p[i] = v; }", signature="ptr, i32, f32")
def peer_fill(ctx, p, n, v):
    ctx.array(p, (n,), np.float32)[:] = v


@pytest.fixture
def pair(cuda0, cuda1):
    yield cuda0, cuda1
    for a, b in ((cuda0, cuda1), (cuda1, cuda0)):
        if b.index in a._peers:
            a.disable_peer_access(b)


def test_cuda_peer_calls_reach_the_runtime(pair):
    from streamrt.backends.cuda.errors import check
    from streamrt.backends.cuda.runtime import activate, rt

    d0, d1 = pair
    assert d0.can_access_peer(d1) and d1.can_access_peer(d0) and not d0.can_access_peer(d0)
    with pytest.raises(srt.InvalidDeviceError):
        d0.enable_peer_access(d0)
    with pytest.raises(srt.PeerAccessNotEnabledError):
        d1.disable_peer_access(d0)
    d1.enable_peer_access(d0)
    with pytest.raises(srt.PeerAccessAlreadyEnabledError):
        d1.enable_peer_access(d0)
    # the runtime was told, from cuda:1's context: its own answer is 704 now (mapped by check)
    activate(1)
    with pytest.raises(srt.PeerAccessAlreadyEnabledError):
        check(rt.cudaDeviceEnablePeerAccess(0, 0))
    d0.enable_peer_access(d1)  # the other way is another access
    d0.disable_peer_access(d1)
    d1.disable_peer_access(d0)
    activate(1)
    with pytest.raises(srt.PeerAccessNotEnabledError):
        check(rt.cudaDeviceDisablePeerAccess(0))


def test_cuda_peer_stream_copies_and_memsets(pair):
    d0, d1 = pair
    a, b = srt.malloc(256, d0), srt.malloc(256, d1)
    try:
        srt.write(a, np.arange(256, dtype=np.uint8))
        s1 = srt.Stream(d1, non_blocking=True)
        for call in (lambda: s1.memcpy(b, a, 256), lambda: s1.memcpy(a, b, 256),
                     lambda: s1.memset(a, 0, 256)):
            with pytest.raises(srt.InvalidAddressError) as ei:
                call()
            assert "cuda:0" in str(ei.value) and "without peer access" in str(ei.value)
        d1.enable_peer_access(d0)
        s1.memcpy(b, a, 256)
        s1.memset(a, 7, 16)
        s1.synchronize()
        assert srt.read(b, (256,), np.uint8).tolist() == list(range(256))
        assert srt.read(a, (17,), np.uint8).tolist() == [7] * 16 + [16]
        s0 = srt.Stream(d0, non_blocking=True)
        with pytest.raises(srt.InvalidAddressError):  # one way: cuda:0 still has no access
            s0.memcpy(a, b, 256)
    finally:
        srt.free(a)
        srt.free(b)


def test_cuda_peer_graph_launched_on_another_gpus_stream_refused(pair):
    d0, d1 = pair
    p = srt.malloc(64, d0)
    try:
        g = srt.Graph()
        with d0:
            k = g.add_kernel_node(peer_fill, p, 16, 3.0)
            ge = g.instantiate()
        with pytest.raises(srt.InvalidValueError) as ei:
            ge.launch(srt.Stream(d1, non_blocking=True))
        assert "cuda:0" in str(ei.value) and "cuda:1" in str(ei.value)
        s0 = srt.Stream(d0, non_blocking=True)
        ge.launch(s0)
        s0.synchronize()
        assert srt.read(p, (16,), np.float32).tolist() == [3.0] * 16
        del k
        mg = srt.Graph()  # a memset node only: launched by cuda:1, it would touch cuda:0's memory
        mg.add_memset_node(p, 5, 64)
        mge = mg.instantiate()
        s1 = srt.Stream(d1, non_blocking=True)
        with pytest.raises(srt.InvalidAddressError):
            mge.launch(s1)
        d1.enable_peer_access(d0)
        mge.launch(s1)
        s1.synchronize()
        assert srt.read(p, (64,), np.uint8).tolist() == [5] * 64
    finally:
        srt.free(p)
