"""``pipedream-sequence``: PipeDream's DP on one topological order with one replica count.

A simplified PipeDream kept beside the faithful one (:mod:`.pipedream`, registered as
``pipedream``): it is Parmesan's third start (:mod:`.parmesan`) and a cheap baseline on graphs
too branchy for the antichain DAG. It differs from PipeDream's optimizer in three ways: one
fixed operator order instead of every antichain, one replica count R for every stage, and a
stage time that takes the larger of compute and weight synchronisation where PipeDream's code
adds them.

PipeDream (Narayanan et al., SOSP 2019, section 3.1) partitions a *sequence* of layers: with
``T_l`` a layer's forward + backward time, ``C_i`` the time to send the activations that
cross the cut after layer i, ``W^m_l = 4 (m - 1) |w_l| / (m B)`` the weight synchronisation
of layer l over m replicas,

    T(i -> j, m) = (1 / m) max(sum_l T_l, sum_l W^m_l)
    A(j, m) = min over i < j, m' of max(A(i, m - m'), 2 C_i, T(i + 1 -> j, m')).

Here the layers are the operators in topological order (so the stages are prefixes
differences, convex), ``C_i`` is the deduplicated bytes crossing cut i over the median
bandwidth of the used devices, and -- because shardplan's plans and cost model keep the same
replica count on every stage -- the replication choice is one R for all stages: for each
``S x R = D`` (or the user's S / R) the DP over S stages of R replicas is solved and the
(S, R) with the smallest PipeDream value A is returned, as PipeDream's optimizer would.
Memory is not part of PipeDream's DP; the plan's objective (the shared cost model) shows a
stage that does not fit as ``inf``.

Complexity: the DP is a min-max split of a sequence whose segment cost is monotone in the
segment plus a cost per cut, solved exactly by bisection on the value
(:func:`._pipeline_common.bottleneck_split`, O(n + S log n) per probe, at most 64 probes);
the classic O(n^2 S) table (:func:`._pipeline_common.sequence_dp`) gives the same optimum
(``method="dp"``) and is kept as the reference the tests compare with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardplan.cost import CostModel
from shardplan.ir import Graph, Topology
from shardplan.partition._pipeline_common import (
    SETTING_DEFAULTS,
    Deadline,
    bottleneck_split,
    build_plan,
    pipeline_settings,
    sequence_dp,
    shape_candidates,
    tensor_bytes,
)
from shardplan.registry import Progress, Result, register, take_options

__all__ = ["PipeDreamSequence", "cut_bytes", "pipedream_sequence_partition"]

DEFAULTS: dict[str, Any] = {"stages": None, "replicas": None, **SETTING_DEFAULTS}


def cut_bytes(graph: Graph, order: np.ndarray) -> np.ndarray:
    """Bytes crossing the cut after each position of ``order`` (each tensor once), (n,)."""
    n = graph.num_nodes
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    last = np.full(n, -1, dtype=np.int64)
    if graph.num_edges:
        np.maximum.at(last, graph.src, pos[graph.dst])
    tb = tensor_bytes(graph)
    diff = np.zeros(n + 1)
    has = last > pos
    np.add.at(diff, pos[has], tb[has])
    np.add.at(diff, last[has], -tb[has])
    return np.cumsum(diff)[:n]


@dataclass(frozen=True)
class PipeDreamSequence:
    """PipeDream's DP inputs on a topological order, built once for many (S, R).

    Attributes
    ----------
    order : (n,) topological order; ``work`` and ``params`` its prefix sums of forward +
    backward seconds and parameter bytes; ``comm`` the ``2 C_i`` of the cut after each
    position; ``inv`` the median seconds per byte between the first ``num_devices`` devices.
    """

    order: np.ndarray
    work: np.ndarray
    params: np.ndarray
    comm: np.ndarray
    inv: float

    @classmethod
    def build(cls, graph: Graph, topology: Topology, model: Any,
              num_devices: int) -> PipeDreamSequence:
        """O(n + m + D^2)."""
        order = graph.topological_order
        fwd, bwd = model.node_seconds(int(np.argmax(topology.device_flops)))
        work = np.concatenate(([0.0], np.cumsum((fwd + bwd)[order])))
        params = np.concatenate(([0.0],
                                 np.cumsum(graph.param_bytes[order].astype(np.float64))))
        used = np.arange(num_devices)
        inv = 0.0
        if used.size > 1:
            off = ~np.eye(used.size, dtype=bool)
            inv = float(np.median(model.inverse_bandwidth[np.ix_(used, used)][off]))
        comm = 2.0 * cut_bytes(model.graph, order) * inv  # 2 C_i, after position i
        return cls(order, work, params, comm, inv)

    def solve(self, num_stages: int, num_replicas: int, *,
              check: Callable[[], bool] | None = None,
              method: str = "bisection") -> tuple[float, np.ndarray] | None:
        """PipeDream's value A and the stage of every node for S stages of R replicas, or
        None when ``check()`` says the time is up.

        ``method="bisection"`` (default): :func:`bottleneck_split`, O(64 (n + S log n));
        ``"dp"``: the O(n^2 S) table, the same optimum (the split may differ on ties).
        """
        pt, pw, comm, inv, r = self.work, self.params, self.comm, self.inv, num_replicas
        n = self.order.size
        if method == "dp":
            def cost(i: np.ndarray, j: int, _s: int) -> np.ndarray:
                sync = 4.0 * (r - 1) * (pw[j] - pw[i]) * inv / r
                t = np.maximum(pt[j] - pt[i], sync) / r
                c = np.where(i > 0, comm[np.maximum(i - 1, 0)], 0.0)
                return np.maximum(t, c)

            out = sequence_dp(cost, n, num_stages, check=check)
        elif method == "bisection":
            cut = np.concatenate(([0.0], comm[:n - 1], [0.0])) if n else np.zeros(1)
            out = bottleneck_split([pt, pw], [1.0 / r, 4.0 * (r - 1) * inv / (r * r)], cut,
                                   num_stages, check=check)
        else:
            raise ValueError(f"unknown method {method!r}")
        if out is None:
            return None
        value, seg = out
        a = np.empty(n, dtype=np.int64)
        a[self.order] = seg
        return value, a


@register("partition", "pipedream-sequence")
def pipedream_sequence_partition(graph: Graph, topology: Topology, *,
                                 options: Mapping[str, Any], seed: int,
                                 time_limit: float | None,
                                 progress: Progress | None = None) -> Result:
    """PipeDream's DP on a topological order with one replica count for every stage (see
    the module docstring). Deterministic; O(n + m + D^2) plus O(64 (n + S log n)) per
    (S, R)."""
    deadline = Deadline(time_limit)
    opts = take_options("pipedream-sequence", options, DEFAULTS)
    settings, view = pipeline_settings(opts, graph)
    model = CostModel.from_settings(graph, topology, settings)
    n = graph.num_nodes
    shapes = shape_candidates(opts, topology.num_devices, n)
    sequence = PipeDreamSequence.build(graph, topology, model,
                                       max(s * r for s, r in shapes))
    best = None
    tried = []
    for idx, (s, r) in enumerate(shapes):
        if progress is not None:
            progress("pipedream-sequence (S, R)", idx, len(shapes))
        if idx and deadline.expired():
            break
        out = sequence.solve(s, r, check=deadline.expired if idx else None)
        if out is None:
            break
        value, a = out
        tried.append({"stages": s, "replicas": r, "pipedream_value": value})
        if best is None or value < best[0]:
            best = (value, s, r, a)
    assert best is not None
    _, s, r, a = best
    return build_plan(graph, topology, algorithm="pipedream-sequence", assignment=a,
                      num_replicas=r,
                      settings=settings, options=opts, seed=seed, deadline=deadline,
                      status="feasible", stats={"shapes": tried}, model=model, view=view)
