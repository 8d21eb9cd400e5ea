"""Boundary descent: moving whole blocks of operators between neighbouring stages.

Parmesan's refinement (:mod:`._pipeline_refine`, paper 002 section 4.3) moves one boundary
operator per step, so its ``I`` steps move at most ``I`` operators: on a graph of 10^5
operators the refined plan is the DP's plan. Here a monotone split is read as a contiguous
split of a topological order -- the operators sorted by (stage, position in the graph's
topological order), which is a topological order because stages never decrease along an
edge -- and the ``S - 1`` boundaries of that order move instead, by ``step`` operators at a
time, with ``step`` halving from ``n / (2 S)`` down to 1 (to ``n / 4096`` on larger graphs:
finer moves change little there and are refinement's). Every contiguous split of a
topological order is monotone (each stage a difference of two nested fronted subgraphs), so
every move keeps the plan valid; no stage is emptied.

A move shifts a run of consecutive boundaries ``i..j`` together: the stage before the run
gives ``step`` operators to (or takes them from) the stage after it and the stages between
keep their size. It is kept when it lowers, lexicographically and strictly, the stage times
sorted from the largest down (then the bytes between stages), priced by the one stage-time
model (:func:`shardplan.cost.stage_times`), so the plan's value -- the first of them -- never
rises and is the one ``shardplan cost`` reports. The min-max objective has plateaus: moving
one boundary often hands the largest time to the neighbour, and two stages tied at the
largest need two moves; shifting runs and ranking by the sorted times cross them. At each
step size the runs are swept until no move improves (coordinate descent). Not from the
papers: the paper's refinement is the single-operator move; this is what lets refinement act
at scale (issue 17: at 10^5 operators onto 4096 devices it lowers the plan's value where
single moves do nothing).

Complexity: O(log(n / S)) step sizes, each sweep S (S - 1) evaluations (every run of
boundaries, both ways) of O(n + m + S^2 R) (the stage-time model); a sweep repeats while it
improves.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from shardplan.cost import CostModel, stage_times

__all__ = ["descend"]


def descend(model: CostModel, assignment: np.ndarray, devices: np.ndarray, view: str, *,
            check: Callable[[], bool] | None = None, tol: float = 1e-12
            ) -> tuple[np.ndarray, dict[str, float]]:
    """Coordinate descent on the stage boundaries of ``assignment`` (see the module).

    Parameters
    ----------
    model : CostModel
        The plan's cost model (graph at the micro-batch size, settings).
    assignment : ndarray of int, shape (n,)
        A monotone split into ``S = max + 1`` non-empty stages.
    devices : ndarray of int, shape (S, R)
        The placement the stage times are priced on.
    view : str
        The objective's view (:data:`shardplan.cost.VIEWS`).
    check : callable, optional
        Returns True when the time is up (called before every evaluation); the best split
        found so far is returned.
    tol : float
        Relative difference under which two stage times count as equal (with all equal, a
        move must save at least half a byte between stages).

    Returns
    -------
    (ndarray, dict)
        The descended assignment and statistics ``descent_start``, ``descent_end``,
        ``descent_moves``, ``descent_evaluated``.
    """
    a0 = np.asarray(assignment, dtype=np.int64)
    k = int(a0.max()) + 1
    n = a0.size
    graph = model.graph
    pos = np.empty(n, dtype=np.int64)
    pos[graph.topological_order] = np.arange(n)
    order = np.lexsort((pos, a0))  # by stage, then topological position
    counts = np.bincount(a0, minlength=k)
    bounds = np.cumsum(counts)[:-1]  # bounds[i]: first position of stage i + 1

    def split(b: np.ndarray) -> np.ndarray:
        a = np.empty(n, dtype=np.int64)
        a[order] = np.searchsorted(b, np.arange(n), side="right")
        return a

    def key(b: np.ndarray) -> tuple[np.ndarray, float]:
        st = stage_times(model, split(b), devices, num_stages=k, order=range(k))
        return -np.sort(-st.stage_seconds(view)), float(st.traffic_bytes.sum())

    def better(new: tuple[np.ndarray, float], cur: tuple[np.ndarray, float]) -> bool:
        for x, y in zip(new[0].tolist(), cur[0].tolist(), strict=True):
            if x < y * (1 - tol):
                return True
            if x > y * (1 + tol):
                return False
        return new[1] < cur[1] - 0.5

    cur = key(bounds)
    start = float(cur[0][0])
    moves = evaluated = 0
    step = max(1, n // (2 * k))
    # boundaries i..j shift together: the stages between keep their size, so the one
    # before i grows (or shrinks) by what the one after j gives up -- a single move that
    # crosses the plateaus of the largest stage time where one boundary alone cannot
    ranges = [(i, j) for i in range(k - 1) for j in range(i, k - 1)]
    stopped = False
    finest = max(1, n >> 12)  # blocks of n / 4096: finer moves are refinement's
    while step >= finest and k > 1 and not stopped:
        improved = True
        while improved and not stopped:
            improved = False
            for i, j in ranges:
                lo = int(bounds[i - 1]) + 1 if i else 1
                hi = int(bounds[j + 1]) - 1 if j < k - 2 else n - 1
                for d in (-step, step):
                    if not (lo <= int(bounds[i]) + d and int(bounds[j]) + d <= hi):
                        continue
                    if check is not None and check():
                        stopped = True
                        break
                    cand = bounds.copy()
                    cand[i:j + 1] += d
                    new = key(cand)
                    evaluated += 1
                    if better(new, cur):
                        bounds, cur, improved = cand, new, True
                        moves += 1
                if stopped:
                    break
        step //= 2
    return split(bounds), {"descent_start": start, "descent_end": float(cur[0][0]),
                           "descent_moves": moves, "descent_evaluated": evaluated}
