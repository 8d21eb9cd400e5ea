"""Hybrid plans (issue #16.2): a pipeline plan whose stages carry per-stage strategy searches."""

from __future__ import annotations

import numpy as np
import pytest

from shardplan import registry
from shardplan.errors import ShardplanError
from shardplan.generate import generate
from shardplan.ir import Objective, Plan, Stage
from shardplan.strategy import hybrid_plan
from shardplan.strategy.hybrid import stage_subgraph, sub_topology
from shardplan.topology import build, flat


def _pipeline(graph, stages: int, devices: int) -> Plan:
    order = [int(v) for v in graph.topological_order]
    n = len(order)
    cuts = [order[s * n // stages:(s + 1) * n // stages] for s in range(stages)]
    return Plan(graph=graph.name, topology="", algorithm="contiguous",
                stages=tuple(Stage(tuple(sorted(c)), tuple(range(s * devices, (s + 1) * devices)))
                             for s, c in enumerate(cuts)),
                objective=Objective("max_stage_seconds", 1.0), status="optimal")


def test_stage_subgraph_renumbers_and_drops_outside_inputs() -> None:
    g = generate("alexnet")
    nodes = list(range(3, 9))
    sub, ids = stage_subgraph(g, nodes)
    assert ids == nodes and sub.num_nodes == 6
    assert sub.names == tuple(g.names[v] for v in nodes)
    for s, d in zip(sub.src.tolist(), sub.dst.tolist(), strict=True):
        assert (ids[s], ids[d]) in set(zip(g.src.tolist(), g.dst.tolist(), strict=True))
    for i, v in enumerate(ids):
        inputs = sub.spaces[i]["inputs"]
        assert {ids[int(p)] for p in inputs} == {int(p) for p in g.spaces[v]["inputs"]
                                                 if int(p) in nodes}


def test_each_stage_gets_its_own_search() -> None:
    """The strategy of every stage is what PaSE finds on the stage alone, over the stage's
    device count; the pipeline itself is unchanged."""
    g = generate("alexnet")
    base = _pipeline(g, 2, 4)
    plan = hybrid_plan(base, g, algorithm="pase")
    assert [st.nodes for st in plan.stages] == [st.nodes for st in base.stages]
    assert [st.devices for st in plan.stages] == [st.devices for st in base.stages]
    assert plan.objective == base.objective
    assert set(plan.strategy) == {str(v) for v in range(g.num_nodes)}
    for s, st in enumerate(base.stages):
        sub, ids = stage_subgraph(g, st.nodes)
        alone = registry.run("strategy", "pase", sub, flat(4), devices=4).plan
        for i, v in enumerate(ids):
            assert plan.strategy[str(v)] == alone.strategy[str(i)]
            assert int(np.prod(plan.strategy[str(v)])) <= len(st.devices)
        entry = plan.meta["hybrid"]["stages"][s]
        assert entry["value"] == pytest.approx(alone.objective.value)
        assert entry["status"] == "optimal"
    again = Plan.from_dict(plan.to_dict())  # a plan file like any other
    assert again.strategy == plan.strategy and again.meta["hybrid"]["strategy"] == "pase"


def test_baselines_and_cost_model_options() -> None:
    g = generate("alexnet")
    base = _pipeline(g, 2, 2)
    dp = hybrid_plan(base, g, algorithm="data-parallel")
    assert all(len(v) for v in dp.strategy.values())
    topo = build("dgx1")
    mapped = hybrid_plan(base, g, topo, algorithm="pase", options={"cost_model": "default"})
    assert mapped.meta["hybrid"]["stages"][0]["objective"] == "iteration_seconds"
    sub = sub_topology(topo, [2, 3])
    assert sub.num_devices == 2 and sub.bandwidth[0, 1] == topo.bandwidth[2, 3]


def test_refusals() -> None:
    g = generate("alexnet")
    base = _pipeline(g, 2, 2)
    plan = hybrid_plan(base, g)
    with pytest.raises(ShardplanError, match="already carries a strategy"):
        hybrid_plan(plan, g)
    with pytest.raises(ShardplanError, match="device counts are its stages'"):
        hybrid_plan(base, g, options={"devices": 2})


def test_interleaved_schedule_of_a_hybrid_simulates() -> None:
    """Interleaved 1F1B runs two stages per rank: the device groups of the stages it moves
    are idle, and the simulator must say so rather than fail (it raised KeyError)."""
    from shardplan.ir import ExecutionSettings
    from shardplan.simulate import simulate

    g = generate("alexnet")
    plan = hybrid_plan(_pipeline(g, 4, 2), g, flat(8))
    settings, _ = ExecutionSettings().override(schedule="interleaved-1f1b", microbatches=4)
    res = simulate(plan.with_settings(settings), g, flat(8), timeline=False)
    gpipe = simulate(plan, g, flat(8), timeline=False)
    assert res.iteration_seconds > 0 and gpipe.iteration_seconds > 0
    assert len(res.peak_memory_bytes) < 8 == len(gpipe.peak_memory_bytes)
