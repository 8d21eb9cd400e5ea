"""Acyclic sharding partitions (issue #16.3): the three sharding partitioners keep the
components a DAG by default (a pipeline can run them), brute force stays exact under the
constraint (held to an enumeration written here, independently), and every plan reports what
the constraint costs against the same search without it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardplan import registry
from shardplan.generate import layered
from shardplan.ir import Graph, Topology
from shardplan.objectives import evaluate
from shardplan.partition._sharding_acyclic import allowed_range, make_monotone
from shardplan.partition._sharding_common import flat_problem
from shardplan.partition._sharding_local import local_search
from shardplan.partition._sharding_problem import restart_rng
from shardplan.partition._sharding_starts import initial_assignment
from shardplan.topology import build
from tests.partition.test_brute_force import exhaustive_optimum


def _acyclic_labels(labels: np.ndarray, src: np.ndarray, dst: np.ndarray, k: int
                    ) -> np.ndarray:
    """Which label vectors give a quotient graph without a cycle (Kahn on k blocks)."""
    keep = np.zeros(len(labels), dtype=bool)
    for i, lab in enumerate(labels):
        edges = {(int(lab[u]), int(lab[v])) for u, v in zip(src, dst, strict=True)
                 if lab[u] != lab[v]}
        indeg = [0] * k
        for _, b in edges:
            indeg[b] += 1
        ready = [b for b in range(k) if indeg[b] == 0]
        seen = 0
        while ready:
            a = ready.pop()
            seen += 1
            for x, b in edges:
                if x == a:
                    indeg[b] -= 1
                    if indeg[b] == 0:
                        ready.append(b)
        keep[i] = seen == k
    return keep


def enumerated_optimum(weights: np.ndarray, src: np.ndarray, dst: np.ndarray, m: np.ndarray,
                       k: int, *, acyclic: bool) -> float:
    """min over partitions into k non-empty blocks (only those whose blocks form a DAG when
    ``acyclic``) and injective block -> device maps of the sharding cost."""
    keep = (lambda labels: _acyclic_labels(labels, src, dst, k)) if acyclic else None
    return exhaustive_optimum(weights, src, dst, m, k, keep)


def _topology(m: np.ndarray) -> Topology:
    return build("flat", num_devices=m.shape[0]).replace(cost=m)


@st.composite
def instances(draw):
    n = draw(st.integers(2, 8))
    d = draw(st.integers(2, 3))
    k = draw(st.integers(2, min(n, d)))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = sorted(set(draw(st.lists(st.sampled_from(pairs), min_size=1, max_size=12))))
    weights = draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))
    vals = draw(st.lists(st.sampled_from([0.1, 0.5, 1.0, 3.0]), min_size=d * d,
                         max_size=d * d))
    m = np.array(vals).reshape(d, d)
    np.fill_diagonal(m, 0.0)
    perm = draw(st.permutations(list(range(n))))  # ids not in topological order
    src = np.array([perm[u] for u, _ in edges], dtype=np.int64)
    dst = np.array([perm[v] for _, v in edges], dtype=np.int64)
    return np.array(weights, dtype=float), src, dst, m, k


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_brute_force_is_exact_under_the_constraint(inst) -> None:
    weights, src, dst, m, k = inst
    graph = Graph.from_arrays(name="h", fwd_flops=np.ones(len(weights)), src=src, dst=dst,
                              weight=weights)
    topo = _topology(m)
    want = enumerated_optimum(weights, src, dst, m, k, acyclic=True)
    free = enumerated_optimum(weights, src, dst, m, k, acyclic=False)
    for incumbent in ("none", "heuristic"):
        plan = registry.run("partition", "brute-force", graph, topo, stages=k,
                            incumbent=incumbent).plan
        assert plan.status == "optimal"
        assert math.isclose(plan.objective.value, want, rel_tol=1e-9, abs_tol=1e-9)
        assert graph.is_acyclic_partition(plan.assignment(graph.num_nodes))
        report = plan.meta["acyclic"]
        assert report["acyclic"] and report["exact"]
        assert math.isclose(report["unconstrained"], free, rel_tol=1e-9, abs_tol=1e-9)
        assert report["ratio"] is None or report["ratio"] >= 1 - 1e-9
    plan = registry.run("partition", "brute-force", graph, topo, stages=k,
                        acyclic=False).plan
    assert math.isclose(plan.objective.value, free, rel_tol=1e-9, abs_tol=1e-9)
    assert "unconstrained" not in plan.meta["acyclic"]


def _pair() -> tuple[Graph, Topology]:
    """0 -> 1 -> 2, weights 1, 2, 1, two devices with cheap links: the balanced split puts
    0 and 2 together (both edges cut, a cycle); the best acyclic one cuts once."""
    g = Graph.from_arrays(name="chain3", fwd_flops=[1.0, 1.0, 1.0], src=[0, 1], dst=[1, 2],
                          weight=[1.0, 2.0, 1.0])
    return g, build("flat", num_devices=2, latency=0.1)


@pytest.mark.parametrize("algorithm", ["brute-force", "heuristic", "hierarchical"])
def test_cost_of_the_constraint_known_by_hand(algorithm: str) -> None:
    g, topo = _pair()
    opts = {"workers": 1} if algorithm == "heuristic" else {}
    free = registry.run("partition", algorithm, g, topo, acyclic=False, **opts).plan
    assert free.objective.value == pytest.approx(0.2)
    assert not g.is_acyclic_partition(free.assignment(3))
    assert free.meta["acyclic"] == {"acyclic": False}
    plan = registry.run("partition", algorithm, g, topo, **opts).plan
    assert plan.options["acyclic"] is True
    assert plan.objective.value == pytest.approx(2.1)  # imbalance 1 + 1, one cut edge
    assert g.is_acyclic_partition(plan.assignment(3))
    report = plan.meta["acyclic"]
    assert report["acyclic"] is True and report["unconstrained_acyclic"] is False
    assert report["unconstrained"] == pytest.approx(0.2)
    assert report["ratio"] == pytest.approx(10.5)
    assert evaluate(plan, g, topo, "sharding")[1] == pytest.approx(2.1)
    g.stage_order(plan.assignment(3), plan.num_stages)  # a pipeline order exists


@pytest.mark.parametrize("seed", range(6))
def test_heuristic_and_hierarchical_plans_are_dags(seed: int) -> None:
    g = layered(60, width=4, seed=seed)
    topo = build("hierarchical", shape=(2, 3), level_names=("box", "gpu"))
    for algorithm in ("heuristic", "hierarchical"):
        opts = {"workers": 1} if algorithm == "heuristic" else {}
        plan = registry.run("partition", algorithm, g, topo, seed=seed, **opts).plan
        assert g.is_acyclic_partition(plan.assignment(g.num_nodes)), algorithm
        report = plan.meta["acyclic"]
        assert report["acyclic"] is True and report["exact"] is False
        assert report["ratio"] == pytest.approx(plan.objective.value
                                                / report["unconstrained"])
        assert evaluate(plan, g, topo, "sharding")[1] == pytest.approx(plan.objective.value)


@pytest.mark.parametrize("seed", range(4))
def test_heuristic_never_below_the_exact_acyclic_optimum(seed: int) -> None:
    g = layered(10, width=3, seed=seed)
    flat3 = build("flat", num_devices=3)
    best = registry.run("partition", "brute-force", g, flat3).plan
    assert best.status == "optimal"
    got = registry.run("partition", "heuristic", g, flat3, workers=1, seed=seed).plan
    assert got.objective.value >= best.objective.value - 1e-9


@pytest.mark.parametrize("start", ["random", "topo", "metis"])
def test_starts_and_moves_stay_monotone(start: str) -> None:
    """Every start is monotone, every node's allowed components are those that keep it so,
    and the local search (moves, exchanges, placement swaps) never leaves it."""
    g = layered(80, width=5, seed=3)
    topo = build("flat", num_devices=5)
    problem = flat_problem(g, topo, 5, acyclic=True)
    for restart in range(3):
        rng = restart_rng(7, restart)
        a = initial_assignment(problem, start, rng, restart, np.arange(5))
        assert problem.is_monotone(a) and np.bincount(a, minlength=5).min() >= 1
        for v in range(0, g.num_nodes, 7):
            lo, hi = allowed_range(problem, a, v)
            for c in range(5):
                b = a.copy()
                b[v] = c
                assert problem.is_monotone(b) == (lo <= c <= hi)
        out = local_search(problem, a, np.arange(5), rng, max_iterations=50)
        assert problem.is_monotone(out.assignment)
        assert out.cost <= problem.objective(a, np.arange(5)) + 1e-9


def test_make_monotone() -> None:
    g = layered(50, width=4, seed=1)
    problem = flat_problem(g, build("flat", num_devices=4), 4, acyclic=True)
    rng = np.random.default_rng(0)
    for _ in range(5):
        a = make_monotone(problem, rng.integers(4, size=g.num_nodes))
        assert problem.is_monotone(a)


@pytest.mark.parametrize("start", ["random", "topo", "metis"])
def test_starts_fill_every_component_with_zero_weights(start: str) -> None:
    """Weights that are mostly zero put several cut points at one place; the runs still get
    a node each (the topological start used to leave one empty)."""
    g = Graph.from_arrays(name="h", fwd_flops=np.ones(4), src=[], dst=[],
                          weight=[0.0, 0.0, 1.0, 0.0])
    problem = flat_problem(g, build("flat", num_devices=3), 3, acyclic=True)
    for restart in range(4):
        a = initial_assignment(problem, start, restart_rng(0, restart), restart, np.arange(3))
        assert np.bincount(a, minlength=3).min() >= 1 and problem.is_monotone(a)
    plan = registry.run("partition", "heuristic", g, build("flat", num_devices=3),
                        workers=1).plan
    assert all(len(st.nodes) >= 1 for st in plan.stages)
