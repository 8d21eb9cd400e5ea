"""What ``shardplan replan`` reads besides the plan and its context
(:mod:`shardplan.cli._replan_context`): the model's graph, the cluster the plan was made for,
and a checkpoint's description."""

from __future__ import annotations

import argparse
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


def checkpoint_info(path: str, plan: Any) -> dict[str, Any]:
    """A checkpoint folder as ``shardplan train --checkpoint-dir`` writes it, read without
    torch (:mod:`shardplan.runtime._checkpoint_state`: ``latest`` naming a complete
    ``step-NNNNNNNN`` folder, its ``state.json``): its path, step, bytes on disk, and the
    layout and global batch it was written under when it says them. Raises one line when it
    is not a checkpoint, or when it says it was written under another layout than the plan's.
    """
    from shardplan.ir import ParallelConfig
    from shardplan.runtime._checkpoint_state import latest, read_state

    if not os.path.isdir(path):
        raise ShardplanError(f"--checkpoint {path}: not a checkpoint folder")
    found = latest(path)
    if found is None:
        raise ShardplanError(f"--checkpoint {path}: not a checkpoint folder (no 'latest' "
                             f"file in it)")
    step, folder = found
    state = read_state(folder, step)
    size = sum(os.path.getsize(os.path.join(root, f))
               for root, _, files in os.walk(folder) for f in files)
    out: dict[str, Any] = {"path": path, "checkpoint": os.path.basename(folder),
                           "step": step, "bytes": size}
    written = state.get("parallel")
    if isinstance(written, dict):
        try:
            layout = ParallelConfig.from_dict(written)
        except ShardplanError:
            layout = None
        if layout is not None and plan.parallel is not None and layout != plan.parallel:
            raise ShardplanError(f"--checkpoint {path}: written under {layout.label()}, the "
                                 f"plan is {plan.parallel.label()}")
        out["parallel"] = written
    for key in ("global_batch", "model"):
        if key in state:
            out[key] = state[key]
    return out
