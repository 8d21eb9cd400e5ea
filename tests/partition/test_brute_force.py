"""Brute force (paper 000, 2.2) against an exhaustive enumeration written here, independently:
every set partition into k blocks (restricted growth strings) times every ordered choice of k
devices, all costs computed with NumPy from the definition."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardplan import registry
from shardplan.errors import ShardplanError
from shardplan.generate import layered
from shardplan.ir import Graph, Topology
from shardplan.objectives import evaluate
from shardplan.partition.brute_force import device_classes, imbalance_lower_bound
from shardplan.topology import build


def exhaustive_optimum(weights: np.ndarray, src: np.ndarray, dst: np.ndarray, m: np.ndarray,
                       k: int, keep: Callable[[np.ndarray], np.ndarray] | None = None
                       ) -> float:
    """min over partitions into k non-empty blocks and injective block -> device maps of
    sum_i (W_i - mean W)^2 + sum over cut edges of M[dev(u), dev(v)]; ``keep`` (labels ->
    mask of the label rows allowed) restricts the partitions."""
    n, d = len(weights), m.shape[0]
    labels = np.array(list(itertools.product(range(k), repeat=n)), dtype=np.int64)
    if n > 1:
        run_max = np.maximum.accumulate(labels, axis=1)
        rgs = (labels[:, 0] == 0) & np.all(labels[:, 1:] <= run_max[:, :-1] + 1, axis=1)
    else:
        rgs = labels[:, 0] == 0
    labels = labels[rgs]
    labels = labels[labels.max(axis=1) == k - 1]  # exactly k blocks
    if keep is not None:
        labels = labels[keep(labels)]
    block_w = np.stack([(labels == b) @ weights for b in range(k)], axis=1)
    imb = ((block_w - block_w.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)
    best = math.inf
    for devs in itertools.permutations(range(d), k):
        dv = np.asarray(devs)[labels]  # device of every node, per partition
        cut = m[dv[:, src], dv[:, dst]].sum(axis=1) if len(src) else 0.0
        best = min(best, float(np.min(imb + cut)))
    return best


def _topology(m: np.ndarray) -> Topology:
    return build("flat", num_devices=m.shape[0]).replace(cost=m)


@st.composite
def instances(draw):
    n = draw(st.integers(1, 10))
    d = draw(st.integers(2, 4))
    k = draw(st.integers(1, min(n, d)))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = sorted(set(draw(st.lists(st.sampled_from(pairs), max_size=14)))) if pairs else []
    weights = draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))
    # Few distinct link costs, so that identical devices (symmetry breaking) occur often.
    vals = draw(st.lists(st.sampled_from([0.5, 1.0, 3.0]), min_size=d * d, max_size=d * d))
    m = np.array(vals).reshape(d, d)
    if draw(st.booleans()):
        m = np.minimum(m, m.T)  # symmetric
    np.fill_diagonal(m, 0.0)
    perm = draw(st.permutations(list(range(n))))  # ids not in topological order
    src = np.array([perm[u] for u, _ in edges], dtype=np.int64)
    dst = np.array([perm[v] for _, v in edges], dtype=np.int64)
    return np.array(weights, dtype=float), src, dst, m, k


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_equals_exhaustive_enumeration(inst) -> None:
    weights, src, dst, m, k = inst
    graph = Graph.from_arrays(name="h", fwd_flops=np.ones(len(weights)), src=src, dst=dst,
                              weight=weights)
    topo = _topology(m)
    expected = exhaustive_optimum(weights, src, dst, m, k)
    for incumbent in ("none", "heuristic"):
        res = registry.run("partition", "brute-force", graph, topo, stages=k,
                           incumbent=incumbent, acyclic=False)  # the paper's problem
        plan = res.plan
        assert plan.status == "optimal"
        assert math.isclose(plan.objective.value, expected, rel_tol=1e-9, abs_tol=1e-9)
        assert plan.objective.lower_bound == plan.objective.value
        assert evaluate(plan, graph, topo, "sharding")[1] == pytest.approx(expected, abs=1e-9)
        assert len(plan.stages) == k and all(len(s.nodes) > 0 for s in plan.stages)


def test_water_filling_bound_by_hand() -> None:
    # Loads (0, 4, 10), 6 left, mean 20/3: fill 0 and 4 to level 5 -> (5, 5, 10).
    mean = 20 / 3
    assert imbalance_lower_bound([10.0, 0.0, 4.0], 6.0, mean) == pytest.approx(
        2 * (5 - mean) ** 2 + (10 - mean) ** 2)
    # Enough to level everything: bound 0.
    assert imbalance_lower_bound([0.0, 0.0], 8.0, 4.0) == 0.0


def test_device_classes() -> None:
    m = np.array([[0, 1, 2], [1, 0, 2], [2, 2, 0]], dtype=float)
    assert device_classes(m).tolist() == [0, 0, 1]
    assert device_classes(np.zeros((3, 3))).tolist() == [0, 0, 0]


def test_hierarchical_topology_is_one_class_per_swap_group() -> None:
    # Swapping the two GPUs of a box leaves M unchanged; swapping GPUs of different boxes
    # does not (it is not a transposition-automorphism), so two classes.
    t = build("hierarchical", shape=(2, 2), level_names=("box", "gpu"),
              latency=(5e-6, 2e-6), bandwidth=(1e10, 1e11))
    assert device_classes(t.cost_matrix).tolist() == [0, 0, 1, 1]


def test_chain_optimum_known_by_hand() -> None:
    # Chain of 6 unit nodes on 3 identical devices at cost 1: optimum is 3 runs of 2, cost 2.
    g = Graph.from_arrays(name="chain", fwd_flops=np.ones(6), src=range(5), dst=range(1, 6),
                          weight=np.ones(6))
    res = registry.run("partition", "brute-force", g, build("flat", num_devices=3, latency=1.0))
    assert res.plan.objective.value == 2.0 and res.plan.status == "optimal"
    assert sorted(s.nodes for s in res.plan.stages) == [(0, 1), (2, 3), (4, 5)]


def test_time_limit_returns_best_found() -> None:
    g = layered(60, width=6, seed=0)
    t = build("flat", num_devices=4, latency=1.0)
    res = registry.run("partition", "brute-force", g, t, time_limit=0.3, incumbent="none")
    assert res.plan.status == "timed_out"
    assert res.plan.objective.lower_bound is None
    assert evaluate(res.plan, g, t, "sharding")[1] == pytest.approx(res.plan.objective.value)


def test_bad_options() -> None:
    g = layered(6, width=2, seed=0)
    t = build("flat", num_devices=3)
    with pytest.raises(ShardplanError, match="stages"):
        registry.run("partition", "brute-force", g, t, stages=4)
    with pytest.raises(ShardplanError, match="incumbent"):
        registry.run("partition", "brute-force", g, t, incumbent="magic")
    with pytest.raises(ShardplanError, match="does not take"):
        registry.run("partition", "brute-force", g, t, workers=2)
    tiny = layered(2, width=1, seed=0)
    with pytest.raises(ShardplanError, match="non-empty"):
        registry.run("partition", "brute-force", tiny, t)
