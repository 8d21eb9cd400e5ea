"""The acyclic repair: assignments whose components follow a topological order of the graph
(component of every edge's head no earlier than its tail's), so the components pipeline;
:func:`make_monotone` repairs any assignment into one, :func:`allowed_range` is where a node
may move without breaking it."""

from __future__ import annotations

import numpy as np

from shardplan.partition._sharding_problem import Problem

__all__ = ["allowed_range", "make_monotone"]


def make_monotone(problem: Problem, assignment: np.ndarray) -> np.ndarray:
    """The nearest monotone partition in one sweep: components renumbered by the mean
    topological rank of their nodes, then, in topological order, every node moved forward
    to the latest component of its predecessors when that is later than its own. O(n + m)
    after sorting."""
    k = problem.k
    a = np.asarray(assignment, dtype=np.int64)
    rank = problem.rank.astype(np.float64)
    count = np.bincount(a, minlength=k)
    mean = np.bincount(a, weights=rank, minlength=k) / np.maximum(count, 1)
    mean[count == 0] = np.inf
    relabel = np.empty(k, dtype=np.int64)
    relabel[np.argsort(mean, kind="stable")] = np.arange(k)
    out = relabel[a]
    pp, pc = problem.pred_ptr, problem.pred
    for v in np.argsort(problem.rank, kind="stable").tolist():
        lo, hi = pp[v], pp[v + 1]
        if hi > lo:
            m = int(out[pc[lo:hi]].max())
            if m > out[v]:
                out[v] = m
    return out


def allowed_range(problem: Problem, assignment: np.ndarray, v: int) -> tuple[int, int]:
    """The components node ``v`` may join and keep the partition monotone: from the latest
    component of its predecessors to the earliest of its successors (both inclusive; ``0``
    and ``k - 1`` without them). O(degree)."""
    pp, pc, sp_, sc = problem.pred_ptr, problem.pred, problem.succ_ptr, problem.succ
    preds = assignment[pc[pp[v]:pp[v + 1]]]
    succs = assignment[sc[sp_[v]:sp_[v + 1]]]
    lo = int(preds.max()) if preds.size else 0
    hi = int(succs.min()) if succs.size else problem.k - 1
    return lo, hi
