"""PaSE's lower bound (every node's and edge's cheapest cost) pinned on hand-made tables,
and what a search cut short records: at least that bound."""

from __future__ import annotations

import numpy as np
import pytest

from shardplan import registry
from shardplan.generate import transformer
from shardplan.strategy import Tables, build_tables
from shardplan.strategy._dp import lower_bound
from shardplan.strategy.pase import solve_tables
from shardplan.topology import flat


def _tables() -> Tables:
    node = (np.array([1.0, 0.5]), np.array([2.0, 3.0]), np.array([4.0, 1.5]))
    edges = ((0, 1, np.array([[0.25, 9.0], [1.0, 2.0]])),
             (1, 2, np.array([[5.0, 3.0], [0.75, 8.0]])))
    return Tables(graph="g", devices=2, cost_model="test", objective="pase_cost",
                  names=("a", "b", "c"), dims=(("x",),) * 3,
                  configs=(np.array([[1], [2]]),) * 3, node_cost=node, edges=edges)


def test_lower_bound_by_hand() -> None:
    t = _tables()
    # Nodes 0.5 + 2 + 1.5, edges 0.25 + 0.75.
    assert lower_bound(t) == 5.0
    best = min(t.evaluate((a, b, c)) for a in (0, 1) for b in (0, 1) for c in (0, 1))
    assert best == 7.75  # (0, 0, 1): 1 + 2 + 1.5 + 0.25 + 3
    res = solve_tables(t)
    assert res.plan.status == "optimal"
    assert res.plan.objective.value == res.plan.objective.lower_bound == 7.75


def test_a_search_cut_short_records_the_table_bound() -> None:
    t = _tables()
    res = solve_tables(t, time_limit=0.0, t0=0.0)  # long expired
    plan = res.plan
    assert plan.status == "timed_out"
    assert plan.objective.lower_bound == 5.0  # the bound, below the greedy incumbent
    assert plan.objective.value >= 7.75


def test_a_real_search_cut_short_keeps_the_table_bound() -> None:
    # Tables built, the DP cut short: the bound recorded is the table bound (or the value,
    # if the incumbent happens to be cheaper), never less.
    g = transformer(num_layers=2)
    tables = build_tables(g, 64)
    plan = solve_tables(tables, time_limit=0.0, t0=0.0).plan
    assert plan.status == "timed_out"
    trivial = lower_bound(tables)
    assert 0 < trivial < plan.objective.value
    assert plan.objective.lower_bound == pytest.approx(trivial, rel=1e-12)
    exact = solve_tables(tables).plan
    assert trivial <= exact.objective.value <= plan.objective.value


def test_out_of_time_before_the_tables_records_no_bound() -> None:
    # Cut short before the tables exist, PaSE returns data parallelism with no bound
    # (None: unknown), as documented.
    res = registry.run("strategy", "pase", transformer(num_layers=2), flat(64),
                       time_limit=1e-9)
    assert res.plan.status == "timed_out" and res.stats == {"tables": "not built"}
    assert res.plan.objective.lower_bound is None


def test_a_node_without_a_finite_configuration_is_named() -> None:
    from shardplan.errors import ShardplanError
    from shardplan.strategy._dp import check_finite

    t = _tables()
    bad = Tables(graph=t.graph, devices=t.devices, cost_model=t.cost_model,
                 objective=t.objective, names=t.names, dims=t.dims, configs=t.configs,
                 node_cost=(t.node_cost[0], np.array([np.inf, np.inf]), t.node_cost[2]),
                 edges=t.edges)
    check_finite(t)  # every node has a finite configuration: no error
    with pytest.raises(ShardplanError) as err:
        check_finite(bad)
    assert str(err.value) == ("every configuration of node 1 ('b') has an infinite cost "
                              "(ruled out, e.g. by the memory limit): no strategy exists")
