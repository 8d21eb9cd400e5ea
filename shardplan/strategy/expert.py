"""``strategy`` algorithm ``expert``: the hand-made strategies the paper compares with
(section IV): "one weird trick" for CNNs (data parallel convolutions, parameter parallel fully
connected layers; Krizhevsky 2014) and Megatron/Mesh-TensorFlow style for transformers
(batch split ``p / m`` ways everywhere, and ``m`` ways the attention heads, the feed-forward
hidden dimension (column- then row-split), the vocabulary of the embedding and of the output
projection).

Which dimension plays which role is the graph's business: a node's space may carry
``"expert": {dim: role}`` with role ``all`` (split over every device), ``data`` (``p / m``)
or ``model`` (``m``), where ``m`` is the option ``model_parallel`` (default: the graph's
``expert_model_parallel`` meta field, else 8), capped at p. The benchmark generators write
these roles; a node without them is data parallel. The RNNLM's expert strategy in the paper
(GNMT's data + pipeline parallelism) cannot be written as a configuration; its generator marks
the LSTM's layer dimension ``model`` (one layer per device group, the pipeline's placement) and
the vocabulary dimensions ``model``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Topology
from shardplan.registry import Progress, Result, register, take_options
from shardplan.strategy._baseline import DEFAULTS, run_baseline
from shardplan.strategy.data_parallel import data_parallel_split
from shardplan.strategy.spaces import Space

__all__ = ["expert", "expert_split"]


def expert_split(space: Space, devices: int, model_parallel: int) -> np.ndarray:
    """Wanted factors of one node from its ``expert`` roles."""
    roles = space.attrs.get("expert")
    if not roles:
        return data_parallel_split(space, devices)
    m = max(1, min(int(model_parallel), devices))
    want = np.ones(len(space.dims), dtype=np.int64)
    for dim, role in roles.items():
        if dim not in space.dims:
            continue
        want[space.index(dim)] = {"all": devices, "data": max(1, devices // m),
                                  "model": m}.get(role, 1)
    return want


@register("strategy", "expert")
def expert(graph: Graph, topology: Topology, *, options: Mapping[str, Any], seed: int,
           time_limit: float | None, progress: Progress | None = None) -> Result:
    """Expert-designed strategy. Options: those of ``data-parallel`` plus
    ``model_parallel`` (m). O(sum_v K_v d_v) after the tables."""
    opts = take_options("expert", options, {**DEFAULTS, "model_parallel": None})
    mp = opts.pop("model_parallel")
    mp = int(graph.meta.get("expert_model_parallel", 8)) if mp is None else mp
    if isinstance(mp, bool) or not isinstance(mp, int) or mp < 1:
        raise ShardplanError(f"model_parallel must be a positive integer, got {mp!r}")
    rest = {k: v for k, v in options.items() if k != "model_parallel"}
    return run_baseline("expert", graph, topology, rest, seed,
                        lambda s, p: expert_split(s, p, mp), record=options)
