"""Operator clustering (Parmesan 4.2): convex hyper-operators, acyclic quotient, K reached."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardplan.generate import layered
from shardplan.ir import Graph
from shardplan.partition._pipeline_cluster import Clusterer


def _random_dag(n: int, p: float, seed: int) -> Graph:
    rng = np.random.default_rng(seed)
    iu = np.triu_indices(n, 1)
    keep = rng.random(iu[0].size) < p
    perm = rng.permutation(n)  # node ids not in topological order
    return Graph.from_arrays(name="r", fwd_flops=rng.integers(1, 10, n) * 1e9,
                             src=perm[iu[0][keep]], dst=perm[iu[1][keep]],
                             output_bytes=rng.integers(0, 10**6, n))


def _clusterer(g: Graph, cap: float = np.inf, alpha: float = 1.0) -> Clusterer:
    return Clusterer(g, g.fwd_flops / 1e12, g.param_bytes.astype(float), cap, alpha,
                     1e-5, 1e-10)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 40), p=st.floats(0.05, 0.5), seed=st.integers(0, 10**6),
       frac=st.floats(0.05, 1.0))
def test_clusters_are_convex_and_acyclic(n, p, seed, frac):
    g = _random_dag(n, p, seed)
    c = _clusterer(g)
    target = max(1, int(n * frac))
    k = c.run(target)
    unit = c.unit_of()
    assert sorted(set(unit.tolist())) == list(range(k))
    for u in range(k):
        assert g.is_convex(np.flatnonzero(unit == u))
    # the quotient is a DAG and unit ids are a topological order of it
    cross = unit[g.src] != unit[g.dst]
    assert np.all(unit[g.src][cross] < unit[g.dst][cross])
    # the maintained order is topological for the live hyper-operators
    for a in range(n):
        if c.members[a] is not None:
            for b in c.succ[a]:
                assert c.pos[a] < c.pos[b]
    # stops only at the target or when every remaining pair is invalid
    if k > target:
        for a in range(n):
            for b in list(c.succ[a]):
                assert c._other_path(a, b)


def test_chain_clusters_to_exactly_k_and_prefers_cheap_pairs():
    g = Graph.from_arrays(name="c", fwd_flops=[1e9, 1e9, 5e9, 1e9, 1e9],
                          src=[0, 1, 2, 3], dst=[1, 2, 3, 4])
    c = _clusterer(g, alpha=0.0)
    assert c.run(3) == 3
    unit = c.unit_of()
    # the two cheapest adjacent pairs (0,1) and (3,4) merge; the heavy node stays alone
    assert unit.tolist() == [0, 0, 1, 2, 2]


def test_memory_cap_blocks_merges():
    g = Graph.from_arrays(name="c", fwd_flops=[1e9] * 4, src=[0, 1, 2], dst=[1, 2, 3],
                          param_bytes=[10, 10, 10, 10])
    c = _clusterer(g, cap=20.0)
    assert c.run(1) == 2  # only pairs fit under the cap


def test_layered_graph_clusters_deterministically():
    g = layered(num_nodes=401, width=20, seed=1, skip_probability=0.2)
    a = _clusterer(g)
    b = _clusterer(g)
    assert a.run(50) == 50 and b.run(50) == 50
    assert np.array_equal(a.unit_of(), b.unit_of())
