"""Generators: structure, determinism, derived attributes, validation, scale."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardplan.errors import ShardplanError
from shardplan.generate import GENERATORS, chain, generate, layered, random_dag
from shardplan.generate._random_dag import _distinct_sample, _pair_from_index
from shardplan.ir import Graph

_COLUMNS = ("fwd_flops", "bwd_flops", "param_bytes", "output_bytes", "weight", "src", "dst",
            "edge_bytes")


def _same(a: Graph, b: Graph) -> bool:
    return all(np.array_equal(getattr(a, c), getattr(b, c)) for c in _COLUMNS) and \
        a.names == b.names and a.to_dict() == b.to_dict()


def _layer_of(g: Graph) -> np.ndarray:
    return np.array([int(m[len("layer"):]) for m in g.modules])


@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_same_seed_same_graph_other_seed_other_graph(kind: str) -> None:
    a = generate(kind, num_nodes=300, seed=5)
    b = generate(kind, num_nodes=300, seed=5)
    c = generate(kind, num_nodes=300, seed=6)
    assert _same(a, b)
    assert not _same(a, c)
    assert a.meta["generator"]["seed"] == 5 and a.meta["generator"]["kind"] == kind


@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_ids_are_topological_and_json_round_trips(kind: str) -> None:
    g = generate(kind, num_nodes=200, seed=1)
    assert g.num_nodes == 200
    assert bool(np.all(g.src < g.dst))
    assert len(set(zip(g.src.tolist(), g.dst.tolist(), strict=True))) == g.num_edges
    assert _same(Graph.from_dict(g.to_dict()), g)


def test_paper_000_sizes_are_an_input_node_and_layers_of_100() -> None:
    g = layered(1001, seed=0)
    layer = _layer_of(g)
    assert np.bincount(layer).tolist() == [1] + [100] * 10
    assert int(g.levels.max()) == 10
    assert np.bincount(_layer_of(layered(201, seed=0))).tolist() == [1, 100, 100]
    assert g.sources().tolist() == [0]
    assert set(g.sinks().tolist()) <= set(np.flatnonzero(layer == 10).tolist())


def test_layered_edges_join_consecutive_layers_with_bounded_fanin() -> None:
    g = layered(2001, width=50, max_fanin=4, seed=3, dangling=True)
    layer = _layer_of(g)
    assert bool(np.all(layer[g.dst] == layer[g.src] + 1))
    indeg = np.bincount(g.dst, minlength=g.num_nodes)
    assert indeg[0] == 0
    assert bool(np.all(indeg[layer == 1] == 1))  # the one input node is all layer 1 can read
    deep = indeg[layer >= 2]
    assert deep.min() == 1 and deep.max() == 4
    assert set(np.unique(deep).tolist()) == {1, 2, 3, 4}  # every fan-in occurs
    assert np.mean(deep) == pytest.approx(2.5, abs=0.15)  # uniform on 1..4
    # dangling=True: some outputs are unused before the last layer
    assert np.any((g.out_degree == 0) & (layer < layer.max()))


def test_without_dangling_only_the_last_layer_has_sinks() -> None:
    g = layered(3000, width=40, max_fanin=1, seed=2)
    layer = _layer_of(g)
    assert bool(np.all(layer[g.sinks()] == layer.max()))


def test_skip_edges_reach_back_past_the_previous_layer() -> None:
    g = layered(501, width=10, skip_probability=1.0, seed=4)
    layer = _layer_of(g)
    back = layer[g.dst] - layer[g.src]
    skips = np.flatnonzero(back >= 2)
    # every node of layer >= 2 got exactly one skip edge
    assert np.array_equal(np.sort(g.dst[skips]), np.flatnonzero(layer >= 2))
    assert bool(np.all(back >= 1))
    none = layered(501, width=10, skip_probability=0.0, seed=4)
    assert bool(np.all(_layer_of(none)[none.dst] - _layer_of(none)[none.src] == 1))


def test_derived_attributes_follow_the_dense_layer_model() -> None:
    g = layered(301, weight_low=2, weight_high=5, params_per_weight=1000, batch_size=8, seed=9)
    w = g.weight
    assert bool(np.all((w >= 2) & (w <= 5) & (w == np.round(w))))
    assert set(np.unique(w).tolist()) == {2.0, 3.0, 4.0, 5.0}
    params = w * 1000
    assert np.array_equal(g.param_bytes, (4 * params).astype(np.int64))
    assert np.allclose(g.fwd_flops, 2 * 8 * params)
    assert np.allclose(g.bwd_flops, 2 * g.fwd_flops)
    assert np.array_equal(g.output_bytes, (4 * 8 * np.rint(np.sqrt(params))).astype(np.int64))
    assert np.array_equal(g.edge_bytes, g.output_bytes[g.src])
    # weight 3 -> 3000 params -> width 55 -> 4 * 8 * 55 bytes
    i = int(np.flatnonzero(w == 3)[0])
    assert g.param_bytes[i] == 12000 and g.fwd_flops[i] == 48000 and g.output_bytes[i] == 1760


def test_small_and_degenerate_layered_graphs() -> None:
    one = layered(1)
    assert one.num_nodes == 1 and one.num_edges == 0
    flat = layered(5, width=10, first_width=10)
    assert flat.num_edges == 0  # one layer only
    two = layered(7, width=3, first_width=2, max_fanin=9, seed=0)
    assert np.bincount(_layer_of(two)).tolist() == [2, 3, 2]
    assert bool(np.all(np.bincount(two.dst, minlength=7)[2:] >= 1))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 400), width=st.integers(1, 30), first=st.integers(1, 5),
       fanin=st.integers(1, 6), skip=st.floats(0, 1), dangling=st.booleans(),
       seed=st.integers(0, 2**32))
def test_layered_invariants_hold_for_any_options(n, width, first, fanin, skip, dangling,
                                                 seed) -> None:
    g = layered(n, width=width, first_width=first, max_fanin=fanin, skip_probability=skip,
                dangling=dangling, seed=seed)
    layer = _layer_of(g)
    assert g.num_nodes == n and bool(np.all(g.src < g.dst))
    assert bool(np.all(np.diff(layer) >= 0))
    pairs = set(zip(g.src.tolist(), g.dst.tolist(), strict=True))
    assert len(pairs) == g.num_edges
    from_prev = layer[g.src] == layer[g.dst] - 1
    indeg_prev = np.bincount(g.dst[from_prev], minlength=n)
    assert bool(np.all(indeg_prev[layer >= 1] >= 1))
    if dangling:  # else unread outputs get an extra edge each, to any node of the next layer
        assert bool(np.all(indeg_prev <= fanin))
    assert bool(np.all(layer[g.dst] - layer[g.src] >= 1))
    if not dangling:
        assert bool(np.all(layer[g.sinks()] == layer.max()))


def test_chain_is_a_path() -> None:
    g = chain(6, seed=2)
    assert g.src.tolist() == [0, 1, 2, 3, 4] and g.dst.tolist() == [1, 2, 3, 4, 5]
    assert chain(1).num_edges == 0


def test_random_dag_edge_density() -> None:
    n, p = 400, 0.05
    g = random_dag(n, edge_probability=p, seed=0)
    expected = p * n * (n - 1) / 2
    assert abs(g.num_edges - expected) < 5 * np.sqrt(expected)
    assert random_dag(50, edge_probability=0.0).num_edges == 0
    assert random_dag(30, edge_probability=1.0).num_edges == 30 * 29 // 2
    big = random_dag(20000, avg_degree=6, seed=1)
    assert 2 * big.num_edges / big.num_nodes == pytest.approx(6, rel=0.03)
    assert random_dag(1).num_edges == 0
    assert random_dag(200, seed=0).meta["generator"]["edge_probability"] == pytest.approx(4 / 199)


def test_random_dag_edges_are_spread_uniformly() -> None:
    g = random_dag(60, edge_probability=0.3, seed=11)
    # each pair is equally likely: the mean span j - i matches that of all pairs
    span = (g.dst - g.src).mean()
    iu = np.triu_indices(60, 1)
    assert span == pytest.approx((iu[1] - iu[0]).mean(), rel=0.06)


def test_pair_index_inversion_is_exact() -> None:
    t = np.arange(200 * 199 // 2)
    i, j = _pair_from_index(t)
    iu = np.triu_indices(200, 1)
    order = np.lexsort((iu[0], iu[1]))  # by j then i
    assert np.array_equal(i, iu[0][order]) and np.array_equal(j, iu[1][order])
    big_n = 3_000_000
    last = np.array([big_n * (big_n - 1) // 2 - 1, big_n * (big_n - 1) // 2 - big_n + 1])
    bi, bj = _pair_from_index(last)
    assert bj.tolist() == [big_n - 1, big_n - 1] and bi.tolist() == [big_n - 2, 0]


def test_distinct_sample() -> None:
    rng = np.random.default_rng(0)
    for total, m in ((10, 10), (10, 3), (10**9, 1000), (100, 0)):
        s = _distinct_sample(rng, total, m)
        assert s.size == m and np.unique(s).size == m and (s.size == 0 or s.max() < total)
        assert bool(np.all(np.diff(s) > 0))


BAD = {
    "zero nodes": ("layered", {"num_nodes": 0}, "num_nodes"),
    "bool nodes": ("chain", {"num_nodes": True}, "num_nodes"),
    "float nodes": ("chain", {"num_nodes": 2.5}, "num_nodes"),
    "zero width": ("layered", {"width": 0}, "width"),
    "zero fanin": ("layered", {"max_fanin": 0}, "max_fanin"),
    "skip above one": ("layered", {"skip_probability": 1.5}, "skip_probability"),
    "skip nan": ("layered", {"skip_probability": float("nan")}, "skip_probability"),
    "dangling not bool": ("layered", {"dangling": "yes"}, "dangling"),
    "weights reversed": ("chain", {"weight_low": 5, "weight_high": 2}, "weight_high"),
    "negative weight": ("chain", {"weight_low": -1}, "weight_low"),
    "negative params": ("chain", {"params_per_weight": -1.0}, "params_per_weight"),
    "zero batch": ("random-dag", {"batch_size": 0}, "batch_size"),
    "negative p": ("random-dag", {"edge_probability": -0.1}, "edge_probability"),
    "both densities": ("random-dag", {"edge_probability": 0.1, "avg_degree": 2},
                       "not both"),
    "degree too high": ("random-dag", {"num_nodes": 5, "avg_degree": 5}, "avg_degree"),
    "negative seed": ("chain", {"seed": -1}, "seed"),
    "unknown option": ("chain", {"width": 3}, "takes no option 'width'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_options_are_one_line_errors(case: str) -> None:
    kind, options, match = BAD[case]
    with pytest.raises(ShardplanError, match=match) as info:
        generate(kind, **options)
    assert "\n" not in str(info.value)


def test_unknown_kind() -> None:
    with pytest.raises(ShardplanError, match="unknown generator 'spiral'"):
        generate("spiral")


def test_layered_100k_nodes() -> None:
    """The largest graph ``benchmarks/scale.py`` plans; not timed here (shared machines)."""
    g = layered(100_000, seed=0)
    assert g.num_nodes == 100_000
    assert int(g.src.max()) < 100_000 and bool(np.all(g.src < g.dst))
