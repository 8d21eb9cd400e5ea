"""``uniform``: equal operator counts along a topological order (a baseline for Parmesan).

The graph's topological order (:attr:`Graph.topological_order`) is cut into S contiguous runs
whose sizes differ by at most one (position i goes to stage ``i * S // n``). Every prefix of a
topological order is a fronted subgraph, so the stages are convex and pipelined in order.
Default shape: S = D stages of one replica; ``stages``/``replicas`` as for ``parmesan``.
O(n + m) plus the plan's evaluation.
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
    shape_candidates,
)
from shardplan.registry import Progress, Result, register, take_options

__all__ = ["baseline_shape", "uniform_partition"]

DEFAULTS: dict[str, Any] = {"stages": None, "replicas": None, **SETTING_DEFAULTS}


def baseline_shape(options: Mapping[str, Any], graph: Graph,
                   topology: Topology) -> tuple[int, int]:
    """(S, R) of a baseline without its own search: the user's, else S = min(D, n), R = 1."""
    if options.get("stages") is None and options.get("replicas") is None:
        return min(topology.num_devices, graph.num_nodes), 1
    return shape_candidates(options, topology.num_devices, graph.num_nodes)[0]


@register("partition", "uniform")
def uniform_partition(graph: Graph, topology: Topology, *, options: Mapping[str, Any],
                      seed: int, time_limit: float | None,
                      progress: Progress | None = None) -> Result:
    """Equal operator counts per stage along a topological order (deterministic)."""
    deadline = Deadline(time_limit)
    opts = take_options("uniform", options, DEFAULTS)
    settings, view = pipeline_settings(opts, graph)
    s, r = baseline_shape(opts, graph, topology)
    n = graph.num_nodes
    a = np.empty(n, dtype=np.int64)
    a[graph.topological_order] = np.arange(n) * s // n
    return build_plan(graph, topology, algorithm="uniform", assignment=a, num_replicas=r,
                      settings=settings, options=opts, seed=seed, deadline=deadline,
                      status="feasible", view=view)
