"""``params``: balanced parameter counts (DeepSpeed's ``partition_method="parameters"``).

DeepSpeed's pipeline module weighs each layer by its trainable parameters and cuts the layer
sequence into S contiguous parts with balanced sums (``ds_utils.partition_balanced``). Here
the layers are the operators in topological order and the cut is the exact min-max
contiguous partition of parameter bytes (the classic linear-partition DP of
:func:`._pipeline_common.sequence_dp`); ties go to the earliest cut. Prefixes of a
topological order are fronted subgraphs, so the stages are convex. Default shape S = D, R = 1.
O(n^2 S).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from shardplan.ir import Graph, Topology
from shardplan.partition._pipeline_common import (
    SETTING_DEFAULTS,
    Deadline,
    build_plan,
    pipeline_settings,
    sequence_dp,
)
from shardplan.partition.uniform import baseline_shape
from shardplan.registry import Progress, Result, register, take_options

__all__ = ["params_partition"]

DEFAULTS: dict[str, Any] = {"stages": None, "replicas": None, **SETTING_DEFAULTS}


@register("partition", "params")
def params_partition(graph: Graph, topology: Topology, *, options: Mapping[str, Any],
                     seed: int, time_limit: float | None,
                     progress: Progress | None = None) -> Result:
    """Contiguous stages of a topological order with balanced parameter bytes."""
    deadline = Deadline(time_limit)
    opts = take_options("params", options, DEFAULTS)
    settings, view = pipeline_settings(opts, graph)
    s, r = baseline_shape(opts, graph, topology)
    order = graph.topological_order
    prefix = np.concatenate(([0.0], np.cumsum(graph.param_bytes[order].astype(np.float64))))

    def cost(i: np.ndarray, j: int, _s: int) -> np.ndarray:
        return prefix[j] - prefix[i]

    found = sequence_dp(cost, graph.num_nodes, s)
    assert found is not None  # None only when a ``check`` stops it; none is given
    _, seg = found
    a = np.empty(graph.num_nodes, dtype=np.int64)
    a[order] = seg
    return build_plan(graph, topology, algorithm="params", assignment=a, num_replicas=r,
                      settings=settings, options=opts, seed=seed, deadline=deadline,
                      status="feasible", view=view)
