from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardplan.errors import InvalidFileError
from shardplan.ir import Graph
from tests.conftest import random_dag


def _reach_sets(g: Graph) -> list[set[int]]:
    """Reference: descendants of every node by plain DFS."""
    succ: dict[int, list[int]] = {v: [] for v in range(g.num_nodes)}
    for s, d in zip(g.src.tolist(), g.dst.tolist(), strict=True):
        succ[s].append(d)
    out = []
    for v in range(g.num_nodes):
        seen: set[int] = set()
        stack = list(succ[v])
        while stack:
            w = stack.pop()
            if w not in seen:
                seen.add(w)
                stack.extend(succ[w])
        out.append(seen)
    return out


def _convex_reference(g: Graph, nodes: set[int], reach: list[set[int]]) -> bool:
    for w in range(g.num_nodes):
        if w in nodes:
            continue
        from_s = any(w in reach[u] for u in nodes)
        to_s = any(u in reach[w] for u in nodes)
        if from_s and to_s:
            return False
    return True


def test_diamond_queries(diamond: Graph) -> None:
    assert diamond.num_nodes == 4 and diamond.num_edges == 4
    assert diamond.successors(0).tolist() == [1, 2]
    assert sorted(diamond.predecessors(3).tolist()) == [1, 2]
    assert diamond.topological_order.tolist() == [0, 1, 2, 3]
    assert diamond.levels.tolist() == [0, 1, 1, 2]
    assert diamond.is_convex([0, 1, 2, 3])
    assert diamond.is_convex([1, 2])  # no path between 1 and 2
    assert not diamond.is_convex([0, 3])  # 0 -> 1 -> 3 leaves and re-enters
    assert not diamond.is_convex([0, 1, 3])
    sg = diamond.stage_graph([0, 0, 1, 1])
    assert sg.tolist() == [[0.0, 20.0 + 30.0], [0.0, 0.0]]
    assert diamond.stage_adjacency([0, 0, 1, 1]).tolist() == [[False, True], [False, False]]
    assert diamond.stage_adjacency([0, 1, 1, 0]).tolist() == [[False, True], [True, False]]
    assert diamond.stage_adjacency([0, 0, 0, 0], 3).tolist() == [[False] * 3] * 3
    assert diamond.is_acyclic_partition([0, 0, 1, 1])
    assert not diamond.is_acyclic_partition([0, 1, 1, 0])  # stage 0 -> 1 -> 0
    lb = diamond.lower_bounds(2)
    assert lb["average"] == pytest.approx(3 * 10 / 2)
    assert lb["largest_node"] == pytest.approx(12.0)
    assert lb["bound"] == pytest.approx(15.0)


def test_cyclic_partition_detected() -> None:
    # chain 0->1->2: {0,2} vs {1} makes stage 0 -> stage 1 -> stage 0
    g = Graph.from_arrays(name="c", fwd_flops=[1, 1, 1], src=[0, 1], dst=[1, 2])
    assert not g.is_acyclic_partition([0, 1, 0])
    assert g.is_acyclic_partition([0, 0, 1])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"src": [0, 1, 2], "dst": [1, 2, 0]}, "cycle"),
        ({"src": [0], "dst": [5]}, "dangling"),
        ({"src": [1], "dst": [1]}, "self loop"),
        ({"src": [0], "dst": [1], "edge_bytes": [-1]}, "negative bytes"),
        ({"src": [], "dst": [], "param_bytes": [1, -4, 0]}, "negative"),
        ({"src": [], "dst": [], "fwd_flops": [1.0, float("nan"), 0.0]}, "non-finite"),
        ({"src": [], "dst": [], "names": ["a", "a", "b"]}, "duplicate node name"),
    ],
)
def test_invalid_graphs(kwargs: dict, message: str) -> None:
    base = {"name": "bad", "fwd_flops": [1.0, 1.0, 1.0]}
    base.update(kwargs)
    with pytest.raises(InvalidFileError, match=message):
        Graph.from_arrays(**base)


def test_arrays_are_read_only(diamond: Graph) -> None:
    with pytest.raises(ValueError):
        diamond.fwd_flops[0] = 5.0
    with pytest.raises(AttributeError):
        diamond.name = "x"  # type: ignore[misc]


def test_json_round_trip_keeps_optional_and_unknown_fields() -> None:
    g = Graph.from_arrays(
        name="g", batch_size=4, fwd_flops=[1.0, 2.0], src=[0], dst=[1], edge_bytes=[8],
        fwd_seconds=[0.5, np.nan], spaces=({"dims": {"b": 4}}, None),
        node_extra=({"custom": 1}, {}), meta={"model": "x"},
    )
    d = g.to_dict()
    assert d["nodes"][0]["fwd_seconds"] == 0.5 and "fwd_seconds" not in d["nodes"][1]
    assert d["nodes"][0]["custom"] == 1 and d["model"] == "x"
    g2 = Graph.from_dict(d)
    assert g2.to_dict() == d
    assert g2.node(0).space == {"dims": {"b": 4}} and g2.node(1).fwd_seconds is None


def test_param_tensors_column_travels_with_the_nodes() -> None:
    """The optional ``param_tensors`` column: written per node where known, read back,
    kept by subgraphs and node records, unchanged by a new batch size; negative counts are
    refused."""
    g = Graph.from_arrays(name="g", batch_size=4, fwd_flops=[1.0, 2.0, 3.0], src=[0, 1],
                          dst=[1, 2], param_bytes=[8, 0, 4],
                          param_tensors=[2.0, np.nan, 1.0])
    d = g.to_dict()
    assert d["nodes"][0]["param_tensors"] == 2.0 and "param_tensors" not in d["nodes"][1]
    back = Graph.from_dict(d)
    assert back.to_dict() == d and back.node(0).param_tensors == 2.0
    assert back.node(1).param_tensors is None
    assert g.subgraph([2, 0]).param_tensors.tolist() == [1.0, 2.0]
    assert g.at_batch_size(8).param_tensors.tolist()[::2] == [2.0, 1.0]
    assert Graph.from_nodes(name="g", batch_size=4, nodes=g.nodes,
                            edges=g.edges).to_dict() == d
    with pytest.raises(InvalidFileError, match="param_tensors"):
        g.replace(param_tensors=np.array([1.0, -1.0, 0.0]))


def test_from_nodes_matches_from_arrays(diamond: Graph) -> None:
    g = Graph.from_nodes(name="diamond", batch_size=1, nodes=diamond.nodes, edges=diamond.edges)
    assert g.to_dict() == diamond.to_dict()


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 9), p=st.floats(0.0, 0.7), seed=st.integers(0, 10_000),
       data=st.data())
def test_queries_match_reference(n: int, p: float, seed: int, data: st.DataObject) -> None:
    g = random_dag(n, p, seed)
    order = g.topological_order.tolist()
    assert sorted(order) == list(range(n))
    pos = {v: i for i, v in enumerate(order)}
    assert all(pos[s] < pos[d] for s, d in zip(g.src.tolist(), g.dst.tolist(), strict=True))
    reach = _reach_sets(g)
    mask = g.reachable([0])
    assert set(np.flatnonzero(mask).tolist()) == reach[0]
    for level_v, v in zip(g.levels.tolist(), range(n), strict=True):
        preds = g.predecessors(v).tolist()
        assert level_v == (max(g.levels[preds]) + 1 if preds else 0)
    subset = data.draw(st.sets(st.integers(0, n - 1), max_size=n))
    assert g.is_convex(sorted(subset)) == _convex_reference(g, subset, reach)


def test_convexity_exhaustive_small() -> None:
    g = random_dag(7, 0.4, 3)
    reach = _reach_sets(g)
    for r in range(8):
        for subset in itertools.combinations(range(7), r):
            assert g.is_convex(list(subset)) == _convex_reference(g, set(subset), reach)


def test_large_graph_queries() -> None:
    """10^5 nodes: a chain plus random forward skips, ids shuffled (correctness only; the
    speed of the same queries is measured by benchmarks/ir_queries.py)."""
    n = 100_000
    rng = np.random.default_rng(1)
    skip_src = rng.integers(0, n - 10, n)
    src = np.concatenate([np.arange(n - 1), skip_src])
    dst = np.concatenate([np.arange(1, n), skip_src + rng.integers(2, 10, n)])
    perm = rng.permutation(n)
    g = Graph.from_arrays(name="big", fwd_flops=np.ones(n), src=perm[src], dst=perm[dst],
                          edge_bytes=np.ones(src.size, dtype=np.int64))
    order = g.topological_order
    assert np.array_equal(order, perm)  # the chain fixes the order
    assert g.levels[perm[-1]] == n - 1
    assert g.is_convex(perm[1000:5000])
    assert not g.is_convex(perm[[10, 20_000]])
    a = np.zeros(n, dtype=np.int64)
    a[perm[n // 2:]] = 1
    sg = g.stage_graph(a)
    assert sg[1, 0] == 0 and sg[0, 1] > 0
    assert g.is_acyclic_partition(a)
    a2 = a.copy()
    a2[perm[-1]] = 0  # last node back in stage 0: 0 -> 1 -> 0
    assert not g.is_acyclic_partition(a2)
