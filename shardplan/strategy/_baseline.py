"""Shared machinery of the baseline strategies: pick, for every node, the valid configuration
closest to a wanted split (see :func:`closest`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from shardplan.ir import Graph, Topology
from shardplan.registry import Result, take_options
from shardplan.strategy.pase import devices_of, plan_from_choice
from shardplan.strategy.spaces import Space
from shardplan.strategy.tables import Tables, build_tables, graph_spaces

__all__ = ["DEFAULTS", "closest", "run_baseline"]

DEFAULTS: Mapping[str, Any] = {"devices": None, "cost_model": "pase", "cutoff": None,
                               "memory_limit": None}


def closest(configs: np.ndarray, want: np.ndarray) -> int:
    """Row of ``configs`` that splits no dimension more than ``want`` and, among those, uses
    the most devices (ties: the first row). Always exists: the all-ones row is valid. O(K d)."""
    ok = np.all(configs <= want[None, :], axis=1)
    score = np.where(ok, np.prod(configs, axis=1), -1)
    return int(np.argmax(score))


def run_baseline(name: str, graph: Graph, topology: Topology, options: Mapping[str, Any],
                 seed: int, want: Callable[[Space, int], np.ndarray],
                 record: Mapping[str, Any] | None = None) -> Result:
    """Build the tables, take ``want(space, devices)`` per node, report its cost."""
    t0 = time.perf_counter()
    opts = take_options(name, options, DEFAULTS)
    devices = devices_of(topology, opts["devices"])
    tables: Tables = build_tables(graph, devices, cost_model=opts["cost_model"],
                                  topology=topology, cutoff=opts["cutoff"],
                                  memory_limit=opts["memory_limit"])
    spaces = graph_spaces(graph)
    choice = np.array([closest(tables.configs[v], want(spaces[v], devices))
                       for v in range(graph.num_nodes)], dtype=np.int64)
    plan = plan_from_choice(tables, choice, graph_name=graph.name,
                            topology_name=topology.name, algorithm=name, seed=seed,
                            options=options if record is None else record,
                            status="feasible",
                            seconds=time.perf_counter() - t0, num_nodes=graph.num_nodes,
                            meta={"cost_model": tables.cost_model})
    return Result(plan, {})
