"""The sharding cost of paper 000 (section 2.1): weight imbalance plus cross-edge cost.

A partition of the nodes into k components C_1..C_k, component i placed on device p(i), costs

    sum_i (W_i - mean(W))^2  +  sum over edges (u, v) with comp(u) != comp(v) of
                                M[p(comp(u)), p(comp(v))]

with ``W_i`` the summed node ``weight`` of C_i and ``M`` the topology's ``cost`` matrix
(:attr:`Topology.cost_matrix`, its latency when absent). The paper writes the first term as a
"variance" but its formula is garbled in the text (``sum_i (sum_{v in C_k} w_k - W)^2``); we
read it as the **sum of squared deviations, not divided by k**, which is what the formula shows
once the indices are repaired. Each directed edge is counted once, from its source's device to
its destination's (the paper's ``|A_ij| M_ij`` over ordered pairs i != j).

A plan made by the sharding partitioners is k stages of one device each (stage i runs on
``(p(i),)``); :func:`sharding` evaluates any plan whose stages use one device each.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Plan, Topology
from shardplan.objectives import Evaluation, objective

__all__ = ["SHARDING_OBJECTIVE", "component_weights", "cross_edge_cost", "plan_components",
           "sharding_cost", "sharding_terms", "weight_imbalance"]

#: The objective name sharding plans record.
SHARDING_OBJECTIVE = "sharding_cost"


def component_weights(assignment: np.ndarray, weight: np.ndarray, k: int) -> np.ndarray:
    """Summed node weight of each of the ``k`` components. O(n)."""
    return np.bincount(np.asarray(assignment, dtype=np.int64), weights=weight, minlength=k)[:k]


def weight_imbalance(component_weight: np.ndarray) -> float:
    """``sum_i (W_i - mean W)^2``: the paper's "variance of weights", not divided by k. O(k)."""
    w = np.asarray(component_weight, dtype=np.float64)
    if w.size == 0:
        return 0.0
    return float(np.sum((w - w.mean()) ** 2))


def cross_edge_cost(assignment: np.ndarray, placement: np.ndarray, src: np.ndarray,
                    dst: np.ndarray, cost_matrix: np.ndarray) -> float:
    """``sum`` of ``M[p(comp(u)), p(comp(v))]`` over edges whose ends lie in different
    components. Vectorised, O(m). ``placement[i]`` is component i's device."""
    a = np.asarray(assignment, dtype=np.int64)
    p = np.asarray(placement, dtype=np.int64)
    cu, cv = a[src], a[dst]
    cut = cu != cv
    if not np.any(cut):
        return 0.0
    return float(np.sum(cost_matrix[p[cu[cut]], p[cv[cut]]]))


def sharding_terms(assignment: np.ndarray, placement: np.ndarray, weight: np.ndarray,
                   src: np.ndarray, dst: np.ndarray,
                   cost_matrix: np.ndarray) -> tuple[float, float]:
    """``(weight imbalance, cross-edge cost)`` of a partition; k is ``len(placement)``."""
    k = len(placement)
    imbalance = weight_imbalance(component_weights(assignment, weight, k))
    return imbalance, cross_edge_cost(assignment, placement, src, dst, cost_matrix)


def sharding_cost(assignment: np.ndarray, placement: np.ndarray, graph: Graph,
                  topology: Topology) -> float:
    """The sharding cost of section 2.1 for node -> component ``assignment`` (values
    ``0..k-1``) and component -> device ``placement`` (k distinct devices).

    Parameters
    ----------
    assignment : array of int, shape (n,)
    placement : array of int, shape (k,)
    graph, topology
        Node weights are ``graph.weight``; M is ``topology.cost_matrix``.

    Returns
    -------
    float
        ``sum_i (W_i - mean W)^2 + cross-edge cost`` (the imbalance is not divided by k).

    Notes
    -----
    O(n + m), vectorised. Empty components count with weight 0.
    """
    imb, cut = sharding_terms(assignment, placement, graph.weight, graph.src, graph.dst,
                              topology.cost_matrix)
    return imb + cut


def plan_components(plan: Plan, graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """``(assignment, placement)`` of a plan of single-device stages.

    Raises
    ------
    ShardplanError
        A stage with more than one device (the sharding cost places a component on one
        device).
    """
    for s, st in enumerate(plan.stages):
        if len(st.devices) != 1:
            raise ShardplanError(f"the sharding cost needs one device per stage; stage {s} "
                                 f"has {len(st.devices)}")
    placement = np.array([st.devices[0] for st in plan.stages], dtype=np.int64)
    return plan.assignment(graph.num_nodes), placement


@objective("sharding")
def sharding(plan: Plan, graph: Graph, topology: Topology, **options: Any) -> Evaluation:
    """Evaluate the sharding cost of ``plan`` (one device per stage; k = number of stages).

    Details: ``weight_imbalance``, ``cross_edge_cost``, ``component_weights``.
    """
    if options:
        raise ShardplanError(f"the sharding objective takes no options, got "
                             f"{sorted(options)[0]!r}")
    assignment, placement = plan_components(plan, graph)
    k = len(placement)
    w = component_weights(assignment, graph.weight, k)
    imb = weight_imbalance(w)
    cut = cross_edge_cost(assignment, placement, graph.src, graph.dst, topology.cost_matrix)
    details: Mapping[str, Any] = {"weight_imbalance": imb, "cross_edge_cost": cut,
                                  "component_weights": w.tolist()}
    return SHARDING_OBJECTIVE, imb + cut, details
