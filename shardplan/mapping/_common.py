"""What both mapping algorithms share: reading ``options["plan"]``, building the problem
with the plan's execution settings, picking the model and writing the mapped plan."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from shardplan.errors import InfeasibleError, ShardplanError
from shardplan.ir import ExecutionSettings, Graph, Objective, Plan, Stage, Topology
from shardplan.ir.settings import LEGACY_SETTING_KEYS
from shardplan.mapping._stage_time import (
    MODELS,
    MappingProblem,
    build_problem,
    cost_settings,
    memory_note,
    objective_name,
)

__all__ = ["SETTING_KEYS", "mapped_plan", "prepare"]

#: Execution settings a mapping takes as options, overriding the plan's (``None``: keep).
SETTING_KEYS: dict[str, Any] = {**{k: None for k in ExecutionSettings.__dataclass_fields__},
                                **{k: None for k in LEGACY_SETTING_KEYS},
                                "global_batch": None}


def prepare(name: str, graph: Graph, topology: Topology, options: Mapping[str, Any], *,
            automorphisms: bool = False) -> tuple[Plan, MappingProblem, str]:
    """The plan to map (carrying the settings it will run with), its problem and the
    stage-time model (``auto`` resolved; ``options["contention"]``, default ``auto``, says
    whether transfers share links, ``problem.contention`` the resolved answer). Raises
    :class:`InfeasibleError` when some stage fits on fewer devices than it has replicas."""
    plan = options.get("plan")
    if not isinstance(plan, Plan):
        raise ShardplanError(f"{name} maps a plan: pass it as option 'plan' (a Plan)")
    model = options.get("model", "auto")
    if model not in (*MODELS, "auto"):
        raise ShardplanError(f"model must be one of {', '.join(MODELS)} or auto, got "
                             f"{model!r}")
    settings = cost_settings(plan, options).resolve(graph)
    plan = plan.with_settings(settings)
    problem = build_problem(plan, graph, topology, settings=settings, model=model,
                            automorphisms=automorphisms,
                            contention=options.get("contention", "auto"))
    note = memory_note(problem)
    if note is not None:
        raise InfeasibleError(f"{name}: no mapping fits in device memory: {note}")
    return plan, problem, problem.view


def mapped_plan(name: str, plan: Plan, graph: Graph, topology: Topology, devices: np.ndarray,
                model: str, value: float, lower_bound: float | None, status: str, seed: int,
                options: Mapping[str, Any], search_seconds: float,
                meta: Mapping[str, Any] | None = None, contention: bool = False) -> Plan:
    """``plan``'s stages on ``devices`` (shape (S, R)), with the mapping's objective and
    the plan's execution settings. Raises :class:`InfeasibleError` for an infinite value
    (a stage that cannot reach a neighbour or its ring).

    The recorded options leave out ``plan`` and record the resolved ``model`` and
    ``contention``; the objective's name says both (``max_stage_seconds_p2p_contention``)."""
    if not np.isfinite(value):
        what = "every mapping" if name == "optimal" else "the mapping"
        raise InfeasibleError(f"{name}: {what} of the plan's {plan.num_stages} stages x "
                              f"{plan.num_replicas} replicas sends data between devices that "
                              "cannot reach each other")
    recorded = {k: v for k, v in options.items() if k != "plan" and v is not None}
    recorded["model"] = model
    recorded["contention"] = bool(contention)
    stages = tuple(Stage(st.nodes, tuple(int(d) for d in devices[s]))
                   for s, st in enumerate(plan.stages))
    info = {"mapped_from": {"algorithm": plan.algorithm, "objective": plan.objective.to_dict()},
            **dict(meta or {})}
    return Plan(graph=graph.name, topology=topology.name, algorithm=name, stages=stages,
                objective=Objective(objective_name(model, contention), float(value),
                                          lower_bound),
                status=status, seed=int(seed), options=recorded,
                search_seconds=float(search_seconds), strategy=plan.strategy, meta=info,
                execution=plan.execution)
