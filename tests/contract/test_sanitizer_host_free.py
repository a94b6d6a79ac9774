"""``sanitizer.check_host_free``: a host free judged as ACL's ``aclrtFree``, ordered after only
the stream work the host had synchronized when it was called (``srt.free`` itself waits for the
device, as ``cudaFree``, and stays unjudged so)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import streamrt as srt
from streamrt.errors import InvalidAddressError, SanitizerError
from tests.contract.sanitizer_helpers import kinds, read_k, set_k, streams, write_k

HERE = f"{Path(__file__).name}:"


def test_pending_work_behind_a_gate_is_reported_at_the_acl_free(dev, san, gate):
    (s,) = streams(dev, 1)
    p = srt.malloc(1024, dev)
    g = gate(s)
    s.launch(write_k, p, 256, 1.0)  # still pending behind the gate when the free is called
    with san.check_host_free(p, "aclrtFree"):  # BUG: the host never synchronized s
        g.open()
        srt.free(p)  # (its device synchronize runs the kernel: then it is judged)
    rep = san.report()
    assert kinds(rep) == ["use-after-free"]
    msg = rep[0].message
    assert "kernel 'write_k'" in msg and f"aclrtFree of {hex(p)} on the host" in msg
    assert msg.count(HERE) == 2  # the kernel's enqueue line and the free's line


def test_work_the_host_synchronized_is_not_reported(dev, san, gate):
    (s,) = streams(dev, 1)
    p = srt.malloc(1024, dev)
    g = gate(s)
    s.launch(write_k, p, 256, 1.0)
    g.open()
    s.synchronize()  # removed, the test above: reported
    with san.check_host_free(p, "aclrtFree"):
        srt.free(p)
    assert san.report() == []


@pytest.mark.parametrize("proof", ["event", "device"])
def test_an_event_or_device_synchronize_is_a_proof_too(dev, san, gate, proof):
    a, b = streams(dev)
    p = srt.malloc(1024, dev)
    g = gate(b)
    out: list = []
    a.launch(write_k, p, 256, 1.0)
    b.wait(a.record())
    b.launch(read_k, p, 256, out)
    e = b.record()
    g.open()
    e.synchronize() if proof == "event" else dev.synchronize()
    with san.check_host_free(p):
        srt.free(p)
    assert san.report() == [] and out == [256.0]


def test_a_synchronize_of_another_stream_is_no_proof(dev, san):
    a, b = streams(dev)
    p = srt.malloc(1024, dev)
    ran = threading.Event()
    b.launch(read_k, p, 256, [])
    b.launch(set_k, ran)
    assert ran.wait(30)  # it ran: a host signal the sanitizer does not see as ordering
    a.synchronize()  # BUG: not the stream that read p
    with san.check_host_free(p, "aclrtFree"):
        srt.free(p)
    rep = san.report()
    assert kinds(rep) == ["use-after-free"]
    assert "kernel 'read_k'" in rep[0].message and b.name in rep[0].message


def test_srt_free_alone_keeps_cudas_order(dev, san, gate):
    (s,) = streams(dev, 1)
    p = srt.malloc(1024, dev)
    g = gate(s)
    s.launch(write_k, p, 256, 1.0)
    g.open()
    srt.free(p)  # waits for the device: ordered after the kernel (cudaFree)
    assert san.report() == []


def test_raise_mode_raises_as_the_block_ends_and_the_memory_is_freed(dev, san):
    san.enable("raise")
    (s,) = streams(dev, 1)
    p = srt.malloc(1024, dev)
    s.launch(write_k, p, 256, 1.0)
    with pytest.raises(SanitizerError, match="use-after-free.*aclrtFree"), \
            san.check_host_free(p, "aclrtFree"):
        srt.free(p)
    with pytest.raises(InvalidAddressError):
        srt.free(p)  # it was freed: only reported


def test_a_failed_free_leaves_no_announcement(dev, san):
    (s,) = streams(dev, 1)
    p = srt.malloc(1024, dev)
    s.launch(write_k, p, 256, 1.0)
    with pytest.raises(RuntimeError), san.check_host_free(p, "aclrtFree"):
        raise RuntimeError("the free never came")
    srt.free(p)  # a later srt.free is cudaFree's again: after the device
    assert san.report() == []


def test_off_the_block_only_runs(dev):
    was = srt.sanitizer.enabled()
    srt.sanitizer.disable()
    try:
        p = srt.malloc(64, dev)
        with srt.sanitizer.check_host_free(p):
            srt.free(p)
        with pytest.raises(InvalidAddressError):
            srt.free(p)
    finally:
        if was:
            srt.sanitizer.enable()
