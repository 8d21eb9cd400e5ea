"""The ``max-stage`` objective: the largest stage time of a pipeline plan.

Which formula depends on the plan's recorded objective name:

- ``max_stage_seconds`` (a partition, Parmesan section 4, equations 1-3): issue #4 fills this
  in :func:`partition_max_stage` (the cost model's :meth:`CostModel.stage_seconds`, infinite
  when a stage does not fit in memory);
- ``max_stage_seconds_p2p`` / ``max_stage_seconds_allreduce`` (a mapping, Parmesan section 5,
  equations 6-7): :mod:`shardplan.cost._mapping` (issue #5).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardplan.cost.objectives import Evaluation, objective
from shardplan.errors import NotImplementedYetError, ShardplanError
from shardplan.ir import Graph, Plan, Topology

MAPPING_OBJECTIVES = ("max_stage_seconds_p2p", "max_stage_seconds_allreduce")


def partition_max_stage(plan: Plan, graph: Graph, topology: Topology,
                        options: Mapping[str, Any]) -> Evaluation:
    raise NotImplementedYetError("max_stage_seconds of a partition: issue #4")


@objective("max-stage")
def max_stage(plan: Plan, graph: Graph, topology: Topology, *, model: str | None = None,
              **options: Any) -> Evaluation:
    """Evaluate the plan's max-stage objective; ``model`` (``p2p``/``allreduce``) forces the
    mapping formulas of section 5 whatever the plan recorded."""
    name = plan.objective.name
    if model is not None:
        if model not in ("p2p", "allreduce"):
            raise ShardplanError(f"model must be p2p or allreduce, got {model!r}")
        name = f"max_stage_seconds_{model}"
    if name in MAPPING_OBJECTIVES:
        from shardplan.cost._mapping import mapped_max_stage

        return mapped_max_stage(plan, graph, topology, name.rsplit("_", 1)[1], options)
    return partition_max_stage(plan, graph, topology, options)
