"""The sharding cost of paper 000 section 2.1: hand-worked cases and a plain-Python reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardplan.cost import cross_edge_cost, sharding_cost, sharding_terms, weight_imbalance
from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Objective, Plan, Stage
from shardplan.objectives import evaluate
from shardplan.topology import build


def _chain4() -> Graph:
    # 0 -> 1 -> 2 -> 3 and 0 -> 2, weights 1, 2, 3, 4.
    return Graph.from_arrays(name="c4", fwd_flops=[1.0] * 4, src=[0, 1, 2, 0], dst=[1, 2, 3, 2],
                             weight=[1.0, 2.0, 3.0, 4.0])


def _topo3():
    t = build("flat", num_devices=3)
    m = np.array([[0.0, 1.0, 5.0], [2.0, 0.0, 7.0], [3.0, 11.0, 0.0]])  # asymmetric on purpose
    return t.replace(cost=m)


def test_hand_worked_value() -> None:
    g, t = _chain4(), _topo3()
    # Components {0, 1} -> device 2, {2, 3} -> device 0.
    a = np.array([0, 0, 1, 1])
    p = np.array([2, 0])
    # W = (3, 7), mean 5: imbalance (3-5)^2 + (7-5)^2 = 8 (not divided by k).
    # Cut edges 1->2 and 0->2, both from device 2 to device 0: M[2, 0] = 3 each.
    imb, cut = sharding_terms(a, p, g.weight, g.src, g.dst, t.cost_matrix)
    assert imb == 8.0 and cut == 6.0
    assert sharding_cost(a, p, g, t) == 14.0
    # The other direction of placement uses M[0, 2] = 5 instead.
    assert cross_edge_cost(a, np.array([0, 2]), g.src, g.dst, t.cost_matrix) == 10.0


def test_objective_through_plan_and_registry() -> None:
    g, t = _chain4(), _topo3()
    plan = Plan(graph="c4", topology=t.name, algorithm="hand",
                stages=(Stage((0, 1), (2,)), Stage((2, 3), (0,))),
                objective=Objective("sharding_cost", 14.0))
    name, value, details = evaluate(plan, g, t, "sharding")
    assert name == "sharding_cost" and value == 14.0
    assert details["weight_imbalance"] == 8.0 and details["cross_edge_cost"] == 6.0
    assert details["component_weights"] == [3.0, 7.0]


def test_latency_is_the_default_matrix() -> None:
    g = _chain4()
    t = build("flat", num_devices=2, latency=0.5)
    assert sharding_cost(np.array([0, 0, 1, 1]), np.array([0, 1]), g, t) == 8.0 + 2 * 0.5


def test_multi_device_stage_is_rejected() -> None:
    g, t = _chain4(), _topo3()
    plan = Plan(graph="c4", topology=t.name, algorithm="hand",
                stages=(Stage((0, 1), (0, 1)), Stage((2, 3), (2,))),
                objective=Objective("sharding_cost", 0.0))
    with pytest.raises(ShardplanError, match="one device per stage"):
        evaluate(plan, g, t, "sharding")


def test_imbalance_is_sum_not_variance() -> None:
    assert weight_imbalance(np.array([1.0, 3.0])) == 2.0  # np.var would give 1.0


def _reference(n, edges, weights, assign, place, m) -> float:
    k = len(place)
    w = [0.0] * k
    for v in range(n):
        w[assign[v]] += weights[v]
    mean = sum(w) / k
    total = sum((x - mean) ** 2 for x in w)
    for u, v in edges:
        if assign[u] != assign[v]:
            total += m[place[assign[u]]][place[assign[v]]]
    return total


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_matches_plain_python(data) -> None:
    n = data.draw(st.integers(1, 9))
    d = data.draw(st.integers(1, 4))
    k = data.draw(st.integers(1, min(n, d)))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = data.draw(st.lists(st.sampled_from(pairs), max_size=12)) if pairs else []
    weights = data.draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
    assign = data.draw(st.lists(st.integers(0, k - 1), min_size=n, max_size=n))
    place = data.draw(st.permutations(list(range(d))))[:k]
    m = np.array(data.draw(st.lists(st.lists(st.integers(0, 9), min_size=d, max_size=d),
                                    min_size=d, max_size=d)), dtype=float)
    np.fill_diagonal(m, 0.0)
    g = Graph.from_arrays(name="h", fwd_flops=[1.0] * n, src=[e[0] for e in edges],
                          dst=[e[1] for e in edges], weight=weights)
    t = build("flat", num_devices=d).replace(cost=m)
    got = sharding_cost(np.array(assign), np.array(place), g, t)
    assert math.isclose(got, _reference(n, edges, weights, assign, place, m.tolist()),
                        rel_tol=1e-12, abs_tol=1e-9)
