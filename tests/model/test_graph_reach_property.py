"""The sanitizer's DAG reachability (graph.compile.reach): exactly the ancestors, on random DAGs
(hypothesis), in memory linear in the nodes for chains and fork/join layers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from streamrt.graph.compile import reach, reaches


@st.composite
def dags(draw):
    n = draw(st.integers(1, 40))
    deps = []
    for i in range(n):
        k = draw(st.integers(0, min(i, 4)))
        deps.append(sorted(set(draw(st.lists(st.integers(0, i - 1), min_size=k, max_size=k)))) if i else [])
    return deps


def _ancestors(deps):
    anc = []
    for ds in deps:
        a = set()
        for d in ds:
            a |= anc[d] | {d}
        anc.append(a)
    return anc


@settings(max_examples=300, deadline=None)
@given(dags())
def test_reach_answers_exactly_the_ancestors(deps):
    """``reaches(r[a], r[x])`` holds exactly when a is an ancestor of x."""
    r = reach(deps)
    anc = _ancestors(deps)
    for x in range(len(deps)):
        for a in range(len(deps)):
            assert reaches(r[a], r[x]) == (a in anc[x]), (a, x)


def _entries(r):
    return sum(len(b) for b in {id(b): b for _, _, b in r}.values())


def test_reach_memory_is_linear_for_chains_and_fork_join_layers():
    """A chain's knowledge is one shared dict; fork/join layers of width 64 reuse their chains:
    the dict entries grow with nodes times width, not nodes squared (the bitsets did)."""
    n = 80_000
    chain = reach([[]] + [[i] for i in range(n - 1)])
    assert _entries(chain) == 0 and len({c for c, _, _ in chain}) == 1
    width, layers = 64, 200
    deps: list[list[int]] = [[]]
    join = 0
    for _ in range(layers):
        branch = list(range(len(deps), len(deps) + width))
        deps += [[join]] * width
        join = len(deps)
        deps.append(branch)
    r = reach(deps)
    assert len({c for c, _, _ in r}) <= width + 1
    assert _entries(r) <= 3 * len(deps)  # two dicts of ~width entries per layer
