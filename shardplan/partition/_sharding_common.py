"""Pieces shared by the three sharding-cost partitioners (paper 000, section 2)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from shardplan.cost._sharding import SHARDING_OBJECTIVE, sharding_cost
from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, Objective, Plan, Stage, Topology
from shardplan.ir.settings import LEGACY_SETTING_KEYS
from shardplan.partition._sharding_problem import STARTS, Problem

__all__ = ["ACYCLIC_DOC", "SETTING_DEFAULTS", "acyclic_report", "check_bool_option",
           "check_int_option", "check_start", "flat_problem", "make_plan", "num_components",
           "sharding_settings", "split_deadline"]

#: The execution settings a sharding partitioner takes (they do not change the sharding cost;
#: the plan carries them to ``train``): see :class:`~shardplan.ir.ExecutionSettings`.
SETTING_DEFAULTS: dict[str, Any] = {**{k: None for k in ExecutionSettings.__dataclass_fields__},
                                    **{k: None for k in LEGACY_SETTING_KEYS},
                                    "global_batch": None}


def sharding_settings(graph: Graph, options: Mapping[str, Any]) -> ExecutionSettings:
    """The plan's execution settings from the options, resolved against ``graph``; the
    schedule defaults to GPipe, the one paper 000 trains its partitions with."""
    given = {k: options.get(k) for k in SETTING_DEFAULTS}
    if given.get("schedule") is None:
        given["schedule"] = "gpipe"
    settings, _ = ExecutionSettings().override(**given)
    return settings.resolve(graph)

#: What the ``acyclic`` option does, for the partitioners' docstrings and the README.
ACYCLIC_DOC = (
    "``acyclic`` (default true): only partitions whose components form a DAG (every edge "
    "runs from a component to itself or a later one), which a pipeline can run; the plan's "
    "``acyclic`` entry reports the cost of the same search without the constraint. "
    "``acyclic=false`` is paper 000's unconstrained problem.")


def split_deadline(t0: float, time_limit: float | None, compare: bool) -> tuple[
        float | None, float | None]:
    """Deadlines of the constrained search and of the unconstrained comparison after it:
    with a time limit and a comparison, each gets half of the time the searches aim at."""
    from shardplan.partition._sharding_search import search_deadline

    end = search_deadline(t0, time_limit)
    if end is None or not compare:
        return end, end
    return t0 + 0.5 * (end - t0), end


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


def flat_problem(graph: Graph, topology: Topology, k: int, *, acyclic: bool = False,
                 cost: np.ndarray | None = None) -> Problem:
    """The sharding cost of section 2.1 as a search problem over the topology's devices
    (``acyclic``: over monotone partitions only, see :class:`Problem`; ``cost``: the
    topology's ``cost_matrix`` when the caller has it already)."""
    return Problem.build(graph.weight, graph.src, graph.dst, graph.topological_rank,
                         graph.levels, topology.cost_matrix if cost is None else cost, k,
                         acyclic=acyclic)


def acyclic_report(graph: Graph, topology: Topology, assignment: np.ndarray,
                   placement: np.ndarray, unconstrained: Any, *, exact: bool) -> dict[str, Any]:
    """The plan's ``acyclic`` entry: its stages form a DAG, and what the constraint costs
    against the best partition without it (``unconstrained``: ``(assignment, placement,
    status)`` of the same search run without the constraint, or None when not run);
    ``exact``: both searches were exhaustive (brute force), so ``unconstrained`` is the
    unconstrained optimum."""
    a = np.asarray(assignment, dtype=np.int64)
    out: dict[str, Any] = {"acyclic": bool(graph.is_acyclic_partition(a))}
    if unconstrained is not None:
        ua, up, status = unconstrained
        value = sharding_cost(np.asarray(ua, dtype=np.int64), np.asarray(up, dtype=np.int64),
                              graph, topology)
        mine = sharding_cost(a, np.asarray(placement, dtype=np.int64), graph, topology)
        out.update(unconstrained=value, unconstrained_status=status,
                   unconstrained_acyclic=bool(graph.is_acyclic_partition(
                       np.asarray(ua, dtype=np.int64))),
                   ratio=(mine / value) if value > 0 else (1.0 if mine == 0 else None),
                   exact=bool(exact))
    return out


def make_plan(graph: Graph, topology: Topology, algorithm: str, assignment: np.ndarray,
              placement: np.ndarray, *, status: str, seed: int, options: Mapping[str, Any],
              seconds: float, exact: bool = False,
              meta: Mapping[str, Any] | None = None) -> Plan:
    """k stages of one device each, ordered by device; the objective recomputed from scratch
    with :func:`shardplan.cost.sharding_cost` (what ``shardplan cost`` evaluates); ``exact``:
    the value is the optimum, recorded as its own lower bound; ``meta``: extra top-level
    plan fields. The execution settings among ``options`` become the plan's ``execution``
    (:func:`sharding_settings`); the others are recorded as its ``options``."""
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
                status=status, seed=seed,
                options={k: v for k, v in options.items() if k not in SETTING_DEFAULTS},
                search_seconds=seconds, meta=dict(meta or {}),
                execution=sharding_settings(graph, options))
