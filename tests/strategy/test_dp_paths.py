"""Every code path of PaSE's dynamic program (paper 004, section III) against the others.

:func:`shardplan.strategy.solve` minimises a vertex's table by one of two branches: tables
of at least ``large_table`` entries (2048 by default: what realistic transformers and RNNLMs
at many devices take) one candidate configuration at a time in place, smaller ones by
broadcasting over chunks of candidates (``chunk_elements``; a chunk of 1 is the scalar
form), after an optional exact pruning of dominated configurations. Each path is forced on
the same inputs, which include vertices with two or more edge terms and children whose
tables are gathered through class maps, and must give the same optimum, equal to an
exhaustive enumeration.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from shardplan.generate import transformer
from shardplan.strategy import Tables, build_tables, solve
from shardplan.strategy._dp import LARGE_TABLE, _adjacency, generate_seq, plan_tables

#: (large_table, chunk_elements): large-table branch everywhere; small-table branch
#: vectorised over all candidates; small-table branch one candidate at a time (scalar).
PATHS = {"large": (0, 1 << 22), "vectorised": (10**12, 1 << 22), "scalar": (10**12, 1)}


def _tables(seed: int, n: int = 7, p: float = 0.55, kmax: int = 4) -> Tables:
    """Random tables on a dense random graph; small integer costs make ties, duplicate
    rows and columns (the class reductions) and dominated configurations likely."""
    rng = np.random.default_rng(seed)
    ks = rng.integers(1, kmax + 1, n)
    pairs = [(u, v) for u in range(n) for v in range(u + 1, n) if rng.random() < p]
    node = tuple(rng.integers(0, 6, k).astype(float) for k in ks)
    edges = []
    for u, v in pairs:
        m = rng.integers(0, 6, (ks[u], ks[v])).astype(float)
        if rng.random() < 0.3 and ks[v] > 1:
            m[:, 1] = m[:, 0]  # two configurations of v the edge cannot tell apart
        edges.append((u, v, m))
    return Tables(graph="g", devices=4, cost_model="test", objective="pase_cost",
                  names=tuple(f"n{i}" for i in range(n)), dims=tuple(("x",) for _ in ks),
                  configs=tuple(np.arange(1, k + 1)[:, None] for k in ks), node_cost=node,
                  edges=tuple(edges))


def _enumerate(tables: Tables) -> float:
    ks = [len(c) for c in tables.node_cost]
    return min(tables.evaluate(c) for c in itertools.product(*(range(k) for k in ks)))


def _edge_terms(tables: Tables) -> int:
    """The most edge terms of one vertex's recurrence in the generate-seq order: its
    neighbours in its dependent set."""
    n = tables.num_nodes
    adj = _adjacency(n, tables.edges)
    st = plan_tables(n, adj, generate_seq(n, adj, [len(c) for c in tables.node_cost]))
    return max((sum(u in adj[v] for u in st.dep[v]) for v in range(n)), default=0)


def test_default_threshold() -> None:
    assert LARGE_TABLE == 2048


@pytest.mark.parametrize("seed", range(25))
def test_every_path_gives_the_enumerated_optimum(seed: int) -> None:
    tables = _tables(seed)
    expected = _enumerate(tables)
    for ordering in ("generate-seq", "bfs"):
        for prune in (True, False):
            for name, (large, chunk) in PATHS.items():
                res = solve(tables, ordering=ordering, prune=prune, large_table=large,
                            chunk_elements=chunk)
                assert res.status == "optimal"
                assert res.value == pytest.approx(expected), (ordering, prune, name)
                assert tables.evaluate(res.choice) == pytest.approx(expected)


def test_the_random_family_has_vertices_with_several_edge_terms() -> None:
    # The inputs above exercise the sum over edge terms, not only a single one.
    counts = [_edge_terms(_tables(seed)) for seed in range(25)]
    assert max(counts) >= 3 and sum(c >= 2 for c in counts) >= 15


def test_hand_made_vertex_with_two_edge_terms_and_a_child() -> None:
    # Path 0 - 1 - 2 plus 0 - 2 and 1 - 3: in every order some vertex sees two edge terms.
    # Costs make the optimum need all of them: the best is (1, 0, 1, 0) at 2 + 1 = 3.
    node = (np.array([1.0, 0.0]), np.array([0.0, 3.0]), np.array([2.0, 1.0]),
            np.array([0.0, 0.0]))
    edges = ((0, 1, np.array([[0.0, 9.0], [1.0, 0.0]])),
             (0, 2, np.array([[5.0, 5.0], [5.0, 0.0]])),
             (1, 2, np.array([[4.0, 1.0], [0.0, 0.0]])),
             (1, 3, np.array([[0.0, 2.0], [2.0, 0.0]])))
    tables = Tables(graph="g", devices=2, cost_model="test", objective="pase_cost",
                    names=("a", "b", "c", "d"), dims=(("x",),) * 4,
                    configs=(np.array([[1], [2]]),) * 4, node_cost=node, edges=edges)
    assert _edge_terms(tables) >= 2
    assert _enumerate(tables) == 3.0
    for prune in (True, False):
        for large, chunk in PATHS.values():
            res = solve(tables, prune=prune, large_table=large, chunk_elements=chunk)
            assert res.value == 3.0
            assert res.choice.tolist() == [1, 0, 1, 0]


def test_a_real_graph_takes_the_large_branch_and_every_path_agrees() -> None:
    # One transformer layer at 16 devices: its largest table has over 2048 entries, so the
    # default solve uses both branches; forcing either everywhere, with or without
    # pruning, gives the same optimum.
    tables = build_tables(transformer(num_layers=1), 16)
    default = solve(tables)
    assert default.max_table >= LARGE_TABLE
    values = {"default": default.value}
    for prune in (True, False):
        for name, (large, chunk) in PATHS.items():
            if name == "scalar" and not prune:
                continue  # one candidate at a time over unpruned tables: slow, same code
            res = solve(tables, prune=prune, large_table=large, chunk_elements=chunk)
            assert tables.evaluate(res.choice) == pytest.approx(res.value, rel=1e-12)
            values[(name, prune)] = res.value
    assert all(math.isclose(v, default.value, rel_tol=1e-12) for v in values.values()), values
