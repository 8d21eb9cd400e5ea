"""Strategy stages in the simulator: a plan carrying a PaSE ``strategy`` runs each stage on
a group of devices, each device running its part of every node. Their seconds come from
PaSE's price (:func:`shardplan.strategy._price.stage_prices`, the one its search uses);
:func:`_strategy_engine_inputs` and :func:`_strategy_stage_times` turn them into what the
engine (:mod:`shardplan.simulate._engine`) runs, the stage's devices as its replicas.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from shardplan.cost import CostModel
from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, Plan, Topology

__all__ = ["_strategy_engine_inputs", "_strategy_stage_times", "per_device_traffic",
           "strategy_stage_seconds"]


def strategy_stage_seconds(plan: Plan, graph: Graph, topology: Topology,
                           settings: ExecutionSettings) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of one micro-batch on each device of every stage of a
    plan carrying a PaSE ``strategy``: the stage's P devices run its nodes under their
    configurations, priced by :func:`shardplan.strategy._price.stage_prices` (the same
    price PaSE's search uses: compute at the plan's micro-batch and precision, activation
    collectives and re-shards every micro-batch at their sizes, DTensor overheads, the
    all-gathers of outputs leaving the stage whole, the re-shards of batch shards arriving
    from another stage). Weight gradients are not in these seconds:
    :func:`simulate` reduces them once per iteration with the plan's gradient
    synchronisation. O(n + m) per stage."""
    from shardplan.strategy._price import stage_prices

    assert plan.strategy is not None  # the only callers pass plans that carry one
    prices = stage_prices(plan, graph, topology, settings)
    return (np.array([p["forward"] for p in prices]),
            np.array([p["backward"] for p in prices]))


def _strategy_stage_times(st: Any, strat: dict[str, Any], cm: CostModel, a_pos: np.ndarray,
                          k: int, order: Sequence[int], topology: Topology) -> Any:
    """``st`` (priced on what each device holds) with the strategy's seconds on every
    device of each stage, the gradient bytes of the stages' rings, and the messages between
    stages as the hybrid runtime sends them: device ``i`` of a stage sends to device ``i``
    of the next, for every tensor crossing, its batch shard (``bytes / q`` for a tensor
    its producer splits ``q`` ways by the batch alone, ``strat["shards"]``, between stages
    of as many devices) or the whole tensor. O(S R + messages)."""
    from shardplan.cost._pipeline import _messages, ring_collectives, stage_traffic
    mask = st.devices >= 0
    fwd = np.asarray(strat["forward"])[list(order)]
    bwd = np.asarray(strat["backward"])[list(order)]
    grads = np.bincount(a_pos, weights=cm.graph.param_bytes.astype(np.float64), minlength=k)
    reps = st.replicas
    ar = np.zeros(k)
    for s in range(k):
        r = int(reps[s])
        if r > 1 and grads[s] > 0:
            ring = st.devices[s:s + 1, :r]
            ar[s] = float(ring_collectives(topology, "allreduce", ring, grads[s:s + 1],
                                           cm.inverse_bandwidth)[0])
    _, tt = stage_traffic(cm.graph, a_pos, k)
    tb = per_device_traffic(cm.graph, a_pos, k, reps, strat["shards"])
    msgs = _messages(tb, tt, st.devices, reps, topology.latency, cm.inverse_bandwidth)
    return dataclasses.replace(st, forward=np.where(mask, fwd[:, None], 0.0),
                               backward=np.where(mask, bwd[:, None], 0.0),
                               param_bytes=grads, allreduce=ar, messages=msgs)


def per_device_traffic(graph: Graph, a_pos: np.ndarray, k: int, reps: np.ndarray,
                       shards: np.ndarray) -> np.ndarray:
    """``(k, k)`` bytes between stages (positions) scaled for the engine's replica pairs,
    which carry ``1 / max(R_a, R_b)`` of them each: so that each of the pairs carries, per
    tensor, its batch shard (``bytes / q``, stages of as many devices) or the whole tensor
    (the tensors :func:`~shardplan.cost._transfer.cut_tensors` finds). O(m log m + k^2).
    """
    from shardplan.cost._transfer import cut_tensors

    sa, sb, nbytes, producer = cut_tensors(graph, np.asarray(a_pos, dtype=np.int64), k)
    wide = np.maximum(reps[sa], reps[sb]).astype(np.float64)
    q = np.where(reps[sa] == reps[sb], np.asarray(shards)[producer], 1).astype(np.float64)
    return np.bincount(sa * k + sb, weights=nbytes * wide / q,
                       minlength=k * k).reshape(k, k)


def _strategy_engine_inputs(plan: Plan, graph: Graph, topology: Topology,
                            settings: ExecutionSettings) -> dict[str, Any]:
    """What the engine needs to run a strategy plan with each stage's devices as its
    replicas: per stage its seconds, the graph whose parameter bytes are what each node's
    gradient adds to its stage's ring (:meth:`~shardplan.strategy._price.StagePricer.
    sync_bytes`: an all-batch configuration adds its whole gradient, as data parallelism
    does), and the graph of what one device holds (its part of every parameter and of
    every output). O(n + m) per stage."""
    from shardplan.strategy._price import stage_prices

    if settings.gradient_sync in ("sharded", "zero1"):
        raise ShardplanError(f"a strategy plan synchronises gradients with 'end' or "
                             f"'bucketed', not {settings.gradient_sync!r}")
    prices = stage_prices(plan, graph, topology, settings)
    sync = np.sum([p["sync_bytes"] for p in prices], axis=0)
    grads = np.sum([p["grad_bytes"] for p in prices], axis=0)
    outs = np.sum([p["output_bytes"] for p in prices], axis=0)
    micro = settings.resolve(graph).graph_for(graph)
    return {"forward": np.array([p["forward"] for p in prices]),
            "backward": np.array([p["backward"] for p in prices]),
            "sync": graph.replace(param_bytes=sync),
            "shards": np.max([p["shards"] for p in prices], axis=0),
            "held": micro.replace(param_bytes=grads, output_bytes=np.rint(outs))}
