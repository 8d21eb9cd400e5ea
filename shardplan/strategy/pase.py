"""``strategy`` algorithm ``pase``: the best per-layer data/parameter-parallel configuration of
every node under a cost model (paper 004, sections II-III).

The search is :func:`shardplan.strategy._dp.solve` (recurrence 4 over GenerateSeq or
breadth-first sequences) on the tables of :func:`shardplan.strategy.tables.build_tables`; it is
exact under the chosen cost model, so the plan's status is ``optimal`` unless the time limit
cut it short. The plan has one stage holding every node on the first ``devices`` devices of the
topology (PaSE decides how each layer is split, not which device holds which part; section II)
and the ``strategy`` field.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Objective, Plan, Stage, Topology
from shardplan.registry import Progress, Result, register, take_options
from shardplan.strategy._dp import solve
from shardplan.strategy.tables import Tables, build_tables

__all__ = ["pase", "plan_from_choice", "solve_tables"]

DEFAULTS: Mapping[str, Any] = {
    "devices": None,            # default: every device of the topology
    "cost_model": "pase",       # pase | default
    "ordering": "generate-seq",  # generate-seq | bfs
    "cutoff": None,             # default: graph meta pase_cutoff, else 4
    "memory_limit": None,       # bytes per device (default cost model)
    "max_table_bytes": 4e9,     # DP table budget; over it the ordering is refused
}


def devices_of(topology: Topology, devices: Any) -> int:
    n = topology.num_devices if devices is None else devices
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ShardplanError(f"devices must be a positive integer, got {devices!r}")
    if n > topology.num_devices:
        raise ShardplanError(f"devices {n} exceeds the topology's {topology.num_devices}")
    return n


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


def solve_tables(tables: Tables, *, ordering: str = "generate-seq",
                 time_limit: float | None = None, progress: Progress | None = None,
                 max_table_bytes: float = 4e9, graph_name: str | None = None,
                 topology_name: str = "", seed: int = 0,
                 options: Mapping[str, Any] | None = None, t0: float | None = None) -> Result:
    """Run the DP on ``tables`` (built here or imported) and wrap the answer as a plan."""
    t0 = time.perf_counter() if t0 is None else t0
    res = solve(tables, ordering=ordering, time_limit=time_limit, progress=progress,
                max_table_bytes=max_table_bytes)
    seconds = time.perf_counter() - t0
    lb = res.value if res.status == "optimal" else None
    plan = plan_from_choice(tables, res.choice, graph_name=graph_name or tables.graph,
                            topology_name=topology_name, algorithm="pase", seed=seed,
                            options=options or {}, status=res.status, seconds=seconds,
                            num_nodes=tables.num_nodes, lower_bound=lb,
                            meta={"cost_model": tables.cost_model})
    stats = {"max_dependent_set": res.max_dependent, "max_table_entries": res.max_table,
             "table_bytes": res.table_bytes, "ordering": ordering,
             "configurations": [len(c) for c in tables.node_cost]}
    return Result(plan, stats)


@register("strategy", "pase")
def pase(graph: Graph, topology: Topology, *, options: Mapping[str, Any], seed: int,
         time_limit: float | None, progress: Progress | None = None) -> Result:
    """PaSE's FindBestStrategy (paper 004 Fig. 4) on ``graph`` for ``devices`` devices.

    Parameters
    ----------
    graph : Graph
        Nodes with ``space`` (others get a batch-only space).
    topology : Topology
        Its devices bound ``devices``; the ``default`` cost model reads its FLOP/s, memory
        and links.
    options : mapping
        ``devices``, ``cost_model`` (``pase`` | ``default``), ``ordering``
        (``generate-seq`` | ``bfs``), ``cutoff``, ``memory_limit`` (bytes per device),
        ``max_table_bytes``.
    seed : int
        Recorded only: the search is deterministic.
    time_limit : float, optional
        On expiry the plan is each node's locally cheapest configuration, ``timed_out``.

    Returns
    -------
    Result
        Objective ``pase_cost`` (FLOP-equivalents, ``pase`` model) or ``pase_seconds``
        (``default``); ``lower_bound`` equals the value when optimal.

    Notes
    -----
    Complexity O(n K^(M+1)) with K the most configurations of a node and M the largest
    dependent set (section III-B); memory O(n K^M) for the argmin tables.
    """
    t0 = time.perf_counter()
    opts = take_options("pase", options, DEFAULTS)
    devices = devices_of(topology, opts["devices"])
    tables = build_tables(graph, devices, cost_model=opts["cost_model"], topology=topology,
                          cutoff=opts["cutoff"], memory_limit=opts["memory_limit"])
    remaining = None if time_limit is None else max(1e-3, time_limit - (time.perf_counter()
                                                                         - t0))
    return solve_tables(tables, ordering=opts["ordering"], time_limit=remaining,
                        progress=progress, max_table_bytes=float(opts["max_table_bytes"]),
                        graph_name=graph.name, topology_name=topology.name, seed=seed,
                        options=options, t0=t0)
