"""Pieces shared by the three sharding-cost partitioners (paper 000, section 2)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from shardplan.cost._sharding import SHARDING_OBJECTIVE, sharding_cost
from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Objective, Plan, Stage, Topology
from shardplan.partition._sharding_search import STARTS, Problem

__all__ = ["check_bool_option", "check_int_option", "check_start", "flat_problem", "make_plan",
           "num_components"]


def check_int_option(name: str, value: Any, *, low: int = 1, allow_none: bool = False) -> Any:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ShardplanError(f"option {name} must be an integer >= {low}, got {value!r}")
    return int(value)


def check_bool_option(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ShardplanError(f"option {name} must be true or false, got {value!r}")
    return bool(value)


def check_start(value: Any) -> str:
    if value not in STARTS:
        raise ShardplanError(f"option start must be one of {', '.join(STARTS)}, got {value!r}")
    return str(value)


def num_components(graph: Graph, topology: Topology, stages: Any) -> int:
    """k: ``stages`` or every device; at most the devices and the nodes."""
    d = topology.num_devices
    k = d if stages is None else check_int_option("stages", stages)
    if k > d:
        raise ShardplanError(f"{k} stages need {k} devices but the topology has {d}")
    if k > graph.num_nodes:
        raise ShardplanError(f"{k} non-empty components need at least {k} nodes; the graph has "
                             f"{graph.num_nodes} (use --stages)")
    return k


def flat_problem(graph: Graph, topology: Topology, k: int) -> Problem:
    """The sharding cost of section 2.1 as a search problem over the topology's devices."""
    return Problem.build(graph.weight, graph.src, graph.dst, graph.topological_rank,
                         graph.levels, topology.cost_matrix, k)


def make_plan(graph: Graph, topology: Topology, algorithm: str, assignment: np.ndarray,
              placement: np.ndarray, *, status: str, seed: int, options: Mapping[str, Any],
              seconds: float, exact: bool = False) -> Plan:
    """k stages of one device each, ordered by device; the objective recomputed from scratch
    with :func:`shardplan.cost.sharding_cost` (what ``shardplan cost`` evaluates); ``exact``:
    the value is the optimum, recorded as its own lower bound."""
    order = np.argsort(placement, kind="stable")
    remap = np.empty_like(order)
    remap[order] = np.arange(order.size)
    a = remap[np.asarray(assignment, dtype=np.int64)]
    p = np.asarray(placement, dtype=np.int64)[order]
    members = np.argsort(a, kind="stable")
    bounds = np.searchsorted(a[members], np.arange(p.size + 1))
    stages = tuple(Stage(tuple(members[bounds[i]:bounds[i + 1]].tolist()), (int(p[i]),))
                   for i in range(p.size))
    value = sharding_cost(a, p, graph, topology)
    return Plan(graph=graph.name, topology=topology.name, algorithm=algorithm, stages=stages,
                objective=Objective(SHARDING_OBJECTIVE, value, value if exact else None),
                status=status,
                seed=seed, options=dict(options), search_seconds=seconds)
