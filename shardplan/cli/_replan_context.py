"""What ``plan -o`` leaves in an LLM plan file for a later ``shardplan replan`` (issue 48,
item 2): the first search's best priced layouts and the inputs it was given
(:class:`~shardplan.planner._replan.ReplanContext`), and that context read back (or made from
the plan alone) for ``replan`` and ``simulate --failures``."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from typing import Any

from shardplan.errors import ShardplanError

__all__ = ["context_for", "with_context"]


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


def context_for(plan: Any, graph: Any | None = None) -> tuple[Any, bool]:
    """``(context, kept)``: the plan file's :class:`ReplanContext` (``kept`` True), or one
    made from the plan alone -- its own layout the only candidate, its settings and global
    batch (``kept`` False)."""
    from shardplan.planner._llm import LLMCandidate
    from shardplan.planner._replan import ReplanContext

    ctx = ReplanContext.of_plan(plan)
    if ctx is not None:
        return ctx, True
    st = plan.settings if graph is None else plan.settings.resolve(graph)
    if st.global_batch is None:
        raise ShardplanError("the plan does not say its global batch: give --global-batch")
    base = replace(st, microbatch_size=None, microbatches=8, schedule="1f1b",
                   gradient_sync="end", recompute="none", sequence_parallel=False)
    own = LLMCandidate(plan.parallel, st, plan.objective.value, 0.0, True)
    return ReplanContext(global_batch=int(st.global_batch), settings=base,
                         candidates=(own,), topology=plan.topology), False
