"""Property test of the sanitizer (hypothesis): random correct programs over streams, kernels, ops and
graphs give no finding."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamrt as srt
from tests.contract.sanitizer_helpers import ACCESSES, access, streams

# -- no false positives on correct programs --------------------------------------------------
program = st.lists(
    st.tuples(st.integers(0, 2), st.sampled_from(("write", "read", "realloc", "op", "graph")),
              st.integers(0, 2)),
    min_size=1, max_size=25,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program)
def test_sanitizer_no_false_positives_on_correct_programs(ops_list):
    """Random programs made correct by construction: each access waits on the last accesses of
    the buffer on other streams; frees wait for every use; no finding is allowed."""
    srt.sanitizer.clear()
    srt.sanitizer.enable("collect")
    try:
        dev = srt.Device("cpu:0")
        ss = streams(dev, 3)
        n = 64
        bufs = [ss[0].malloc(n * 4) for _ in range(3)]
        last: dict[int, list] = {i: [ss[0].record()] for i in range(3)}  # events after uses
        out: list = []
        for si, what, bi in ops_list:
            s = ss[si]
            for e in last[bi]:
                s.wait(e)  # ordered after every earlier use of the buffer
            if what in ACCESSES:
                access(s, what, bufs[bi], n, out)
            else:  # free and allocate again on this stream
                s.free(bufs[bi])
                bufs[bi] = s.malloc(n * 4)
            last[bi] = [s.record()]
        for s in ss:
            for bi in range(3):
                for e in last[bi]:
                    s.wait(e)
        for b in bufs:
            ss[0].free(b)
        dev.synchronize()
        assert srt.sanitizer.report() == []
    finally:
        srt.sanitizer.disable()
        srt.sanitizer.clear()
