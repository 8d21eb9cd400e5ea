"""What ``plan -o`` leaves in an LLM plan file for a later ``shardplan replan`` (issue 48,
item 2): the first search's best priced layouts and the inputs it was given
(:class:`~shardplan.planner._replan.ReplanContext`)."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from typing import Any

__all__ = ["with_context"]


def with_context(winner: Any, args: argparse.Namespace, result: Any, settings: Any,
                 graph: Any, topology: Any) -> Any:
    """``plan -o``'s winner with the ``replan`` object a later ``replan`` reuses (issue 48):
    the first search's best LLM layouts and prices, its training settings, the model and
    cluster as given. The winner unchanged when it is not an LLM plan. O(rows)."""
    from shardplan.planner._replan import CONTEXT_KEY, context_of_search

    if getattr(winner, "parallel", None) is None:
        return winner
    dims = graph.meta.get("transformer") if isinstance(graph.meta, dict) else None
    is_file = os.path.exists(args.model) and args.model.endswith(".json")
    ctx = context_of_search(
        result.ranked, global_batch=int(result.global_batch), settings=settings,
        topology=topology, model=os.path.abspath(args.model) if is_file else args.model,
        model_is_file=is_file, batch_size=None if is_file else args.batch_size,
        seq_len=dims.get("seq") if isinstance(dims, dict) else args.seq_len,
        cluster=os.path.abspath(args.cluster) if os.path.exists(args.cluster)
        else args.cluster, gpus=args.gpus, memory_limit=args.memory_limit)
    return replace(winner, meta={**winner.meta, CONTEXT_KEY: ctx.to_dict()})
