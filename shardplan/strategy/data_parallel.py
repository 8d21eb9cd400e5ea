"""``strategy`` algorithm ``data-parallel``: split every layer's batch dimension over all
devices, nothing else (the paper's baseline, section IV).

Where the batch does not divide (or the cutoff forbids the full split) the largest allowed
batch split is taken. Layers without a batch dimension in their space (none of ours) stay
whole. The objective is the chosen cost model's value of this strategy, status ``feasible``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardplan.ir import Graph, Topology
from shardplan.registry import Progress, Result, register
from shardplan.strategy._baseline import run_baseline
from shardplan.strategy._choice import data_parallel_split

__all__ = ["data_parallel", "data_parallel_split"]


@register("strategy", "data-parallel")
def data_parallel(graph: Graph, topology: Topology, *, options: Mapping[str, Any], seed: int,
                  time_limit: float | None, progress: Progress | None = None) -> Result:
    """Data parallelism as a PaSE strategy. Options: ``devices``, ``cost_model``,
    ``cutoff``, ``memory_limit``. O(sum_v K_v d_v) after the tables."""
    return run_baseline("data-parallel", graph, topology, options, seed, data_parallel_split)
