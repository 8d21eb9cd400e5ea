"""The sharding heuristics held to brute force (paper 000, sections 2.2, 2.3 and 2.5).

Validity-only tests let a heuristic get silently worse. Here the ``heuristic`` and
``hierarchical`` partitioners (the latter with and without its final flat refinement) are
compared with the exact optimum on a fixed family of small random instances, with and
without the ``acyclic`` constraint, and two figures are asserted per algorithm and setting:
the share of instances on which it reaches the optimum and its worst ratio to it. The
thresholds are today's measured figures with a small margin, so a regression fails while
an improvement passes (then tighten them: the measured figures are printed with ``-s``).
A few fixed instances pin the exact results. Each level of the hierarchical recursion is
also tested on its own, refinement off, on device groups of unequal size, against the split
the per-level weighting must produce.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest

from shardplan import registry
from shardplan.ir import Graph, Level, Topology
from shardplan.partition.hierarchical import _Recursion, hierarchy_groups
from shardplan.topology import build

#: The algorithms compared with brute force (name, registry name, options).
VARIANTS = {
    "heuristic": ("heuristic", {"workers": 1}),
    "hierarchical": ("hierarchical", {}),
    "hierarchical-norefine": ("hierarchical", {"refine": False}),
}


def instance(i: int) -> tuple[Graph, Topology]:
    """Random instance ``i``: 4-8 nodes, 2-4 devices, integer weights 0-9, a random DAG with
    edge probability 0.35 and ids not in topological order, M drawn from {0.5, 1, 4}
    (symmetric half of the time), and a level of boxes of unequal size for 3 devices."""
    rng = np.random.default_rng(1000 + i)
    n = int(rng.integers(4, 9))
    d = int(rng.choice([2, 3, 4]))
    iu = np.triu_indices(n, 1)
    keep = rng.random(iu[0].size) < 0.35
    perm = rng.permutation(n)
    src, dst = perm[iu[0][keep]], perm[iu[1][keep]]
    weight = rng.integers(0, 10, n).astype(float)
    m = rng.choice([0.5, 1.0, 4.0], size=(d, d))
    if rng.random() < 0.5:
        m = np.minimum(m, m.T)
    np.fill_diagonal(m, 0.0)
    groups = {2: ((0,), (1,)), 3: ((0, 1), (2,)), 4: ((0, 1), (2, 3))}[d]
    g = Graph.from_arrays(name=f"r{i}", fwd_flops=np.ones(n), src=src, dst=dst, weight=weight)
    return g, build("flat", num_devices=d).replace(cost=m, levels=(Level("box", groups),))


def _ratio(value: float, optimum: float) -> float:
    if optimum > 0:
        return value / optimum
    return 1.0 if value <= 1e-9 else math.inf


@cache
def outcome(i: int) -> dict[tuple[str, bool], tuple[float, float]]:
    """``(variant, acyclic) -> (value, exact optimum)`` on instance ``i``. One run with
    ``acyclic`` gives both settings: each partitioner also runs the same search without the
    constraint and reports its cost (``meta["acyclic"]["unconstrained"]``)."""
    g, t = instance(i)
    exact = registry.run("partition", "brute-force", g, t).plan
    assert exact.status == "optimal" and exact.meta["acyclic"]["exact"] is True
    opt = {True: exact.objective.value, False: exact.meta["acyclic"]["unconstrained"]}
    out = {}
    for name, (algorithm, opts) in VARIANTS.items():
        plan = registry.run("partition", algorithm, g, t, seed=i, **opts).plan
        got = {True: plan.objective.value, False: plan.meta["acyclic"]["unconstrained"]}
        for acyclic in (True, False):
            assert got[acyclic] >= opt[acyclic] - 1e-9, (name, acyclic, i)
            out[(name, acyclic)] = (got[acyclic], opt[acyclic])
    return out


def _figures(indices: range) -> dict[tuple[str, bool], tuple[float, float, int]]:
    """``(variant, acyclic) -> (share at the optimum, worst ratio, instance of the worst)``."""
    rows: dict[tuple[str, bool], list[tuple[float, int]]] = {}
    for i in indices:
        for key, (value, opt) in outcome(i).items():
            rows.setdefault(key, []).append((_ratio(value, opt), i))
    out = {}
    for key, lst in rows.items():
        hits = sum(r <= 1 + 1e-9 for r, _ in lst) / len(lst)
        worst = max(lst)
        out[key] = (hits, worst[0], worst[1])
    return out


def _check(figures, thresholds) -> None:
    for key, (hits, worst, at) in sorted(figures.items()):
        print(f"{key[0]:22s} acyclic={key[1]!s:5s} at optimum {hits:.3f}, "
              f"worst ratio {worst:.4g} (instance {at})")
    for key, (min_hits, max_worst) in thresholds.items():
        hits, worst, at = figures[key]
        assert hits >= min_hits, (key, hits)
        assert worst <= max_worst, (key, worst, at)


#: Measured on instances 0-39 (2026-11-24): share at the optimum / worst ratio were
#: heuristic 0.950 / 1.5 (acyclic), 0.975 / 1.5 (free); hierarchical 0.875 / 3.167 and
#: 0.875 / 1.5; without refinement 0.600 / 4.333 and 0.600 / 3.333.
FAST = {
    ("heuristic", True): (0.925, 1.5),
    ("heuristic", False): (0.95, 1.5),
    ("hierarchical", True): (0.85, 3.2),
    ("hierarchical", False): (0.85, 1.5),
    ("hierarchical-norefine", True): (0.575, 4.4),
    ("hierarchical-norefine", False): (0.575, 3.4),
}

#: Measured on instances 0-299: heuristic 0.900 / 4.027 (acyclic), 0.940 / 1.667 (free);
#: hierarchical 0.817 / 3.167 and 0.860 / 2.75; without refinement 0.540 / 4.459 and
#: 0.537 / 3.457. (Before the starts' cuts could round to the nearest prefix weight, the
#: acyclic heuristic's worst was 15.29: instance 143, 80.25 against 5.25.)
SWEEP = {
    ("heuristic", True): (0.88, 4.1),
    ("heuristic", False): (0.925, 1.7),
    ("hierarchical", True): (0.80, 3.2),
    ("hierarchical", False): (0.845, 2.75),
    ("hierarchical-norefine", True): (0.525, 4.5),
    ("hierarchical-norefine", False): (0.52, 3.5),
}


def test_share_at_the_optimum_and_worst_ratio() -> None:
    _check(_figures(range(40)), FAST)


@pytest.mark.slow
def test_share_at_the_optimum_and_worst_ratio_300_instances() -> None:
    _check(_figures(range(300)), SWEEP)


# --------------------------------------------------------------- pinned fixed-seed results
#: ``instance -> {(variant, acyclic): value}`` as of 2026-11-24 (the exact optimum first).
PINNED = {
    27: {"exact": (2.0, 2.0), "heuristic": (3.0, 3.0), "hierarchical": (3.0, 3.0),
         "hierarchical-norefine": (3.0, 3.0)},
    33: {"exact": (16.0, 3.0), "heuristic": (16.0, 3.0), "hierarchical": (16.0, 3.0),
         "hierarchical-norefine": (19.0, 10.0)},
    39: {"exact": (3.0, 3.0), "heuristic": (3.0, 3.0), "hierarchical": (9.5, 3.0),
         "hierarchical-norefine": (13.0, 7.0)},
    # Weights 0, 7, 6, 6, 6 on 4 devices: the start that cuts the topological order after
    # the last node within each target ({0} alone) left the monotone moves at 80.25; the
    # start cut at the nearest prefix weight ({0, 1}) is the optimum.
    143: {"exact": (5.25, 4.75), "heuristic": (5.25, 4.75), "hierarchical": (5.25, 4.75),
          "hierarchical-norefine": (7.25, 11.75)},
}


@pytest.mark.parametrize("i", sorted(PINNED))
def test_pinned_instances(i: int) -> None:
    """Exact values on fixed instances, each setting run on its own (``acyclic`` true and
    false as separate calls); a change here is a change of behaviour to explain."""
    g, t = instance(i)
    for acyclic in (True, False):
        exact = registry.run("partition", "brute-force", g, t, acyclic=acyclic).plan
        assert exact.objective.value == pytest.approx(PINNED[i]["exact"][not acyclic])
        for name, (algorithm, opts) in VARIANTS.items():
            plan = registry.run("partition", algorithm, g, t, seed=i, acyclic=acyclic,
                                **opts).plan
            assert plan.objective.value == pytest.approx(PINNED[i][name][not acyclic]), \
                (name, acyclic)


# --------------------------------------------------------------- hierarchical levels alone
def _chain(weights) -> Graph:
    n = len(weights)
    return Graph.from_arrays(name="chain", fwd_flops=np.ones(n), src=range(n - 1),
                             dst=range(1, n), weight=np.asarray(weights, dtype=float))


def _unequal() -> Topology:
    """Four devices: a region of three (a box of two and a box of one) and a region of one;
    M 1 inside the box, 5 across boxes, 50 across regions."""
    m = np.array([[0, 1, 5, 50], [1, 0, 5, 50], [5, 5, 0, 50], [50, 50, 50, 0]], dtype=float)
    return build("flat", num_devices=4).replace(
        cost=m, levels=(Level("region", ((0, 1, 2), (3,))), Level("box", ((0, 1), (2,), (3,)))))


def _recursion(g: Graph, t: Topology, acyclic: bool) -> _Recursion:
    return _Recursion(g, t, hierarchy_groups(t), restarts=4, start="metis", max_iter=1000,
                      seed=0, deadline=None, clock_zero=0.0, progress=None, swaps=True,
                      coarsen=True, acyclic=acyclic)


def _level_cost(g: Graph, nodes: np.ndarray, part: np.ndarray, m: np.ndarray,
                children: list[tuple[int, ...]]) -> float:
    """The level's objective, restated: ``sum_g (W_g - |g| / |P| W_P)^2 / |g|`` plus, per
    edge inside ``nodes`` cut between groups a and b, the mean of M over their device
    pairs."""
    sizes = np.array([len(c) for c in children], dtype=float)
    w = g.weight[nodes]
    loads = np.bincount(part, weights=w, minlength=len(children))
    target = w.sum() * sizes / sizes.sum()
    cost = float(np.sum((loads - target) ** 2 / sizes))
    where = {int(v): int(p) for v, p in zip(nodes, part, strict=True)}
    for u, v in zip(g.src, g.dst, strict=True):
        if int(u) in where and int(v) in where and where[int(u)] != where[int(v)]:
            a, b = children[where[int(u)]], children[where[int(v)]]
            cost += float(m[np.ix_(a, b)].mean())
    return cost


def _best_level_cost(g, nodes, m, children, acyclic) -> float:
    """The level's optimum by enumeration (every group at least |g| nodes; with
    ``acyclic``, every edge from a group to itself or a later one in some group order)."""
    import itertools

    k = len(children)
    best = math.inf
    sizes = [len(c) for c in children]
    pos = {int(v): j for j, v in enumerate(nodes)}
    inside = [(pos[int(u)], pos[int(v)]) for u, v in zip(g.src, g.dst, strict=True)
              if int(u) in pos and int(v) in pos]
    for part in itertools.product(range(k), repeat=len(nodes)):
        p = np.array(part)
        if any(np.sum(p == c) < sizes[c] for c in range(k)):
            continue
        if acyclic and not any(all(order.index(p[a]) <= order.index(p[b]) for a, b in inside)
                               for order in itertools.permutations(range(k))):
            continue
        best = min(best, _level_cost(g, nodes, p, m, children))
    return best


@pytest.mark.parametrize("acyclic", [True, False])
def test_outer_level_splits_in_proportion_to_unequal_groups(acyclic: bool) -> None:
    # 12 unit nodes over regions of 3 devices and 1: targets 9 and 3; the chain is cut once,
    # at the 9th node (or, unconstrained, possibly with the region of one first).
    g, t = _chain(np.ones(12)), _unequal()
    levels = hierarchy_groups(t)
    assert levels[0] == [(0, 1, 2), (3,)]
    nodes = np.arange(12)
    part, order, *_ = _recursion(g, t, acyclic)._split(nodes, levels[0])
    assert np.bincount(part, minlength=2).tolist() == [9, 3]
    assert int(np.sum(part[:-1] != part[1:])) == 1
    if acyclic:
        assert part.tolist() == [0] * 9 + [1] * 3 and order == [0, 1]
    assert _level_cost(g, nodes, part, t.cost_matrix, levels[0]) == pytest.approx(
        _best_level_cost(g, nodes, t.cost_matrix, levels[0], acyclic))


@pytest.mark.parametrize("acyclic", [True, False])
def test_inner_level_splits_a_region_over_boxes_of_two_and_one(acyclic: bool) -> None:
    # The region's 9 nodes (weights not all equal) over a box of two devices and a box of
    # one: target weights 2/3 and 1/3 of the region's, imbalance divided by the box size.
    w = np.array([1, 3, 2, 2, 1, 3, 2, 1, 3], dtype=float)  # 18: targets 12 and 6
    g, t = _chain(w), _unequal()
    children = [(0, 1), (2,)]
    nodes = np.arange(9)
    part, order, *_ = _recursion(g, t, acyclic)._split(nodes, children)
    loads = np.bincount(part, weights=w, minlength=2).tolist()
    assert loads == [12.0, 6.0]
    if acyclic:
        assert part.tolist() == [0] * 6 + [1] * 3 and order == [0, 1]
    cost = _level_cost(g, nodes, part, t.cost_matrix, children)
    assert cost == pytest.approx(5.0)  # one cut edge between the boxes, balanced
    assert cost == pytest.approx(_best_level_cost(g, nodes, t.cost_matrix, children,
                                                  acyclic))


def test_level_weighting_is_what_makes_the_split_unequal() -> None:
    # The same region split with the imbalance of a group of 2 devices counted once (not
    # divided by 2) would move weight to the box of one; the level's optimum is known by
    # enumeration of the restated objective, and the split reaches it.
    w = np.array([4, 1, 1, 1, 1, 4], dtype=float)  # 12: targets 8 and 4
    g, t = _chain(w), _unequal()
    children = [(0, 1), (2,)]
    nodes = np.arange(6)
    for acyclic in (True, False):
        part, *_ = _recursion(g, t, acyclic)._split(nodes, children)
        assert _level_cost(g, nodes, part, t.cost_matrix, children) == pytest.approx(
            _best_level_cost(g, nodes, t.cost_matrix, children, acyclic))


@pytest.mark.parametrize("acyclic", [True, False])
def test_whole_recursion_without_refinement_on_unequal_groups(acyclic: bool) -> None:
    # Every level on its own gives 9 | 3, then 6 | 3, then 3 | 3: four runs of three, one
    # per device, the single cross-region edge next to the region of one.
    g, t = _chain(np.ones(12)), _unequal()
    res = registry.run("partition", "hierarchical", g, t, refine=False, acyclic=acyclic)
    assert res.stats["hierarchy"] == [2, 3, 4] and res.stats["subproblems"] == 3
    assert res.stats["before_refine"] == res.plan.objective.value
    runs = {s.devices[0]: s.nodes for s in res.plan.stages}
    assert sorted(runs.values()) == [(0, 1, 2), (3, 4, 5), (6, 7, 8), (9, 10, 11)]
    assert runs[3] == (9, 10, 11) and runs[2] == (6, 7, 8)
    exact = registry.run("partition", "brute-force", g, t, acyclic=acyclic).plan
    assert res.plan.objective.value == pytest.approx(exact.objective.value) == 56.0


def test_levels_that_split_nothing_are_dropped() -> None:
    # An outer level of one group, a level repeating the one above, and a last level that
    # already lists the devices one by one: none adds a split, so none is a level of the
    # recursion (a level kept twice would run a subproblem with a single child group).
    m = np.ones((4, 4)) - np.eye(4)
    t = build("flat", num_devices=4).replace(cost=m, levels=(
        Level("all", ((0, 1, 2, 3),)), Level("box", ((0, 1), (2, 3))),
        Level("again", ((0, 1), (2, 3))), Level("gpu", ((0,), (1,), (2,), (3,)))))
    assert hierarchy_groups(t) == [[(0, 1), (2, 3)], [(0,), (1,), (2,), (3,)]]
