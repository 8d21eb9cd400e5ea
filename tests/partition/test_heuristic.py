"""The heuristic partitioner (paper 000, 2.3) and its local-search engine."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardplan import registry
from shardplan.cost import sharding_cost
from shardplan.errors import ShardplanError
from shardplan.generate import layered
from shardplan.ir import Graph
from shardplan.objectives import evaluate
from shardplan.partition._sharding_common import flat_problem
from shardplan.partition._sharding_local import local_search
from shardplan.partition._sharding_placement import (
    greedy_placement,
    improve_placement,
    slot_swap_deltas,
)
from shardplan.partition._sharding_problem import restart_rng
from shardplan.partition._sharding_starts import initial_assignment
from shardplan.partition._sharding_swaps import swap_deltas
from shardplan.topology import build


def _topo(d: int = 4):
    t = build("hierarchical", shape=(2, d // 2), level_names=("box", "gpu"),
              latency=(5e-6, 2e-6), bandwidth=(1e10, 1e11))
    return t.replace(cost=t.latency * 1e6)  # M in microseconds: 5 across boxes, 2 inside


def _same(p, q) -> bool:
    return [(s.nodes, s.devices) for s in p.stages] == [(s.nodes, s.devices) for s in q.stages]


@st.composite
def instances(draw):
    n = draw(st.integers(2, 10))
    d = draw(st.sampled_from([2, 3, 4]))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = sorted(set(draw(st.lists(st.sampled_from(pairs), max_size=16))))
    weights = draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))
    m = np.array(draw(st.lists(st.sampled_from([0.5, 1.0, 4.0]), min_size=d * d,
                               max_size=d * d))).reshape(d, d)
    np.fill_diagonal(m, 0.0)
    g = Graph.from_arrays(name="h", fwd_flops=np.ones(n), src=[e[0] for e in edges],
                          dst=[e[1] for e in edges], weight=weights)
    return g, build("flat", num_devices=d).replace(cost=m), draw(st.sampled_from(
        ["random", "topo", "metis"]))


@settings(max_examples=40, deadline=None)
@given(instances())
def test_plans_valid_and_objective_recomputes(inst) -> None:
    g, t, start = inst
    k = min(g.num_nodes, t.num_devices)
    res = registry.run("partition", "heuristic", g, t, stages=k, workers=1, restarts=3,
                       start=start)
    plan = res.plan
    plan.validate(g, t)
    assert len(plan.stages) == k and all(len(s.nodes) >= 1 for s in plan.stages)
    assert len({s.devices[0] for s in plan.stages}) == k
    name, value, _ = evaluate(plan, g, t, "sharding")
    assert name == plan.objective.name == "sharding_cost"
    assert math.isclose(value, plan.objective.value, rel_tol=1e-9, abs_tol=1e-9)
    # Never below the exact optimum.
    exact = registry.run("partition", "brute-force", g, t, stages=k).plan.objective.value
    assert plan.objective.value >= exact - 1e-9


def test_same_seed_same_plan_and_seed_matters() -> None:
    g, t = layered(120, width=12, seed=2), _topo()
    a = registry.run("partition", "heuristic", g, t, seed=3, workers=1, restarts=3)
    b = registry.run("partition", "heuristic", g, t, seed=3, workers=1, restarts=3)
    assert _same(a.plan, b.plan) and a.plan.objective.value == b.plan.objective.value
    costs = {registry.run("partition", "heuristic", g, t, seed=s, workers=1,
                          restarts=1).plan.objective.value for s in range(4)}
    assert len(costs) > 1


@pytest.mark.multiprocess
def test_worker_count_does_not_change_the_plan() -> None:
    g, t = layered(150, width=15, seed=1), _topo()
    one = registry.run("partition", "heuristic", g, t, seed=7, workers=1, restarts=4)
    two = registry.run("partition", "heuristic", g, t, seed=7, workers=2, restarts=4)
    assert _same(one.plan, two.plan)
    assert one.stats["restarts"] == two.stats["restarts"]


def test_restart_seeds_depend_only_on_seed_and_index() -> None:
    assert restart_rng(5, 2).integers(1 << 30) == restart_rng(5, 2).integers(1 << 30)
    assert restart_rng(5, 2).integers(1 << 30) != restart_rng(5, 3).integers(1 << 30)


def test_local_search_tracks_the_objective_and_ends_at_a_local_optimum() -> None:
    g, t = layered(80, width=8, seed=4), _topo()
    problem = flat_problem(g, t, 4)
    rng = restart_rng(0, 0)
    a0 = initial_assignment(problem, "random", rng, 0, np.arange(4))
    p0 = greedy_placement(problem, problem.comm_matrix(a0))
    out = local_search(problem, a0, p0, rng)
    assert not out.timed_out
    assert out.cost == pytest.approx(sharding_cost(out.assignment, out.placement, g, t))
    assert out.cost <= problem.objective(a0, p0)
    assert all(b[1] <= a[1] + 1e-9 for a, b in itertools.pairwise(out.trace))
    # No single-node move improves (checked by brute recomputation).
    sizes = np.bincount(out.assignment, minlength=4)
    for v in range(g.num_nodes):
        if sizes[out.assignment[v]] == 1:
            continue
        for c in range(4):
            a = out.assignment.copy()
            a[v] = c
            assert sharding_cost(a, out.placement, g, t) >= out.cost - 1e-9


def test_swap_deltas_match_recomputation() -> None:
    rng = np.random.default_rng(0)
    k, d = 4, 6
    comm = rng.integers(0, 5, (k, k)).astype(float)
    np.fill_diagonal(comm, 0.0)
    m = rng.random((d, d))
    np.fill_diagonal(m, 0.0)
    p = np.array([3, 0, 5, 1])

    def cut(pl):
        return float((comm * m[np.ix_(pl, pl)]).sum())

    swap, move = slot_swap_deltas(comm, m, p)
    for i, j in itertools.permutations(range(k), 2):
        q = p.copy()
        q[i], q[j] = q[j], q[i]
        assert swap[i, j] == pytest.approx(cut(q) - cut(p))
    for i in range(k):
        for f in (2, 4):  # the free slots
            q = p.copy()
            q[i] = f
            assert move[i, f] == pytest.approx(cut(q) - cut(p))


def test_improve_placement_never_worsens() -> None:
    g, t = layered(60, width=6, seed=1), build("flat", num_devices=6).replace(
        cost=np.random.default_rng(1).random((6, 6)))
    problem = flat_problem(g, t, 4)
    a = initial_assignment(problem, "topo", restart_rng(0, 0), 0, np.arange(4))
    p0 = np.array([5, 1, 3, 0])
    p1, _ = improve_placement(problem, a, p0, 1e-12)
    assert problem.objective(a, p1) <= problem.objective(a, p0)
    assert len(set(p1.tolist())) == 4


@pytest.mark.parametrize("start", ["random", "topo", "metis"])
def test_starts_respect_min_sizes(start: str) -> None:
    g, t = layered(30, width=3, seed=0), _topo()
    problem = flat_problem(g, t, 4)
    a = initial_assignment(problem, start, restart_rng(1, 0), 0, np.arange(4))
    assert np.bincount(a, minlength=4).min() >= 1


def test_stages_fewer_than_devices_uses_distinct_devices() -> None:
    g, t = layered(40, width=4, seed=0), _topo()
    res = registry.run("partition", "heuristic", g, t, stages=3, workers=1, restarts=2)
    assert len(res.plan.stages) == 3
    assert len({s.devices[0] for s in res.plan.stages}) == 3


def test_time_limit_status() -> None:
    g, t = layered(400, width=20, seed=0), _topo()
    res = registry.run("partition", "heuristic", g, t, workers=1, restarts=50,
                       time_limit=0.2)
    assert res.plan.status == "timed_out"
    assert res.stats["restarts_run"] < 50


def test_bad_options() -> None:
    g, t = layered(10, width=2, seed=0), _topo()
    for opts, msg in [({"start": "nope"}, "start"), ({"restarts": 0}, "restarts"),
                      ({"workers": "2"}, "workers"), ({"stages": 9}, "stages"),
                      ({"alpha": 1}, "does not take")]:
        with pytest.raises(ShardplanError, match=msg):
            registry.run("partition", "heuristic", g, t, **opts)


def test_node_swap_deltas_match_recomputation() -> None:
    g = layered(30, width=4, seed=5)
    t = build("flat", num_devices=4).replace(cost=np.random.default_rng(2).random((4, 4)))
    problem = flat_problem(g, t, 3)
    a = initial_assignment(problem, "random", restart_rng(0, 0), 0, np.arange(3))
    p = np.array([2, 0, 3])
    w = np.bincount(a, weights=g.weight, minlength=3)
    delta = swap_deltas(problem, a, p, w)
    base = sharding_cost(a, p, g, t)
    for v in range(g.num_nodes):
        for u in range(g.num_nodes):
            if a[v] == a[u]:
                assert delta[v, u] == np.inf
                continue
            b = a.copy()
            b[v], b[u] = a[u], a[v]
            assert delta[v, u] == pytest.approx(sharding_cost(b, p, g, t) - base, abs=1e-9)


def test_swaps_escape_a_balanced_local_optimum() -> None:
    # Chain 0-1-2-3 of unit weights on 2 devices at cost 1: {0, 3} | {1, 2} has cut 2 and no
    # improving single move (each unbalances by 2); exchanging 1 and 3 reaches cut 1.
    g = Graph.from_arrays(name="c", fwd_flops=np.ones(4), src=[0, 1, 2], dst=[1, 2, 3],
                          weight=np.ones(4))
    t = build("flat", num_devices=2, latency=1.0)
    problem = flat_problem(g, t, 2)
    a0, p0 = np.array([0, 1, 1, 0]), np.array([0, 1])
    stuck = local_search(problem, a0, p0, restart_rng(0, 0), swaps=False)
    assert stuck.cost == 2.0
    out = local_search(problem, a0, p0, restart_rng(0, 0))
    assert out.cost == 1.0


def _greedy_reference(problem, comm: np.ndarray) -> np.ndarray:
    """The greedy placement recomputed in full at every step (dense, O(k^2 D))."""
    m = problem.cost
    k, d = problem.k, m.shape[0]
    traffic, sym = comm + comm.T, m + m.T
    free, placed = np.ones(d, dtype=bool), np.zeros(k, dtype=bool)
    placement = np.full(k, -1, dtype=np.int64)
    first = int(np.argmax(traffic.sum(axis=1)))
    near = np.sort(sym + np.where(np.eye(d, dtype=bool), np.inf, 0.0), axis=1)[:, :k - 1]
    placement[first] = int(np.argmin(near.sum(axis=1))) if k > 1 else 0
    free[placement[first]], placed[first] = False, True
    for _ in range(k - 1):
        cand = np.flatnonzero(~placed)
        c = int(cand[np.argmax(traffic[np.ix_(cand, np.flatnonzero(placed))].sum(axis=1))])
        pc = placement[placed]
        add = m[:, pc] @ comm[c, placed] + m[pc, :].T @ comm[placed, c]
        tie = sym[:, pc].sum(axis=1)
        fr = np.flatnonzero(free)
        best = fr[np.lexsort((fr, tie[fr], add[fr]))[0]]
        placement[c], free[best], placed[c] = best, False, True
    return placement


@pytest.mark.parametrize("seed", range(8))
def test_incremental_placement_equals_the_full_recomputation(seed: int) -> None:
    from shardplan.partition._sharding_placement import _SlotCosts

    rng = np.random.default_rng(seed)
    k, d = int(rng.integers(3, 9)), 10
    g = layered(80, width=8, seed=seed)
    cost = np.round(rng.random((d, d)) * 4) / 4  # a few distinct values: ties happen
    np.fill_diagonal(cost, 0.0)
    problem = flat_problem(g, build("flat", num_devices=d).replace(cost=cost), k)
    a = initial_assignment(problem, "random", restart_rng(seed, 0), 0, np.arange(k))
    comm = problem.comm_matrix(a)
    assert np.array_equal(problem.comm_sparse(a).toarray(), comm)
    p = greedy_placement(problem, problem.comm_sparse(a))
    assert np.array_equal(p, _greedy_reference(problem, comm))
    # Slot costs kept up to date through swaps and moves equal a fresh evaluation.
    kept = _SlotCosts(problem.comm_sparse(a), cost, p)
    p = p.copy()
    for _ in range(20):
        if rng.random() < 0.5:
            i, j = rng.choice(k, 2, replace=False)
            kept.move(int(i), int(p[i]), int(p[j]))
            kept.move(int(j), int(p[j]), int(p[i]))
            p[i], p[j] = p[j], p[i]
        else:
            i, f = int(rng.integers(k)), int(rng.choice(np.setdiff1d(np.arange(d), p)))
            kept.move(i, int(p[i]), f)
            p[i] = f
        swap, move = kept.deltas(p)
        ref_swap, ref_move = slot_swap_deltas(comm, cost, p)
        assert np.allclose(swap, ref_swap, atol=1e-9) and np.allclose(move, ref_move, atol=1e-9)


def test_incremental_improve_placement_agrees_with_the_dense_one(monkeypatch) -> None:
    """Above 2^25 k^2 D the deltas are kept up to date instead of recomputed; on costs
    without ties both walk the same swaps (forced here on a small instance)."""
    import shardplan.partition._sharding_placement as search

    rng = np.random.default_rng(3)
    d = 9
    cost = rng.random((d, d))
    np.fill_diagonal(cost, 0.0)
    g = layered(90, width=9, seed=3)
    problem = flat_problem(g, build("flat", num_devices=d).replace(cost=cost), 6)
    a = initial_assignment(problem, "random", restart_rng(0, 0), 0, np.arange(6))
    p0 = np.array([8, 0, 4, 2, 6, 1])
    dense, moved = improve_placement(problem, a, p0, 1e-12)
    monkeypatch.setattr(search, "_DENSE_WORK", 0)
    kept, moved_too = improve_placement(problem, a, p0, 1e-12)
    assert moved and moved_too
    assert np.array_equal(dense, kept)
    assert problem.objective(a, kept) < problem.objective(a, p0)


@pytest.mark.parametrize("weights,targets,floor,nearest", [
    ([0, 7, 6, 6, 6], [1, 1, 1, 1], [1, 2, 3], [2, 3, 4]),  # cuts 6.25, 12.5, 18.75
    ([5, 1, 1, 1], [1, 1], [0], [1]),  # cut 4: no prefix within it; 5 is nearer than 0
    ([1, 2, 1], [1, 1], [1], [1]),  # cut 2, prefixes 1 and 3: a tie keeps the floor
    ([2, 2, 2, 2], [1, 1, 1], [1, 2], [1, 3]),  # cuts 8/3, 16/3
    ([1, 1, 1, 1, 1, 1], [1, 2], [2], [2]),  # targets in proportion: cut at 2 of 6
    ([1, 1, 10], [1, 0], [3], [3]),  # a last run of no weight: the cut after every node
    ([1, 1, 1, 1], [0.2, 0.2], [2], [2]),  # targets are proportions, whatever their sum
    ([1, 1, 2, 2], [1, 1], [2], [2]),  # cut 3 between prefixes 2 and 4: a tie
    ([3, 1], [1, 1], [0], [1]),  # cut 2: the empty prefix (0) is farther than 3
    ([1, 1, 1, 5], [1, 1], [3], [3]),  # cut 4 between 3 and 8: the floor is nearer
])
def test_cut_points_by_hand(weights, targets, floor, nearest) -> None:
    """The starts' cuts of a topological order (``_runs`` keeps the cheaper of the two)."""
    from shardplan.partition._sharding_starts import cut_points

    f, c = cut_points(np.asarray(weights, dtype=float), np.asarray(targets, dtype=float))
    assert f.tolist() == floor and c.tolist() == nearest
