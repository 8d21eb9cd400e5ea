"""What ``shardplan replan`` reads besides the plan and its context
(:mod:`shardplan.cli._replan_context`): the model's graph, the cluster the plan was made for,
and a checkpoint's description."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from shardplan.errors import ShardplanError

__all__ = ["checkpoint_info", "graph_for", "old_cluster"]


def graph_for(args: argparse.Namespace, plan: Any, ctx: Any) -> Any:
    """``--graph``, else the model the first search planned (its graph file, or its spec
    captured again as ``plan`` captured it). Raises when neither is known or the graph is
    not the plan's."""
    from shardplan.ir import load_graph

    if args.graph:
        graph = load_graph(args.graph)
    elif ctx.model and ctx.model_is_file:
        if not os.path.exists(ctx.model):
            raise ShardplanError(f"the plan was made from graph file {ctx.model}, which is "
                                 f"gone: give --graph GRAPH")
        graph = load_graph(ctx.model)
    elif ctx.model:
        from shardplan.capture import capture_spec

        graph = capture_spec(ctx.model, batch_size=ctx.batch_size or 8, seq_len=ctx.seq_len)
    else:
        raise ShardplanError("the plan does not say which model it is of: give --graph GRAPH")
    if plan.graph and graph.name != plan.graph:
        raise ShardplanError(f"the plan is of graph {plan.graph!r}, the graph given is "
                             f"{graph.name!r}")
    return graph


def old_cluster(args: argparse.Namespace, plan: Any, ctx: Any) -> Any:
    """The cluster the plan was made for: ``--old-cluster``, else the first search's
    ``--cluster`` (with its ``--gpus`` and ``--memory-limit``)."""
    from shardplan.cli.plan import _cluster, _limit_memory

    if args.old_cluster:
        return _cluster(args.old_cluster)
    if not ctx.cluster:
        raise ShardplanError("the plan does not say which cluster it was made for: give "
                             "--old-cluster TOPO")
    topology = _limit_memory(_cluster(ctx.cluster, ctx.gpus), ctx.memory_limit)
    if plan.parallel is not None and plan.parallel.world_size > topology.num_devices:
        raise ShardplanError(f"the plan needs {plan.parallel.world_size} devices, cluster "
                             f"{ctx.cluster!r} has {topology.num_devices}")
    return topology


def checkpoint_info(path: str) -> dict[str, Any]:
    """A checkpoint folder as ``shardplan train --checkpoint-dir`` writes it
    (:mod:`shardplan.runtime._checkpoint`: ``latest`` naming a ``step-NNNNNNNN`` folder with
    its ``state.json``), read without torch: its path, step and bytes on disk. Raises one
    line when it is not one."""
    latest = os.path.join(path, "latest")
    if not os.path.isdir(path) or not os.path.isfile(latest):
        raise ShardplanError(f"--checkpoint {path}: not a checkpoint folder (no 'latest' "
                             f"file in it)")
    with open(latest, encoding="utf-8") as fh:
        name = fh.read().strip()
    folder = os.path.join(path, name)
    state = os.path.join(folder, "state.json")
    if not name.startswith("step-") or os.sep in name or not os.path.isfile(state):
        raise ShardplanError(f"--checkpoint {path}: 'latest' names no complete checkpoint "
                             f"({name!r})")
    try:
        with open(state, encoding="utf-8") as fh:
            step = json.load(fh).get("step")
    except (OSError, ValueError, AttributeError):
        raise ShardplanError(f"--checkpoint {path}: {state} is not readable JSON") from None
    size = sum(os.path.getsize(os.path.join(root, f))
               for root, _, files in os.walk(folder) for f in files)
    return {"path": path, "checkpoint": name, "step": step, "bytes": size}
