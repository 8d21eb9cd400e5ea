"""The LLM plan kind laid out from its degrees of parallelism (Megatron-LM's layout).

:func:`layout_plan` turns a :class:`~shardplan.ir.ParallelConfig` into a plan: its stages are
the ``pp * vp`` virtual stages in pipeline order, each holding whole transformer blocks (the
embedding with the first, the final norm, head and loss with the last:
:func:`shardplan.cost.stage_nodes`), virtual stage j on the devices of pipeline rank
``j mod pp`` in Megatron's rank order (:mod:`shardplan.ir.parallel`). How each block is split
over the tensor-parallel group follows from the module names (:func:`shardplan.cost.block_layout`),
so the model never knows how it is split. The plan's time is the simulator's
(:func:`shardplan.planner.llm_plan` fills the objective in); here it is left to the caller.
"""

from __future__ import annotations

import math
from typing import Any

from shardplan.cost._llm import block_layout, check_layout, stage_nodes
from shardplan.ir import ExecutionSettings, Graph, Objective, ParallelConfig, Plan, Stage, Topology

__all__ = ["OBJECTIVE", "layout_plan", "check_layout"]

OBJECTIVE = "iteration_seconds"


def layout_plan(graph: Graph, topology: Topology, parallel: ParallelConfig,
                settings: ExecutionSettings, *, algorithm: str = "llm",
                objective: Objective | None = None, search_seconds: float = 0.0) -> Plan:
    """The plan of ``parallel`` on ``graph`` and the first ``world_size`` devices of
    ``topology`` (module docstring). O(n + devices).

    The objective is ``objective`` when given, else ``iteration_seconds`` not yet known
    (``inf``, the value of a plan nobody priced): :func:`shardplan.planner.llm_plan` prices it.
    """
    check_layout(graph, topology, parallel, settings)
    layout = block_layout(graph)
    nodes = stage_nodes(layout, parallel)
    r = parallel.devices_per_rank
    stages = tuple(Stage(tuple(int(v) for v in nodes[j]),
                         tuple(range((j % parallel.pp) * r, (j % parallel.pp + 1) * r)))
                   for j in range(parallel.num_stages))
    if parallel.vp > 1:
        settings = _with(settings, schedule="interleaved-1f1b", virtual_stages=parallel.vp)
    return Plan(graph=graph.name, topology=topology.name, algorithm=algorithm,
                stages=stages,
                objective=objective or Objective(OBJECTIVE, math.inf),
                status="feasible", options={"parallel": parallel.label()},
                search_seconds=search_seconds, execution=settings, parallel=parallel)


def _with(settings: ExecutionSettings, **changes: Any) -> ExecutionSettings:
    from dataclasses import replace

    return replace(settings, **changes)
