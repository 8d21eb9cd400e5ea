"""The hierarchical partitioner (paper 000, 2.5)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardplan import registry
from shardplan.errors import ShardplanError
from shardplan.generate import layered
from shardplan.ir import Graph, Level
from shardplan.objectives import evaluate
from shardplan.partition.hierarchical import hierarchy_groups
from shardplan.topology import build


def _hier(shape, latency):
    names = ("region", "box", "gpu")[-len(shape):]
    t = build("hierarchical", shape=shape, level_names=names, latency=latency,
              bandwidth=(1e10,) * len(shape))
    return t.replace(cost=t.latency * 1e6)


def test_hierarchy_groups() -> None:
    t = _hier((2, 3, 2), (1e-3, 5e-6, 2e-6))
    levels = hierarchy_groups(t)
    assert [len(lv) for lv in levels] == [2, 6, 12]
    assert levels[0][0] == tuple(range(6)) and levels[-1][5] == (5,)
    # No levels: the devices alone.
    assert hierarchy_groups(build("flat", num_devices=3)) == [[(0,), (1,), (2,)]]


def test_chain_on_two_boxes_reaches_the_optimum() -> None:
    # 8 equal nodes in a chain on 2 boxes x 2 GPUs (M: 10 across boxes, 1 inside): the best
    # is four runs of two, the middle cut across boxes: 1 + 10 + 1 = 12.
    g = Graph.from_arrays(name="chain", fwd_flops=np.ones(8), src=range(7), dst=range(1, 8),
                          weight=np.ones(8))
    t = _hier((2, 2), (1e-5, 1e-6))
    res = registry.run("partition", "hierarchical", g, t, seed=0, refine=False)
    exact = registry.run("partition", "brute-force", g, t).plan.objective.value
    assert exact == 12.0
    assert res.plan.objective.value == 12.0
    boxes = [{s.devices[0] // 2 for s in res.plan.stages if v in s.nodes}.pop() for v in
             range(8)]
    assert boxes in ([0] * 4 + [1] * 4, [1] * 4 + [0] * 4)


def test_refine_only_lowers_the_cost_and_same_seed_same_plan() -> None:
    g, t = layered(150, width=15, seed=3), _hier((2, 3, 4), (1e-3, 5e-6, 2e-6))
    a = registry.run("partition", "hierarchical", g, t, seed=2)
    b = registry.run("partition", "hierarchical", g, t, seed=2)
    assert [s.nodes for s in a.plan.stages] == [s.nodes for s in b.plan.stages]
    assert a.plan.objective.value <= a.stats["before_refine"] + 1e-9
    assert a.stats["hierarchy"] == [2, 6, 24]
    # Every device holds at least one node.
    assert len(a.plan.stages) == 24 and all(s.nodes for s in a.plan.stages)


def test_the_outer_level_sees_few_cut_edges() -> None:
    # A very expensive region boundary: the hierarchical split crosses it on few of the
    # graph's ~250 edges (about two layer boundaries of width 6).
    g = layered(120, width=6, seed=1)
    t = _hier((2, 2, 2), (1e-2, 2e-6, 1e-6))  # 10000 across regions
    plan = registry.run("partition", "hierarchical", g, t, seed=0).plan
    assert g.num_edges > 200
    region = np.empty(g.num_nodes, dtype=np.int64)
    for s in plan.stages:
        region[list(s.nodes)] = s.devices[0] // 4
    crossing = int(np.sum(region[g.src] != region[g.dst]))
    assert crossing <= 12


@st.composite
def instances(draw):
    n = draw(st.integers(4, 10))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = sorted(set(draw(st.lists(st.sampled_from(pairs), max_size=16))))
    weights = draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))
    d = draw(st.sampled_from([2, 3, 4]))
    m = np.array(draw(st.lists(st.sampled_from([0.5, 1.0, 4.0]), min_size=d * d,
                               max_size=d * d))).reshape(d, d)
    np.fill_diagonal(m, 0.0)
    groups = {2: ((0,), (1,)), 3: ((0, 1), (2,)), 4: ((0, 1), (2, 3))}[d]
    t = build("flat", num_devices=d).replace(cost=m, levels=(Level("box", groups),))
    g = Graph.from_arrays(name="h", fwd_flops=np.ones(n), src=[e[0] for e in edges],
                          dst=[e[1] for e in edges], weight=weights)
    return g, t, draw(st.sampled_from(["random", "topo", "metis"])), draw(st.booleans())


@settings(max_examples=40, deadline=None)
@given(instances())
def test_plans_valid_and_objective_recomputes(inst) -> None:
    g, t, start, refine = inst
    res = registry.run("partition", "hierarchical", g, t, start=start, refine=refine,
                       restarts=2)
    plan = res.plan
    plan.validate(g, t)
    assert sorted(s.devices[0] for s in plan.stages) == list(range(t.num_devices))
    assert all(len(s.nodes) >= 1 for s in plan.stages)
    name, value, _ = evaluate(plan, g, t, "sharding")
    assert name == plan.objective.name
    assert math.isclose(value, plan.objective.value, rel_tol=1e-9, abs_tol=1e-9)
    exact = registry.run("partition", "brute-force", g, t).plan.objective.value
    assert plan.objective.value >= exact - 1e-9


def test_bad_options() -> None:
    g, t = layered(20, width=4, seed=0), _hier((2, 2), (1e-5, 1e-6))
    with pytest.raises(ShardplanError, match="every device"):
        registry.run("partition", "hierarchical", g, t, stages=2)
    with pytest.raises(ShardplanError, match="refine"):
        registry.run("partition", "hierarchical", g, t, refine="yes")
    with pytest.raises(ShardplanError, match="does not take"):
        registry.run("partition", "hierarchical", g, t, workers=2)
