"""Until the cuda backend builds conditional nodes natively, instantiate refuses a graph holding
one on cuda (never a silent empty node)."""

from __future__ import annotations

import pytest

import streamrt as srt

pytestmark = pytest.mark.cuda


def test_conditional_node_refused_on_cuda(cuda0):
    with cuda0:
        g = srt.Graph()
        h = g.create_conditional_handle(default=1)
        n = g.add_conditional_node(h, srt.ConditionalType.IF)
        n.bodies[0].add_empty_node()
        with pytest.raises(srt.GraphInstantiateError) as e:
            g.instantiate()
    assert e.value.result is srt.GraphInstantiateResult.NODE_OPERATION_NOT_SUPPORTED
    assert e.value.node is n
