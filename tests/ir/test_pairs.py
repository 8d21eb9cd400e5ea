"""Implicit (pair-model) topologies against their dense equivalents, built independently."""

from __future__ import annotations

import itertools
import json
import math
import tracemalloc

import numpy as np
import pytest

from shardplan.errors import InvalidFileError, ShardplanError
from shardplan.ir import Topology
from shardplan.ir._pairs import GridPairs, LevelPairs, PairMatrix, pair_model_from_dict
from shardplan.ir.topology import decode_matrix, encode_matrix
from shardplan.topology import build, dgx1_link_counts, route, routes_of


# ---------------------------------------------------------------- dense references
def _levels_reference(shape, bws, lats):
    """Pair values by walking every pair's coordinates in plain Python."""
    n = math.prod(shape)
    coords = list(itertools.product(*(range(s) for s in shape)))
    bw = np.zeros((n, n))
    lat = np.zeros((n, n))
    for i, j in itertools.product(range(n), repeat=2):
        if i == j:
            continue
        k = next(k for k in range(len(shape)) if coords[i][k] != coords[j][k])
        b, la = bws[k], lats[k]
        if k == len(shape) - 1 and isinstance(b, np.ndarray):
            b = b[coords[i][k], coords[j][k]]
        if k == len(shape) - 1 and isinstance(la, np.ndarray):
            la = la[coords[i][k], coords[j][k]]
        bw[i, j], lat[i, j] = b, la
    return bw, lat


@pytest.mark.parametrize("shape", [(5,), (2, 3), (2, 2, 3), (3, 1, 2, 2)])
def test_hierarchical_equals_its_dense_reference(shape):
    bws = [1e9 * (k + 1) for k in range(len(shape))]
    lats = [1e-5 / (k + 1) for k in range(len(shape))]
    topo = build("hierarchical", shape=shape, bandwidth=bws, latency=lats)
    assert topo.pair_model is not None
    ref_bw, ref_lat = _levels_reference(shape, bws, lats)
    np.testing.assert_array_equal(np.asarray(topo.bandwidth), ref_bw)
    np.testing.assert_array_equal(np.asarray(topo.latency), ref_lat)


def test_flat_and_dgx1_equal_their_dense_references():
    topo = build("flat", num_devices=7, bandwidth=3e9, latency=2e-6)
    ref_bw, ref_lat = _levels_reference((7,), [3e9], [2e-6])
    np.testing.assert_array_equal(np.asarray(topo.bandwidth), ref_bw)
    np.testing.assert_array_equal(np.asarray(topo.latency), ref_lat)

    topo = build("dgx1", boxes=3)
    counts = dgx1_link_counts()
    meta = topo.meta["generator"]["options"]
    in_bw, in_lat = meta["inter_bandwidth"], meta["inter_latency"]
    box_bw = np.where(counts > 0, counts * meta["nvlink_bandwidth"], meta["pcie_bandwidth"])
    box_lat = np.where(counts > 0, meta["nvlink_latency"], meta["pcie_latency"])
    ref_bw, ref_lat = _levels_reference((3, 8), [in_bw, box_bw], [in_lat, box_lat])
    np.testing.assert_array_equal(np.asarray(topo.bandwidth), ref_bw)
    np.testing.assert_array_equal(np.asarray(topo.latency), ref_lat)


@pytest.mark.parametrize("kind,shape", [("mesh2d", (3, 4)), ("torus2d", (4, 5)),
                                        ("mesh3d", (2, 3, 2)), ("torus3d", (3, 3, 4))])
def test_grids_equal_shortest_path_routing_over_their_links(kind, shape):
    topo = build(kind, shape=shape)
    assert isinstance(topo.pair_model, GridPairs)
    ref = route(topo.num_devices, topo.links, weight="hops")  # Dijkstra over the links
    np.testing.assert_array_equal(np.asarray(topo.bandwidth), ref.bandwidth)
    np.testing.assert_array_equal(np.asarray(topo.latency), ref.latency)
    routes = routes_of(topo)
    np.testing.assert_array_equal(routes.hops, ref.hops)
    links = {(lk.src, lk.dst) for lk in topo.links}
    n = topo.num_devices
    nxt = np.asarray(routes.next_hop)
    for i, j in itertools.product(range(n), repeat=2):
        p = routes.path(i, j)
        assert p[0] == i and p[-1] == j
        assert len(p) - 1 == ref.hops[i, j]  # a minimum-hop route
        assert all(e in links for e in zip(p[:-1], p[1:], strict=True))
        assert nxt[i, j] == (-1 if i == j else p[1])


def test_grid_latency_at_a_size_that_is_never_dense():
    g = GridPairs((100, 100, 10), (True, False, True), 1e11, 1e-6)
    i = np.array([0, 0, 99_999, 12_345])
    j = np.array([99_999, 50 * 100 * 10, 0, 12_345])
    hops = g.hops(i, j)
    # (99, 99, 9) vs origin: ring of 100 -> 1, line of 100 -> 99, ring of 10 -> 1
    assert hops.tolist() == [101, 50, 101, 0]
    assert g.values("latency", i, j)[0] == pytest.approx(101e-6)


# ---------------------------------------------------------------- the matrix view
@pytest.mark.parametrize("model", [
    LevelPairs((3, 4), [1e9, 2e9], [1e-5, 1e-6]),
    GridPairs((3, 4), (True, False), 1e10, 1e-6),
])
def test_pair_matrix_indexes_like_the_dense_matrix(model, monkeypatch):
    import shardplan.ir._pairs as pairs
    monkeypatch.setattr(pairs, "EAGER_DEVICES", 0)  # no cache: every lookup computed
    m = PairMatrix(model, "latency")
    dense = m._build()
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 12, size=5)
    cols = rng.integers(0, 12, size=5)
    mask = rng.random(12) < 0.5
    keys = [(3, 7), (-1, 2), 4, (slice(None), 5), (slice(2, 9, 3), slice(None)),
            (rows, cols), np.ix_(rows, cols), (mask, slice(None)), (slice(None), mask),
            (rows[:, None], cols[None, :]), (2, cols), (rows, 0)]
    for key in keys:
        np.testing.assert_array_equal(np.asarray(m[key]), dense[key])
    assert m[3, 7] == dense[3, 7]
    with pytest.raises(IndexError):
        m[12, 0]
    with pytest.raises(IndexError):
        m[0.5, 1]
    assert float(m.max()) == dense.max() and float(m.min()) == dense.min()
    np.testing.assert_array_equal(m + 1.0, dense + 1.0)
    np.testing.assert_array_equal(m.T[:, :], dense.T)


@pytest.mark.parametrize("topo", [
    build("hierarchical", shape=(2, 3, 4)), build("dgx1", boxes=2),
    build("torus2d", shape=(4, 6)), build("mesh3d", shape=(2, 3, 4))])
def test_classes_and_summary_match_the_dense_matrices(topo):
    dense = topo.dense()
    assert dense.pair_model is None
    assert topo.bandwidth_classes() == dense.bandwidth_classes()
    s, sd = topo.summary(), dense.summary()
    assert s.pop("pairs") == topo.pair_model.kind
    assert s == sd


# ---------------------------------------------------------------- JSON
def test_small_generated_topology_round_trips_with_both_forms():
    topo = build("dgx1", boxes=2)
    d = json.loads(json.dumps(topo.to_dict()))
    assert "bandwidth" in d and d["pairs"]["kind"] == "levels"  # contract matrices kept
    back = Topology.from_dict(d)
    assert back.pair_model == topo.pair_model
    np.testing.assert_array_equal(np.asarray(back.bandwidth), np.asarray(topo.bandwidth))
    # a hand-edited matrix wins over the model (the contract's matrices are the truth)
    d["bandwidth"][0][1] = 1.0
    edited = Topology.from_dict(d)
    assert edited.pair_model is None and edited.bandwidth[0, 1] == 1.0


@pytest.mark.parametrize("kind,params", [("hierarchical", {"shape": (4, 8, 16, 8)}),
                                         ("torus3d", {"shape": (16, 16, 16)}),
                                         ("dgx1", {"boxes": 512})])
def test_large_generated_topology_is_stored_by_its_generator(kind, params):
    topo = build(kind, **params)
    d = topo.to_dict(dense=False)  # the generator form (the default above 16384 devices)
    assert "bandwidth" not in d and "latency" not in d and "pairs" in d
    text = json.dumps(d)
    assert len(text) < 2_000_000  # devices list dominates; no D^2 anything
    back = Topology.from_dict(json.loads(text))
    assert back.pair_model == topo.pair_model
    assert back.levels == topo.levels and back.links == topo.links
    rng = np.random.default_rng(1)
    i, j = rng.integers(0, topo.num_devices, size=(2, 1000))
    np.testing.assert_array_equal(back.latency[i, j], topo.latency[i, j])
    np.testing.assert_array_equal(back.bandwidth[i, j], topo.bandwidth[i, j])


def test_flat_topology_of_100000_devices_builds_and_round_trips_in_little_memory():
    tracemalloc.start()
    try:
        topo = build("flat", num_devices=100_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 300 * 2**20  # dense matrices alone would be 149 GB (2 x 8 x 10^10 bytes)
    text = json.dumps(topo.to_dict())
    assert len(text) < 40 * 2**20  # the devices' lines, no matrix
    back = Topology.from_dict(json.loads(text))
    assert back.num_devices == 100_000 and back.pair_model == topo.pair_model
    assert back.bandwidth[0, 99_999] == topo.bandwidth[0, 99_999] > 0
    assert back.latency[5, 5] == 0.0
    assert back.all_pairs_reachable
    assert back.summary()["bandwidth_classes"] == [
        {"bandwidth": float(topo.bandwidth[0, 1]), "pairs": 100_000 * 99_999}]
    with pytest.raises(ShardplanError, match="generator form"):
        np.asarray(back.latency)


def test_large_dense_topology_is_stored_compactly_and_exactly():
    rng = np.random.default_rng(3)
    few = rng.choice([1e9, 2.5e9, 1e10], size=(1100, 1100))
    enc = encode_matrix(few)
    assert enc["encoding"] == "codes" and enc["dtype"] == "<u1"
    np.testing.assert_array_equal(decode_matrix("bandwidth", enc), few)
    many = rng.random((40, 40))
    enc = encode_matrix(many)
    assert enc["encoding"] == "float64"  # distinct values: no value list
    np.testing.assert_array_equal(decode_matrix("latency", enc), many)
    with pytest.raises(InvalidFileError):
        decode_matrix("latency", {**enc, "data": "not base64!"})
    topo = build("uniform-dist", num_devices=1100, seed=0)  # measured-like: no pair model
    d = json.loads(json.dumps(topo.to_dict(dense=False)))
    assert d["latency"]["encoding"] in ("codes", "float64")
    back = Topology.from_dict(d)
    np.testing.assert_array_equal(back.latency, topo.latency)
    np.testing.assert_array_equal(back.bandwidth, topo.bandwidth)


@pytest.mark.parametrize("pairs,match", [
    ({"kind": "levels", "shape": [2, 2], "bandwidth": [1.0], "latency": [0, 0]}, "2 entries"),
    ({"kind": "levels", "shape": [3], "bandwidth": [1.0], "latency": [0]}, "3 devices"),
    ({"kind": "levels", "shape": [4], "bandwidth": [-1.0], "latency": [0]}, "positive"),
    ({"kind": "grid", "shape": [2, 2], "wrap": "yes", "link_bandwidth": 1,
      "hop_latency": 0}, "wrap"),
    ({"kind": "grid", "shape": [2, 2], "link_bandwidth": 1, "hop_latency": 0}, "wrap"),
    ({"kind": "ring", "shape": [4]}, "unknown"),
    ([1, 2], "object"),
])
def test_bad_pairs_are_one_line_errors(pairs, match):
    with pytest.raises(InvalidFileError, match=match):
        pair_model_from_dict(pairs, 4)
