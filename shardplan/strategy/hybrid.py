"""Hybrid plans: a pipeline whose stages each carry a PaSE strategy over their devices.

A pipeline plan (Parmesan, PipeDream, ...) puts each stage on a group of devices, which the
pipeline runtime uses as data-parallel replicas. :func:`hybrid_plan` instead searches, for
every stage, the best per-layer configuration of the stage's nodes over the stage's device
count (PaSE's dynamic program restricted to the stage, paper 004 section III, or one of the
baselines) and returns the same plan with a ``strategy``: the devices of a stage then split
its layers (pipeline x tensor/data parallelism). Same ``Plan`` format: ``stages[s].devices``
is stage ``s``'s device group and ``strategy[str(v)]`` the configuration of node ``v`` over
the group of its stage.

Stage boundaries: an output a stage's configuration splits by the batch alone leaves in
its batch shards, device ``i`` of the stage sending its own to device ``i`` of the next (as
a replicated pipeline's replicas do), and is not gathered (the model's output so split
stays split: each device computes the loss of its shard); any other leaves whole. A
per-stage search sees that its own outputs need no gather when split by the batch (with the
``default`` cost model), but not what reading tensors from other stages costs (a shard
re-sharded to its consumer's layout; the simulator charges it) nor the pipeline's own
timing beyond its fill and drain; each stage's strategy cost is recorded in the plan's
``hybrid`` entry.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Objective, Plan, Topology

__all__ = ["hybrid_plan", "stage_subgraph", "sub_topology"]

_STATUS_ORDER = ("optimal", "feasible", "timed_out")


def stage_subgraph(graph: Graph, nodes: Sequence[int]) -> tuple[Graph, list[int]]:
    """The subgraph induced by ``nodes`` (renumbered 0..k-1 in increasing id order) and the
    original id of each of its nodes. Edges into or out of the set are dropped, and so are
    the spaces' descriptions of tensors read from outside it. O(n + m)."""
    ids = sorted(int(v) for v in nodes)
    if not ids:
        raise ShardplanError("a stage without nodes has no strategy")
    index = {v: i for i, v in enumerate(ids)}
    keep = np.array([int(s) in index and int(d) in index
                     for s, d in zip(graph.src.tolist(), graph.dst.tolist(), strict=True)],
                    dtype=bool)
    src = [index[int(s)] for s in graph.src[keep]]
    dst = [index[int(d)] for d in graph.dst[keep]]
    spaces: tuple[Mapping[str, Any] | None, ...] | None = None
    if graph.spaces is not None:
        kept: list[Mapping[str, Any] | None] = []
        for v in ids:
            space = graph.spaces[v]
            if space is None:
                kept.append(None)
                continue
            sp = dict(space)
            sp["inputs"] = {str(index[int(p)]): g for p, g in (sp.get("inputs") or {}).items()
                            if int(p) in index}
            kept.append(sp)
        spaces = tuple(kept)

    def col(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else np.asarray(a)[ids]

    def req(a: np.ndarray) -> np.ndarray:
        return np.asarray(a)[ids]

    sub = Graph(
        name=graph.name, batch_size=graph.batch_size,
        names=tuple(graph.names[v] for v in ids), ops=tuple(graph.ops[v] for v in ids),
        modules=tuple(graph.modules[v] for v in ids),
        fwd_flops=req(graph.fwd_flops), bwd_flops=req(graph.bwd_flops),
        param_bytes=req(graph.param_bytes), output_bytes=req(graph.output_bytes),
        weight=req(graph.weight), src=np.asarray(src, dtype=np.int64),
        dst=np.asarray(dst, dtype=np.int64), edge_bytes=graph.edge_bytes[keep],
        fwd_seconds=col(graph.fwd_seconds), bwd_seconds=col(graph.bwd_seconds),
        memory_bytes=col(graph.memory_bytes), param_tensors=col(graph.param_tensors),
        spaces=spaces,
        node_extra=None if graph.node_extra is None else
        tuple(graph.node_extra[v] for v in ids), meta=dict(graph.meta))
    return sub, ids


def sub_topology(topology: Topology, devices: Sequence[int]) -> Topology:
    """The topology restricted to ``devices`` (in that order): their links and latencies,
    without levels or physical links. O(k^2)."""
    idx = [int(d) for d in devices]
    ix = np.ix_(idx, idx)
    return Topology(name=f"{topology.name}[{','.join(map(str, idx))}]",
                    devices=tuple(topology.devices[d] for d in idx),
                    bandwidth=topology.bandwidth[ix], latency=topology.latency[ix],
                    cost=None if topology.cost is None else topology.cost[ix])


def hybrid_plan(plan: Plan, graph: Graph, topology: Topology | None = None, *,
                algorithm: str = "pase", seed: int = 0, time_limit: float | None = None,
                options: Mapping[str, Any] | None = None) -> Plan:
    """``plan`` with every stage's nodes configured over the stage's devices.

    Parameters
    ----------
    plan : Plan
        A pipeline plan without ``strategy`` (every stage the same device count, for the
        runtime; the search itself does not need it).
    graph : Graph
        The graph it partitions; nodes with ``space`` (others get a batch-only space).
    topology : Topology, optional
        Read by the ``default`` cost model (restricted to each stage's devices); default:
        flat devices.
    algorithm : {"pase", "data-parallel", "expert"}
        The strategy search run per stage.
    seed : int
    time_limit : float, optional
        For all stages together; each stage gets what the previous ones left, and a search
        cut short returns its best so far.
    options : mapping, optional
        The strategy algorithm's options (``cost_model``, ``cutoff``, ...; ``devices`` is
        each stage's device count).

    Returns
    -------
    Plan
        The same stages, devices and execution settings, with ``strategy`` and a ``hybrid``
        entry (per stage: its strategy's objective, value and status; the stages whose
        search the time limit cut short). The status is the worst of the plan's and the
        stages' searches. With the ``default`` cost model (the simulator's price, per
        iteration) the objective is the plan's own: ``iteration_seconds``, the slowest
        stage's iteration stretched by the pipeline's fill and drain, ``(M + S - 1) / M``;
        otherwise the pipeline's objective is kept.

    Notes
    -----
    The sum over stages of the strategy search's cost (O(n_s K^(M+1)) per stage for PaSE,
    section III-B); stages are independent given the pipeline, which is what restricting the
    DP to a stage assumes.
    """
    from shardplan import registry
    from shardplan.topology import flat

    if plan.strategy is not None:
        raise ShardplanError("the plan already carries a strategy")
    plan.validate(graph, topology)
    opts = dict(options or {})
    if "devices" in opts:
        raise ShardplanError("a hybrid plan's device counts are its stages'")
    t0 = time.perf_counter()
    strategy: dict[str, tuple[int, ...]] = {}
    report: list[dict[str, Any]] = []
    statuses = [plan.status]
    for s, st in enumerate(plan.stages):
        sub, ids = stage_subgraph(graph, st.nodes)
        topo = flat(len(st.devices)) if topology is None else \
            sub_topology(topology, st.devices)
        left = None if time_limit is None else max(1e-3, time_limit - (time.perf_counter()
                                                                       - t0))
        # (the default cost model's ``loss_on_shards``: a stage's outputs split by the
        # batch alone go to the next stage's devices, or to the loss, in their shards)
        res = registry.run("strategy", algorithm, sub, topo, seed=seed, time_limit=left,
                           devices=len(st.devices), **opts)
        got = res.plan.strategy or {}
        for i, v in enumerate(ids):
            strategy[str(v)] = tuple(int(f) for f in got[str(i)])
        statuses.append(res.plan.status)
        report.append({"stage": s, "devices": len(st.devices), "algorithm": algorithm,
                       "objective": res.plan.objective.name,
                       "value": res.plan.objective.value, "status": res.plan.status})
    status = max(statuses, key=_STATUS_ORDER.index)
    cut = [r["stage"] for r in report if r["status"] == "timed_out"]
    meta = {**dict(plan.meta), "hybrid": {"strategy": algorithm, "stages": report,
                                          "search_seconds": time.perf_counter() - t0,
                                          "timed_out_stages": cut}}
    objective = plan.objective
    if report and all(r["objective"] == "iteration_seconds" for r in report):
        # every stage priced as the simulator does, per iteration: the pipeline's
        # iteration is the slowest stage's M micro-batches plus the S - 1 steps it waits
        # for the pipeline to fill and drain (GPipe's and 1F1B's (M + S - 1) steps)
        m = int(plan.settings.microbatches)
        slowest = max(float(r["value"]) for r in report)
        objective = Objective("iteration_seconds",
                              slowest * (m + len(plan.stages) - 1) / m, None)
    return replace(plan, strategy=strategy, status=status, meta=meta, objective=objective)
