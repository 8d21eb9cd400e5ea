"""The contract every registered algorithm keeps, checked over all of them on the same inputs.

For each partitioner and mapper of the registry: the plan is valid for its graph and
topology, pipeline plans have convex stages and an acyclic stage graph, the reported objective
equals an independent evaluation by ``shardplan.objectives.evaluate`` (what ``shardplan
cost`` prints), the lower bound is at most the value, the status is one of the three, and the
same seed gives the same plan. New algorithms are picked up without touching this file.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from shardplan import registry
from shardplan.generate import layered
from shardplan.ir import Graph, Plan, Topology
from shardplan.objectives import evaluate
from shardplan.topology import build

# The cost objective that recomputes each recorded objective name.
_OBJECTIVE_OF = {"sharding_cost": "sharding", "pase_cost": "strategy",
                "pase_seconds": "strategy", "iteration_seconds": "strategy",
                "pipedream_seconds": "pipedream"}
# Objectives of pipeline plans (stages in pipeline order: convex, acyclic stage graph).
_PIPELINE = ("max_stage_seconds", "pipedream_seconds")


def _objective_for(name: str) -> str:
    if name.startswith("max_stage_seconds"):
        return "max-stage"
    return _OBJECTIVE_OF[name]


def _graph() -> Graph:
    return layered(num_nodes=13, width=3, seed=3)


def _topology() -> Topology:
    # Two boxes of two devices: levels for the hierarchical partitioner, unequal links for
    # the mappers.
    return build("hierarchical", shape=(2, 2), level_names=("box", "device"),
                 bandwidth=(1e10, 1e11), latency=(1e-5, 1e-6))


def _check_plan(plan: Plan, graph: Graph, topology: Topology) -> None:
    plan.validate(graph, topology)
    assert plan.status in ("optimal", "feasible", "timed_out")
    assert sorted(v for st in plan.stages for v in st.nodes) == list(range(graph.num_nodes))
    if plan.objective.name.startswith(_PIPELINE):
        a = plan.assignment(graph.num_nodes)
        assert graph.is_acyclic_partition(a)
        assert np.all(a[graph.src] <= a[graph.dst])  # stages listed in pipeline order
        for st in plan.stages:
            assert graph.is_convex(list(st.nodes))
    name, value, _ = evaluate(plan, graph, topology, _objective_for(plan.objective.name))
    assert name == plan.objective.name
    assert math.isclose(value, plan.objective.value, rel_tol=1e-9, abs_tol=1e-12)
    if plan.objective.lower_bound is not None:
        assert plan.objective.lower_bound <= plan.objective.value * (1 + 1e-9)


def _same(p: Plan, q: Plan) -> bool:
    return [(st.nodes, st.devices) for st in p.stages] == \
        [(st.nodes, st.devices) for st in q.stages]


@pytest.mark.parametrize("name", registry.available("partition"))
def test_partitioner_contract(name: str) -> None:
    graph, topology = _graph(), _topology()
    res = registry.run("partition", name, graph, topology, seed=1, time_limit=20)
    _check_plan(res.plan, graph, topology)
    assert res.plan.algorithm == name and res.plan.seed == 1
    again = registry.run("partition", name, graph, topology, seed=1, time_limit=20)
    assert _same(res.plan, again.plan)


@pytest.mark.parametrize("name", registry.available("map"))
def test_mapper_contract(name: str) -> None:
    graph, topology = _graph(), _topology()
    base = registry.run("partition", "uniform", graph, topology, stages=2, replicas=2).plan
    res = registry.run("map", name, graph, topology, seed=1, time_limit=20, plan=base)
    _check_plan(res.plan, graph, topology)
    assert "plan" not in res.plan.options
    assert [st.nodes for st in res.plan.stages] == [st.nodes for st in base.stages]
    used = [d for st in res.plan.stages for d in st.devices]
    assert len(used) == len(set(used)) == topology.num_devices
    again = registry.run("map", name, graph, topology, seed=1, time_limit=20, plan=base)
    assert _same(res.plan, again.plan)


@pytest.mark.parametrize("cost_model", ["pase", "default"])
@pytest.mark.parametrize("name", registry.available("strategy"))
def test_strategy_contract(name: str, cost_model: str) -> None:
    from shardplan.generate import generate

    graph, topology = generate("alexnet", batch_size=32), _topology()
    res = registry.run("strategy", name, graph, topology, seed=1, cost_model=cost_model)
    _check_plan(res.plan, graph, topology)
    assert res.plan.strategy is not None and len(res.plan.strategy) == graph.num_nodes
    for v, factors in res.plan.strategy.items():
        assert int(np.prod(factors)) <= topology.num_devices, v
    again = registry.run("strategy", name, graph, topology, seed=1, cost_model=cost_model)
    assert again.plan.strategy == res.plan.strategy


def test_every_family_has_algorithms() -> None:
    for family in registry.FAMILIES:
        assert registry.available(family), family


def _family_inputs(family: str) -> tuple[Graph, dict]:
    """A graph and the options every algorithm of ``family`` needs, on ``_topology()``."""
    if family == "strategy":
        from shardplan.generate import generate

        return generate("alexnet", batch_size=32), {}
    graph = _graph()
    if family == "map":
        base = registry.run("partition", "uniform", graph, _topology(), stages=2,
                            replicas=1).plan
        return graph, {"plan": base}
    return graph, {}


def _with_bandwidth(topology: Topology, zero: list[tuple[int, int]]) -> Topology:
    bw = topology.bandwidth.copy()
    for i, j in zero:
        bw[i, j] = bw[j, i] = 0.0
    return topology.replace(bandwidth=bw)


_ALL = [(f, n) for f in registry.FAMILIES for n in registry.available(f)]


@pytest.mark.parametrize("family,name", _ALL)
def test_disconnected_topology_is_planned_on_its_largest_part(family: str, name: str) -> None:
    import warnings

    from shardplan.errors import ShardplanError, ShardplanWarning

    graph, options = _family_inputs(family)
    # The two boxes {0, 1} and {2, 3} cannot reach each other: two parts of two devices, the
    # one with the lowest ids is used.
    topology = _with_bandwidth(_topology(), [(0, 2), (0, 3), (1, 2), (1, 3)])
    assert [p.tolist() for p in topology.connected_parts()] == [[0, 1], [2, 3]]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            res = registry.run(family, name, graph, topology, seed=1, time_limit=20,
                               **options)
        except ShardplanError as exc:  # refused: says which part it planned on
            assert "cannot reach each other" in str(exc) and "devices 0-1" in str(exc)
            return
    assert any(issubclass(w.category, ShardplanWarning) and "devices 0-1" in str(w.message)
               for w in caught)
    assert {d for st in res.plan.stages for d in st.devices} <= {0, 1}
    assert res.stats["planned_on_devices"] == [0, 1]
    assert res.stats["unreachable_devices"] == [2, 3]
    _check_plan(res.plan, graph, topology)


@pytest.mark.parametrize("family,name", _ALL)
@pytest.mark.filterwarnings("ignore::shardplan.errors.ShardplanWarning")
def test_no_plan_sends_data_between_unreachable_devices(family: str, name: str) -> None:
    from shardplan.errors import ShardplanError

    graph, options = _family_inputs(family)
    # Devices 0 and 1 cannot reach each other (one part: both reach 2 and 3), then no two
    # devices can (four parts of one device).
    for zero in ([(0, 1)], [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]):
        topology = _with_bandwidth(_topology(), zero)
        try:
            res = registry.run(family, name, graph, topology, seed=1, time_limit=20,
                               **options)
        except ShardplanError as exc:  # refused, saying why
            assert "cannot reach" in str(exc), exc
            continue
        bw = topology.bandwidth
        stages = res.plan.stages
        a = res.plan.assignment(graph.num_nodes)
        for u, v in zip(a[graph.src].tolist(), a[graph.dst].tolist(), strict=True):
            for x, y in zip(stages[u].devices, stages[v].devices, strict=False):
                assert x == y or (bw[x, y] > 0 and bw[y, x] > 0), (u, v, x, y)
        for st in stages:
            ring = list(st.devices)
            for x, y in zip(ring, ring[1:] + ring[:1], strict=True):
                assert x == y or bw[x, y] > 0
        if len(zero) > 1:
            assert len({d for st in stages for d in st.devices}) == 1
