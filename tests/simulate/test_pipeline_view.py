"""The pipeline view of a plan whose stage ids are not in pipeline order."""

from __future__ import annotations

import dataclasses

import numpy as np

from shardplan import registry
from shardplan.ir import Graph
from shardplan.simulate import PipelineView
from shardplan.topology import build


def test_positions_follow_the_data_not_the_stage_ids() -> None:
    g = Graph.from_arrays(name="chain", fwd_flops=np.ones(6), src=range(5), dst=range(1, 6))
    topo = build("flat", num_devices=3)
    plan = registry.run("partition", "uniform", g, topo, stages=3).plan
    assert [s.nodes for s in plan.stages] == [(0, 1), (2, 3), (4, 5)]
    # Stage ids 0, 1, 2 now hold the last, first and middle runs.
    stages = (plan.stages[2], plan.stages[0], plan.stages[1])
    view = PipelineView.build(dataclasses.replace(plan, stages=stages), g)
    assert view.order == (1, 2, 0)
    assert [view.position_of(s) for s in range(3)] == [2, 0, 1]
    assert view.stage_devices(0) == stages[1].devices
    assert view.adjacency.tolist() == [[False, True, False], [False, False, True],
                                       [False, False, False]]


def test_an_empty_last_stage_keeps_its_position() -> None:
    # A valid plan may leave a stage without nodes; the view still has every stage (the
    # stage count comes from the plan, not from the largest stage id holding a node).
    from shardplan.ir import Stage

    g = Graph.from_arrays(name="chain", fwd_flops=np.ones(4), src=range(3), dst=range(1, 4))
    topo = build("flat", num_devices=3)
    plan = registry.run("partition", "uniform", g, topo, stages=2).plan
    plan = dataclasses.replace(plan, stages=(*plan.stages, Stage((), (2,))))
    plan.validate(g, topo)
    view = PipelineView.build(plan, g)
    assert view.order == (0, 1, 2) and view.num_stages == 3
    assert view.stage_devices(2) == (2,)
