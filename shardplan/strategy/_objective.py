"""The ``strategy`` objective: the PaSE cost of a plan's per-layer configurations.

Rebuilds the cost tables (:func:`shardplan.strategy.build_tables`) with the devices, cost
model, cutoff and memory limit the plan recorded, and sums the node and edge costs of the
configurations its ``strategy`` field names (paper 004, equation 1). Objective names
``pase_cost`` (the ``pase`` cost model, FLOP-equivalents) or ``iteration_seconds``
(``default``: the simulator's price under the plan's execution settings).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Plan, Topology
from shardplan.objectives import Evaluation, objective


@objective("strategy")
def strategy_cost(plan: Plan, graph: Graph, topology: Topology, **options: Any) -> Evaluation:
    """PaSE cost of ``plan.strategy`` under the plan's recorded cost-model options, which
    ``options`` override (``devices``, ``cost_model``, ``cutoff``, ``memory_limit``).
    O(sum of table sizes)."""
    from shardplan.strategy import build_tables

    if plan.strategy is None:
        raise ShardplanError("the plan has no 'strategy' (make it with 'shardplan strategy')")
    rec = {k: plan.options.get(k) for k in ("devices", "cost_model", "cutoff", "memory_limit")}
    unknown = sorted(set(options) - set(rec))
    if unknown:
        raise ShardplanError(f"the strategy objective does not take option {unknown[0]!r}")
    rec.update(options)
    devices = rec["devices"] if rec["devices"] is not None else \
        len(plan.stages[0].devices) if plan.stages else topology.num_devices
    tables = build_tables(graph, int(devices), cost_model=rec["cost_model"] or
                          str(plan.meta.get("cost_model", "pase")), topology=topology,
                          cutoff=rec["cutoff"], memory_limit=rec["memory_limit"],
                          settings=plan.settings,
                          exposed=plan.meta.get("sync_exposure"))
    assert tables is not None  # None only when a ``check`` stops the build; none is given
    missing = [v for v in range(graph.num_nodes) if str(v) not in plan.strategy]
    if missing:
        raise ShardplanError(f"the plan's strategy has no configuration for node {missing[0]}")
    choice = np.array([tables.index_of(v, plan.strategy[str(v)])
                       for v in range(graph.num_nodes)], dtype=np.int64)
    return tables.objective, tables.evaluate(choice), {"devices": int(devices),
                                                        "cost_model": tables.cost_model}
