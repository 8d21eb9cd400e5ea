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
from dataclasses import replace
from typing import Any

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Topology
from shardplan.registry import Progress, Result, register, take_options
from shardplan.strategy._choice import (
    closest,
    data_parallel_split,
    devices_of,
    plan_from_choice,
)
from shardplan.strategy._dp import check_finite, greedy_choice, lower_bound, solve
from shardplan.strategy.spaces import configurations
from shardplan.strategy.tables import (
    Tables,
    build_tables,
    execution_of,
    graph_spaces,
    priced_settings,
    search_graph,
)

__all__ = ["data_parallel_rows", "pase", "plan_from_choice", "solve_tables"]

DEFAULTS: Mapping[str, Any] = {
    "devices": None,            # default: every device of the topology
    "cost_model": "pase",       # pase | default
    "ordering": "generate-seq",  # generate-seq | bfs
    "cutoff": None,             # default: graph meta pase_cutoff, else 4
    "memory_limit": None,       # bytes per device (default cost model)
    "max_table_bytes": 4e9,     # DP table budget; over it the ordering is refused
    "execution": None,          # how the plan runs (default cost model): ExecutionSettings
    "loss_on_shards": True,     # batch-split outputs stay split (the loss, the next stage)
}


#: Re-solves at the gradients' exposed share the answer leaves, at most (DDP's overlap).
RESOLVES = 4


def solve_tables(tables: Tables, *, ordering: str = "generate-seq",
                 time_limit: float | None = None, progress: Progress | None = None,
                 max_table_bytes: float = 4e9, graph_name: str | None = None,
                 topology_name: str = "", seed: int = 0,
                 options: Mapping[str, Any] | None = None, t0: float | None = None,
                 incumbents: Mapping[str, np.ndarray] | None = None) -> Result:
    """Run the DP on ``tables`` (built here or imported) and wrap the answer as a plan.

    ``time_limit`` counts from ``t0`` (default: now), so that the caller's table building
    counts too. ``incumbents`` are named strategies to fall back on (``data-parallel``...);
    a greedy pass that prices edges (:func:`greedy_choice`) is always among them, and the
    cheapest is what a search cut short returns, with status ``timed_out`` and the sum of
    every node's and edge's cheapest cost as lower bound.
    """
    t0 = time.perf_counter() if t0 is None else t0
    deadline = None if time_limit is None else t0 + time_limit
    if tables.num_nodes == 0:
        raise ShardplanError("the tables have no nodes: there is no strategy to choose")
    check_finite(tables)
    candidates = {"greedy": greedy_choice(tables)}
    candidates.update(incumbents or {})
    values = {k: tables.evaluate(c) for k, c in candidates.items()}
    fallback = min(values, key=lambda k: (values[k], k))
    res = solve(tables, ordering=ordering, deadline=deadline, progress=progress,
                max_table_bytes=max_table_bytes, incumbent=candidates[fallback])
    seconds = time.perf_counter() - t0
    if res.status == "optimal":
        lb: float | None = res.value
        meta: dict[str, Any] = {"cost_model": tables.cost_model}
    else:
        lb = min(lower_bound(tables), res.value)
        meta = {"cost_model": tables.cost_model, "incumbent": fallback,
                "incumbents": {k: v for k, v in sorted(values.items())}}
    plan = plan_from_choice(tables, res.choice, graph_name=graph_name or tables.graph,
                            topology_name=topology_name, algorithm="pase", seed=seed,
                            options=options or {}, status=res.status, seconds=seconds,
                            num_nodes=tables.num_nodes, lower_bound=lb, meta=meta)
    stats = {"max_dependent_set": res.max_dependent, "max_table_entries": res.max_table,
             "table_bytes": res.table_bytes, "ordering": ordering,
             "configurations": [len(c) for c in tables.node_cost]}
    return Result(plan, stats)


def data_parallel_rows(graph: Graph, devices: int, cutoff: int | None) -> list[np.ndarray]:
    """Per node, its data-parallel configuration (one row): the largest batch split its
    space allows (:func:`~shardplan.strategy._choice.data_parallel_split`). O(n K d)."""
    cut = int(cutoff if cutoff is not None else graph.meta.get("pase_cutoff", 4))
    rows = []
    for space in graph_spaces(graph):
        configs = configurations(space, devices, cut)
        rows.append(configs[closest(configs, data_parallel_split(space, devices))][None, :])
    return rows


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
        ``devices``, ``cost_model`` (``pase``: the paper's formulas | ``default``: the
        simulator's price of the plan, :mod:`shardplan.strategy._price`), ``ordering``
        (``generate-seq`` | ``bfs``), ``cutoff``, ``memory_limit`` (bytes per device),
        ``max_table_bytes``, ``execution`` (the settings the plan runs with, which the
        ``default`` model prices: micro-batch size and count, precision, gradient sync).
    seed : int
        Recorded only: the search is deterministic.
    time_limit : float, optional
        Counts table building, pruning and the DP. On expiry the plan is the cheaper of data
        parallelism and a greedy pass that prices edges (data parallelism alone when the
        tables were not even built), status ``timed_out``.

    Returns
    -------
    Result
        Objective ``pase_cost`` (FLOP-equivalents, ``pase`` model) or
        ``iteration_seconds`` (``default``); ``lower_bound`` equals the value when optimal.

    Notes
    -----
    Complexity O(n K^(M+1)) with K the most configurations of a node and M the largest
    dependent set (section III-B); memory O(n K^M) for the argmin tables. Not in the paper:
    what a time limit returns (the prototype has none).
    """
    t0 = time.perf_counter()
    opts = take_options("pase", options, DEFAULTS)
    if graph.num_nodes == 0:
        raise ShardplanError("the graph has no nodes: there is no strategy to choose")
    devices = devices_of(topology, opts["devices"])
    deadline = None if time_limit is None else t0 + time_limit
    settings = execution_of(opts["execution"])
    kw = {"cost_model": opts["cost_model"], "topology": topology, "cutoff": opts["cutoff"],
          "memory_limit": opts["memory_limit"], "settings": settings,
          "loss_on_shards": bool(opts["loss_on_shards"])}
    work = search_graph(graph, opts["cost_model"], settings)
    dp_rows = data_parallel_rows(work, devices, opts["cutoff"])
    tables = build_tables(graph, devices, **kw, check=None if deadline is None else
                          (lambda: time.perf_counter() > deadline))
    if tables is None:  # out of time before the tables were built: data parallelism
        single = build_tables(graph, devices, **kw, only=dp_rows)
        assert single is not None
        choice = np.zeros(graph.num_nodes, dtype=np.int64)
        plan = plan_from_choice(single, choice, graph_name=graph.name,
                                topology_name=topology.name, algorithm="pase", seed=seed,
                                options=options, status="timed_out",
                                seconds=time.perf_counter() - t0, num_nodes=graph.num_nodes,
                                meta={"cost_model": single.cost_model,
                                      "incumbent": "data-parallel"})
        if opts["cost_model"] == "default":
            plan = plan.with_settings(priced_settings(graph, settings))
        return Result(plan, {"tables": "not built"})
    dp_choice = np.array([tables.index_of(v, dp_rows[v][0]) for v in range(graph.num_nodes)],
                         dtype=np.int64)
    def run(t: Tables) -> Result:
        return solve_tables(t, ordering=opts["ordering"], time_limit=time_limit,
                            progress=progress, max_table_bytes=float(opts["max_table_bytes"]),
                            graph_name=graph.name, topology_name=topology.name, seed=seed,
                            options=options, t0=t0, incumbents={"data-parallel": dp_choice})

    res = run(tables)
    if opts["cost_model"] != "default":
        return res
    exposure = tables.meta.get("sync_exposure")
    if exposure is not None:
        # under DDP's overlap the exposed share of the gradients' rings is the answer's
        # own: solve again at the share the answer leaves until the two agree
        from shardplan.strategy._price import SimulatorCostModel

        model = SimulatorCostModel(graph, topology, devices, settings, opts["memory_limit"],
                                   loss_on_shards=bool(opts["loss_on_shards"]),
                                   exposed=exposure)
        rings = [model.ring_seconds(v, tables.configs[v]) for v in range(graph.num_nodes)]
        for _ in range(RESOLVES):
            mine = model.exposed_of(res.plan.strategy)
            if abs(mine - exposure) <= 1e-3 or (deadline is not None
                                                and time.perf_counter() > deadline):
                break
            # only the nodes' gradient terms change with the share: the edges stay
            costs = tuple(c + (mine - exposure) * r
                          for c, r in zip(tables.node_cost, rings, strict=True))
            tables = replace(tables, node_cost=costs,
                             meta={**tables.meta, "sync_exposure": mine})
            exposure = mine
            res = run(tables)
        mine = model.exposed_of(res.plan.strategy)
        if abs(mine - exposure) > 1e-3 and res.plan.strategy is not None:
            # cut before the shares agreed: the answer's own cost at its own share (only
            # the nodes' gradient terms move with it, linearly), so the objective is the
            # price of the plan returned, not of the share it was searched at
            chosen = [tables.index_of(v, res.plan.strategy[str(v)])
                      for v in range(graph.num_nodes)]
            delta = (mine - exposure) * float(sum(rings[v][i] for v, i in enumerate(chosen)))
            obj = res.plan.objective
            res = Result(replace(res.plan, objective=replace(obj, value=obj.value + delta)),
                         res.stats)
            exposure = mine
        res = Result(replace(res.plan, meta={**res.plan.meta, "sync_exposure": exposure}),
                     res.stats)
    return Result(res.plan.with_settings(priced_settings(graph, settings)), res.stats)
