"""A strategy as a choice of one configuration per node, and what every strategy algorithm
(``pase``, ``data-parallel``, ``expert``) shares about it: how many devices it runs on
(:func:`devices_of`), the valid configuration closest to a wanted split (:func:`closest`,
:func:`data_parallel_split`), and the one-stage plan a choice makes
(:func:`plan_from_choice`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.ir import Objective, Plan, Stage, Topology
from shardplan.strategy.spaces import Space
from shardplan.strategy.tables import Tables

__all__ = ["closest", "data_parallel_split", "devices_of", "plan_from_choice"]


def devices_of(topology: Topology, devices: Any) -> int:
    n = topology.num_devices if devices is None else devices
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ShardplanError(f"devices must be a positive integer, got {devices!r}")
    if n > topology.num_devices:
        raise ShardplanError(f"devices {n} exceeds the topology's {topology.num_devices}")
    return int(n)


def closest(configs: np.ndarray, want: np.ndarray) -> int:
    """Row of ``configs`` that splits no dimension more than ``want`` and, among those, uses
    the most devices (ties: the first row). Always exists: the all-ones row is valid. O(K d)."""
    ok = np.all(configs <= want[None, :], axis=1)
    score = np.where(ok, np.prod(configs, axis=1), -1)
    return int(np.argmax(score))


def data_parallel_split(space: Space, devices: int) -> np.ndarray:
    """Wanted factors: ``devices`` on the batch dimension, 1 elsewhere."""
    want = np.ones(len(space.dims), dtype=np.int64)
    if space.batch_dim is not None:
        want[space.index(space.batch_dim)] = devices
    return want


def plan_from_choice(tables: Tables, choice: Any, *, graph_name: str, topology_name: str,
                     algorithm: str, seed: int, options: Mapping[str, Any], status: str,
                     seconds: float, num_nodes: int, lower_bound: float | None = None,
                     meta: Mapping[str, Any] | None = None) -> Plan:
    """A one-stage plan carrying ``strategy``; objective recomputed from the tables."""
    value = tables.evaluate(choice)
    return Plan(graph=graph_name, topology=topology_name, algorithm=algorithm,
                stages=(Stage(tuple(range(num_nodes)), tuple(range(tables.devices))),),
                objective=Objective(tables.objective, value, lower_bound),
                status=status, seed=seed, options=dict(options), search_seconds=seconds,
                strategy=tables.strategy(choice), meta=dict(meta or {}))
