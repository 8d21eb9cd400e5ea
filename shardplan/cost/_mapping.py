"""The max-stage objective of a mapped plan: Parmesan equations 6 (p2p) and 7 (all-reduce).

Called by :mod:`shardplan.cost._max_stage` for plans whose objective is
``max_stage_seconds_p2p`` / ``max_stage_seconds_allreduce`` (or with ``shardplan cost
--model``). The formulas live in :mod:`shardplan.mapping._stage_time`, which the mapping
search uses too, so a plan's recorded value and ``shardplan cost`` agree by construction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Plan, Topology
from shardplan.objectives import Evaluation

__all__ = ["mapped_max_stage"]


def mapped_max_stage(plan: Plan, graph: Graph, topology: Topology, model: str,
                     options: Mapping[str, Any]) -> Evaluation:
    """``(name, value, details)``: the largest stage time of ``plan`` under ``model``.

    Cost-model options (``efficiency``, ``recompute``, ``profile_flops``) come from
    ``options``, else from the plan's recorded options, else their defaults, so that the
    three files alone reproduce the recorded value. ``details`` holds ``stage_seconds`` (the
    slowest replica of every stage), ``replica_seconds`` (S x R) and ``model``.
    O(n + m + S^2 R).
    """
    from shardplan.mapping._stage_time import (
        COST_OPTIONS,
        build_problem,
        objective_name,
        stage_times,
    )

    unknown = sorted(set(options) - set(COST_OPTIONS))
    if unknown:
        raise ShardplanError(f"max-stage of a mapping does not take option {unknown[0]!r} "
                             f"(it takes: {', '.join(sorted(COST_OPTIONS))})")
    cost = {k: options.get(k, plan.options.get(k, v)) for k, v in COST_OPTIONS.items()}
    problem = build_problem(plan, graph, topology, **cost)
    dev = np.array([list(st.devices) for st in plan.stages], dtype=np.int64)
    times = stage_times(problem, dev, model)
    details = {"model": model, "stage_seconds": times.max(axis=1).tolist(),
               "replica_seconds": times.tolist()}
    return objective_name(model), float(times.max()), details
