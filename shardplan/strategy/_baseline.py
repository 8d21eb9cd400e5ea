"""Shared machinery of the baseline strategies: pick, for every node, the valid configuration
closest to a wanted split (see :func:`~shardplan.strategy._choice.closest`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Topology
from shardplan.registry import Result, take_options
from shardplan.strategy._choice import closest, devices_of, plan_from_choice
from shardplan.strategy.spaces import Space
from shardplan.strategy.tables import (
    build_tables,
    execution_of,
    graph_spaces,
    priced_settings,
    search_graph,
)

__all__ = ["DEFAULTS", "closest", "run_baseline"]

DEFAULTS: Mapping[str, Any] = {"devices": None, "cost_model": "pase", "cutoff": None,
                               "memory_limit": None, "execution": None,
                               "loss_on_shards": True}


def run_baseline(name: str, graph: Graph, topology: Topology, options: Mapping[str, Any],
                 seed: int, want: Callable[[Space, int], np.ndarray] | None = None,
                 record: Mapping[str, Any] | None = None,
                 candidates: Mapping[Any, Callable[[Space, int], np.ndarray]] | None = None,
                 ) -> Result:
    """Build the tables, take ``want(space, devices)`` per node, report its cost.

    With ``candidates`` (a key per wanted split), every one is costed and the cheapest kept;
    the plan's ``meta`` records which (``choice``) and every candidate's cost
    (``candidates``). The plan also records ``devices_used``, the most devices any node's
    configuration uses, and a ``note`` when that is fewer than asked (a batch that does not
    split that far under the cutoff). O(sum_v K_v d_v) per candidate after the tables.
    """
    t0 = time.perf_counter()
    opts = take_options(name, options, DEFAULTS)
    if graph.num_nodes == 0:
        raise ShardplanError("the graph has no nodes: there is no strategy to choose")
    devices = devices_of(topology, opts["devices"])
    settings = execution_of(opts["execution"])
    tables = build_tables(graph, devices, cost_model=opts["cost_model"],
                          topology=topology, cutoff=opts["cutoff"],
                          memory_limit=opts["memory_limit"], settings=settings,
                          loss_on_shards=bool(opts["loss_on_shards"]))
    assert tables is not None
    spaces = graph_spaces(search_graph(graph, opts["cost_model"], settings))
    options_of = candidates if candidates is not None else {None: want}
    costed = {}
    for key, fn in options_of.items():
        assert fn is not None
        choice = np.array([closest(tables.configs[v], fn(spaces[v], devices))
                           for v in range(graph.num_nodes)], dtype=np.int64)
        costed[key] = (tables.evaluate(choice), choice)
    key = min(costed, key=lambda k: (costed[k][0], k if isinstance(k, int) else 0))
    choice = costed[key][1]
    used = max(int(np.prod(tables.configs[v][choice[v]])) for v in range(graph.num_nodes))
    meta: dict[str, Any] = {"cost_model": tables.cost_model, "devices_used": used}
    if "sync_exposure" in tables.meta:  # what its objective priced (recomputable)
        meta["sync_exposure"] = tables.meta["sync_exposure"]
    if candidates is not None:
        meta["choice"] = key
        meta["candidates"] = {str(k): v for k, (v, _) in costed.items()}
    if used < devices:
        meta["note"] = (f"{name} uses {used} of the {devices} devices: no layer splits further "
                        f"(batch {graph.batch_size}, cutoff "
                        f"{tables.meta.get('cutoff', opts['cutoff'])})")
    plan = plan_from_choice(tables, choice, graph_name=graph.name,
                            topology_name=topology.name, algorithm=name, seed=seed,
                            options=options if record is None else record,
                            status="feasible",
                            seconds=time.perf_counter() - t0, num_nodes=graph.num_nodes,
                            meta=meta)
    if opts["cost_model"] == "default":  # the settings its objective prices
        plan = plan.with_settings(priced_settings(graph, settings))
    return Result(plan, {k: v for k, v in meta.items() if k != "cost_model"})
