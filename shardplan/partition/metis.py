"""``metis``: METIS k-way partitioning repaired into convex pipeline stages (a baseline).

pymetis (``part_graph``, k-way, seeded) splits the undirected version of the graph into S
parts, vertex weights the operators' forward + backward seconds and edge weights the bytes
(both scaled to integers >= 1). METIS knows nothing of direction, so its parts are usually
not convex. Repair (ours): parts are ordered by the mean topological rank of their
operators, each operator gets its part's position, and then in topological order an operator
is pushed to the latest stage of its predecessors when that is later
(:func:`._pipeline_common.monotone_from_labels`); stages left empty are dropped, so the plan
may have fewer than S stages. Default shape S = D, R = 1. O(METIS + n + m).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from shardplan.cost import CostModel
from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Topology
from shardplan.partition._pipeline_common import (
    SETTING_DEFAULTS,
    Deadline,
    build_plan,
    monotone_from_labels,
    pipeline_settings,
)
from shardplan.partition.uniform import baseline_shape
from shardplan.registry import Progress, Result, register, take_options

__all__ = ["metis_partition"]

DEFAULTS: dict[str, Any] = {"stages": None, "replicas": None, **SETTING_DEFAULTS}


def _scale(x: np.ndarray, top: float = 1e6) -> np.ndarray:
    m = float(x.max()) if x.size else 0.0
    if m <= 0:
        return np.ones(x.shape, dtype=np.int64)
    return np.maximum(1, np.rint(x / m * top)).astype(np.int64)


@register("partition", "metis")
def metis_partition(graph: Graph, topology: Topology, *, options: Mapping[str, Any],
                    seed: int, time_limit: float | None,
                    progress: Progress | None = None) -> Result:
    """pymetis k-way partition, then the convex repair of the module docstring."""
    deadline = Deadline(time_limit)
    opts = take_options("metis", options, DEFAULTS)
    settings, view = pipeline_settings(opts, graph)
    s, r = baseline_shape(opts, graph, topology)
    n = graph.num_nodes
    model = CostModel.from_settings(graph, topology, settings)
    fwd, bwd = model.node_seconds(0)
    if s == 1 or n <= 1:
        labels = np.zeros(n, dtype=np.int64)
    else:
        try:
            import pymetis
        except ImportError:  # pragma: no cover - pymetis is a dependency
            raise ShardplanError("the metis partitioner needs pymetis (pip install pymetis)") \
                from None
        u = np.concatenate([graph.src, graph.dst])
        v = np.concatenate([graph.dst, graph.src])
        w = np.concatenate([graph.edge_bytes, graph.edge_bytes]).astype(np.float64)
        key = u * n + v
        uniq, inv = np.unique(key, return_inverse=True)
        wsum = np.bincount(inv, weights=w)
        uu, vv = uniq // n, uniq % n
        xadj = np.concatenate(([0], np.cumsum(np.bincount(uu, minlength=n))))
        adj = pymetis.CSRAdjacency(xadj.tolist(), vv.tolist())
        res = pymetis.part_graph(s, adj, vweights=_scale(fwd + bwd).tolist(),
                                 eweights=_scale(wsum).tolist(),
                                 options=pymetis.Options(seed=int(seed)))
        parts = np.asarray(res.vertex_part, dtype=np.int64)
        rank = graph.topological_rank.astype(np.float64)
        count = np.bincount(parts, minlength=s)
        mean = np.bincount(parts, weights=rank, minlength=s) / np.maximum(count, 1)
        position = np.empty(s, dtype=np.int64)
        position[np.argsort(mean, kind="stable")] = np.arange(s)
        labels = position[parts]
    a = monotone_from_labels(graph, labels)
    return build_plan(graph, topology, algorithm="metis", assignment=a, num_replicas=r,
                      settings=settings, options=opts, seed=seed, deadline=deadline,
                      status="feasible", model=model, view=view)
