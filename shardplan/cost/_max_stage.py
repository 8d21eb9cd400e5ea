"""The ``max-stage`` objective: the largest stage time of a pipeline plan, under a view.

A plan records which view of the one stage-time model its objective used
(:data:`~shardplan.cost._pipeline.OBJECTIVE_NAMES`): ``max_stage_seconds`` (Parmesan's
equation 3, what partitions recorded before the execution settings existed),
``max_stage_seconds_p2p`` / ``max_stage_seconds_allreduce`` (equations 6 and 7, mappings) or
``max_stage_seconds_overlap`` (the simulator-consistent view), each ending in
``_contention`` when it was priced with link contention (a mapping's default on topologies
with physical links). ``shardplan cost --objective max-stage`` evaluates that view from the
three files with the plan's execution settings (overridden by ``--option KEY=VALUE``;
``--option contention=false|true`` overrides the contention term), so it reproduces what the
planner recorded.
"""

from __future__ import annotations

import math
from typing import Any

from shardplan.cost._model import CostModel
from shardplan.cost._pipeline import (
    VIEWS,
    StageTimes,
    contention_of_objective,
    objective_name,
    stage_times,
    view_of_objective,
)
from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, Plan, Topology
from shardplan.objectives import Evaluation, objective

__all__ = ["plan_contention", "plan_stage_times", "plan_view"]


def plan_stage_times(plan: Plan, graph: Graph, topology: Topology,
                     settings: ExecutionSettings | None = None, *,
                     contention: bool = False) -> StageTimes:
    """The :class:`StageTimes` of ``plan`` as placed, under ``settings`` (default: the
    plan's own), with link contention if asked. Stages run in pipeline order
    (:func:`~shardplan.cost._pipeline.pipeline_positions`). O(n + m log m + S^2 + messages)."""
    settings = plan.settings if settings is None else settings
    model = CostModel.from_settings(graph, topology, settings)
    a = plan.assignment(graph.num_nodes)
    return stage_times(model, a, [st.devices for st in plan.stages],
                       num_stages=plan.num_stages, contention=contention)


def plan_view(plan: Plan) -> str:
    """The view a plan's recorded objective used: ``eq3`` for an unnamed legacy one, and
    ``overlap`` (the simulator's) for a plan that optimised something else (a sharding
    cost, PipeDream's own value, a PaSE strategy)."""
    name = plan.objective.name
    if name in ("", "max_stage_seconds"):
        return "eq3"
    try:
        return view_of_objective(name)
    except ShardplanError:
        return "overlap"


def plan_contention(plan: Plan) -> bool:
    """Whether a plan's recorded objective was priced with link contention."""
    return contention_of_objective(plan.objective.name)


@objective("max-stage")
def max_stage(plan: Plan, graph: Graph, topology: Topology, *, model: str | None = None,
              contention: bool | None = None, **options: Any) -> Evaluation:
    """Evaluate the plan's max-stage objective: the view it recorded, or ``model`` (one of
    :data:`VIEWS`) to force another, with link contention as recorded or as ``contention``
    says; ``options`` override the plan's execution settings. A stage that does not fit in
    memory makes the value infinite. O(n + m log m + S^2 R)."""
    view = plan_view(plan) if model is None else model
    if view not in VIEWS:
        raise ShardplanError(f"model must be one of {', '.join(VIEWS)}, got {view!r}")
    if contention is None:
        contention = plan_contention(plan)
    if not isinstance(contention, bool):
        raise ShardplanError(f"contention must be true or false, got {contention!r}")
    contention = contention and bool(topology.links)
    settings, _ = plan.settings.override(**options)
    st = plan_stage_times(plan, graph, topology, settings, contention=contention)
    seconds = st.stage_seconds(view)
    value = float(seconds.max()) if seconds.size else 0.0
    details = {
        "view": view,
        "stage_seconds": [None if not math.isfinite(x) else float(x) for x in seconds],
        "replica_seconds": [[float(x) for x in row[:r]] for row, r in
                            zip(st.replica_seconds(view), st.replicas, strict=True)],
        "stage_memory_bytes": [float(x) for x in st.memory],
        "fits_memory": [bool(x) for x in st.fits],
        "allreduce_seconds": [float(x) for x in st.allreduce],
        "settings": settings.to_dict(),
        "contention": contention,
    }
    return objective_name(view, contention), value, details
