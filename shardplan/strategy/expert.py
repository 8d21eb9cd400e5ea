"""``strategy`` algorithm ``expert``: the hand-made strategies the paper compares with
(section IV): "one weird trick" for CNNs (data parallel convolutions, parameter parallel fully
connected layers; Krizhevsky 2014) and Megatron/Mesh-TensorFlow style for transformers
(batch split ``p / m`` ways everywhere, and ``m`` ways the attention heads, the feed-forward
hidden dimension (column- then row-split), the vocabulary of the embedding and of the output
projection).

Which dimension plays which role is the graph's business: a node's space may carry
``"expert": {dim: role}`` with role ``all`` (split over every device), ``data`` (``p / m``)
or ``model`` (``m``). The benchmark generators write these roles; a node without them is data
parallel. The RNNLM's expert strategy in the paper (GNMT's data + pipeline parallelism)
cannot be written as a configuration; its generator marks the LSTM's layer dimension
``model`` (one layer per device group, the pipeline's placement) and the vocabulary
dimensions ``model``.

The model-parallel degree ``m``: the option ``model_parallel`` when given; else, as the
paper's expert would tune it for each device count (its Figure 6 puts the expert strategies
near data parallelism at small p), every Megatron-style degree that divides p (1, 2, 4, ...,
p) is costed and the cheapest kept; the plan's ``meta`` says which (``choice``) and what each
cost (``candidates``). A fixed m of 8 capped at p would make the Transformer purely model
parallel at p <= 8, 2.4-3.2x worse than data parallelism.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Topology
from shardplan.registry import Progress, Result, register, take_options
from shardplan.strategy._baseline import DEFAULTS, run_baseline
from shardplan.strategy._choice import data_parallel_split, devices_of
from shardplan.strategy.spaces import Space

__all__ = ["expert", "expert_split", "megatron_degrees"]


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


def megatron_degrees(devices: int) -> list[int]:
    """The model-parallel degrees the expert tries on ``devices``: the powers of two that
    divide it (and ``devices`` itself). O(log p)."""
    out = [m for m in (2**i for i in range(int(devices).bit_length())) if devices % m == 0]
    return sorted(set(out) | {int(devices)})


@register("strategy", "expert")
def expert(graph: Graph, topology: Topology, *, options: Mapping[str, Any], seed: int,
           time_limit: float | None, progress: Progress | None = None) -> Result:
    """Expert-designed strategy. Options: those of ``data-parallel`` plus
    ``model_parallel`` (m; default: the cheapest of :func:`megatron_degrees`).
    O(sum_v K_v d_v) per degree after the tables."""
    opts = take_options("expert", options, {**DEFAULTS, "model_parallel": None})
    mp = opts.pop("model_parallel")
    if mp is not None and (isinstance(mp, bool) or not isinstance(mp, int) or mp < 1):
        raise ShardplanError(f"model_parallel must be a positive integer, got {mp!r}")
    rest = {k: v for k, v in options.items() if k != "model_parallel"}
    if mp is not None:
        return run_baseline("expert", graph, topology, rest, seed,
                            lambda s, p: expert_split(s, p, mp), record=options)
    devices = devices_of(topology, opts["devices"])
    degrees = megatron_degrees(devices)
    cands = {m: (lambda s, p, m=m: expert_split(s, p, m)) for m in degrees}
    return run_baseline("expert", graph, topology, rest, seed, record=options,
                        candidates=cands)
