"""What both mapping algorithms share: reading ``options["plan"]``, building the problem,
picking the model and writing the mapped plan."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Objective, Plan, Stage, Topology
from shardplan.mapping._stage_time import (
    COST_OPTIONS,
    MODELS,
    MappingProblem,
    build_problem,
    choose_model,
    objective_name,
)

__all__ = ["mapped_plan", "prepare"]


def prepare(name: str, graph: Graph, topology: Topology, options: Mapping[str, Any], *,
            automorphisms: bool = False) -> tuple[Plan, MappingProblem, str]:
    """The plan to map, its problem and the stage-time model (``auto`` resolved)."""
    plan = options.get("plan")
    if not isinstance(plan, Plan):
        raise ShardplanError(f"{name} maps a plan: pass it as option 'plan' (a Plan)")
    model = options.get("model", "auto")
    if model not in (*MODELS, "auto"):
        raise ShardplanError(f"model must be p2p, allreduce or auto, got {model!r}")
    cost = {k: options.get(k, v) for k, v in COST_OPTIONS.items()}
    problem = build_problem(plan, graph, topology, automorphisms=automorphisms, **cost)
    if model == "auto":
        model = choose_model(problem)
    return plan, problem, model


def mapped_plan(name: str, plan: Plan, graph: Graph, topology: Topology, devices: np.ndarray,
                model: str, value: float, lower_bound: float | None, status: str, seed: int,
                options: Mapping[str, Any], search_seconds: float) -> Plan:
    """``plan``'s stages on ``devices`` (shape (S, R)), with the mapping's objective.

    The recorded options leave out ``plan`` and record the resolved ``model``."""
    recorded = {k: v for k, v in options.items() if k != "plan"}
    recorded["model"] = model
    stages = tuple(Stage(st.nodes, tuple(int(d) for d in devices[s]))
                   for s, st in enumerate(plan.stages))
    meta = {"mapped_from": {"algorithm": plan.algorithm, "objective": plan.objective.to_dict()}}
    return Plan(graph=graph.name, topology=topology.name, algorithm=name, stages=stages,
                objective=Objective(objective_name(model), float(value), lower_bound),
                status=status, seed=int(seed), options=recorded,
                search_seconds=float(search_seconds), strategy=plan.strategy, meta=meta)
