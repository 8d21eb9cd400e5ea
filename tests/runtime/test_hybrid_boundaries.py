"""A hybrid's stage boundaries in batch shards (issue 33): where a stage's layout splits the
tensor it sends by the batch alone, device ``i`` sends its shard to device ``i`` of the next
stage (no gather), which reads it in that layout and re-shards it only where its own layout
differs, and a model output so split stays split (each device's loss reads its shard);
training still equals one process (losses to 1e-6, parameters to 1e-5 relative).

One launch of 2 processes: each hybrid has 2 stages on one pipeline rank of 2 devices
(interleaved 1F1B), so every boundary lies between the two stages' meshes of the same
devices, and the sends go through the pipeline runtime as between ranks.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("torch")

from test_strategy_run import (  # noqa: E402
    _config,
    check_equal,
    graph_of,
    random_plan,
    reference,
)

from shardplan.runtime import contiguous_plan, train_many  # noqa: E402
from shardplan.strategy import hybrid_plan  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.multiprocess]


def _mixed(key: str, seed: int) -> object:
    """A hybrid whose first stage splits every layer by the batch and whose second runs
    random configurations: the boundary arrives in batch shards and is re-sharded to
    whatever the second stage's first layers want."""
    graph = graph_of(key)
    base = contiguous_plan(graph, 2, 2)
    dp = hybrid_plan(base, graph, algorithm="data-parallel", options={"cutoff": 1})
    rnd = random_plan(graph, 2, seed, base)
    second = {str(v) for v in base.stages[1].nodes}
    strategy = {v: (rnd.strategy[v] if v in second else c) for v, c in dp.strategy.items()}
    return _config(replace(dp, strategy=strategy), graph, key, schedule="interleaved-1f1b")


def test_batch_sharded_boundaries_train_like_one_process() -> None:
    """Data parallelism inside both stages of GPT-2 (dropout on, tied weights on both
    stages) and of the transformer: every boundary travels in shards; a random second
    stage behind a data-parallel first re-shards what it receives. Each equals one process
    running the same stages, and the run says which values crossed in shards."""
    def hybrid(key: str) -> object:
        graph = graph_of(key)
        plan = hybrid_plan(contiguous_plan(graph, 2, 2), graph, algorithm="data-parallel",
                           options={"cutoff": 1})
        return _config(plan, graph, key, schedule="interleaved-1f1b")

    import numpy as np

    keys = ["gpt2", "transformer", "gpt2"]
    cfgs = [hybrid("gpt2"), hybrid("transformer"), _mixed("gpt2", 5)]
    for cfg in cfgs:
        assert cfg.kind == "pipeline" and cfg.world_size == 2 and len(cfg.stages) == 2
    results = train_many(cfgs)
    for cfg, got in zip(cfgs, results, strict=True):
        check_equal(cfg, got, reference(cfg))
        assert got.boundaries, cfg.model  # the data-parallel first stage sends shards
    for got, key in zip(results[:2], keys, strict=False):  # and the loss reads its shard
        g = graph_of(key)
        sinks = set(range(g.num_nodes)) - set(np.asarray(g.src).tolist())
        logits = max(sinks, key=lambda v: float(g.output_bytes[v]))  # the model's output
        assert g.names[logits] in got.boundaries, key
