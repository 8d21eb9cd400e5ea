"""Where a restart begins: a random, topological or METIS assignment (``random``, ``topo``,
``metis``), cut into runs of a topological order when the search is acyclic, and balanced
before the search starts (:func:`initial_assignment`)."""

from __future__ import annotations

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.partition._sharding_acyclic import make_monotone
from shardplan.partition._sharding_placement import _placement_start
from shardplan.partition._sharding_problem import STARTS, Problem

__all__ = ["cut_points", "initial_assignment"]


# ---------------------------------------------------------------------- starts
def _repair(problem: Problem, assignment: np.ndarray, placement_slots: np.ndarray,
            rng: np.random.Generator) -> np.ndarray:
    """Move nodes from components above their minimum size into those below it."""
    need = problem.min_size[placement_slots]
    size = np.bincount(assignment, minlength=problem.k)
    for c in np.flatnonzero(size < need).tolist():
        while size[c] < need[c]:
            donors = np.flatnonzero(size > need)
            donor = int(donors[np.argmax(size[donors] - need[donors])])
            members = np.flatnonzero(assignment == donor)
            v = int(members[rng.integers(members.size)])
            assignment[v] = c
            size[donor] -= 1
            size[c] += 1
    return assignment


def initial_assignment(problem: Problem, start: str, rng: np.random.Generator, restart: int,
                       placement_slots: np.ndarray) -> np.ndarray:
    """A start partition honouring the minimum sizes.

    ``random``: uniform component per node (the paper's start); ``topo``: the nodes sorted by
    depth (ties by id at restart 0, at random later), cut into k consecutive runs of about the
    target weights; ``metis``: pymetis k-way partition of the undirected graph, node weights
    as integers, target fractions from the targets, METIS seed from the restart's generator.
    O(n log n) (random, topo); METIS time for ``metis``.
    """
    n, k = problem.n, problem.k
    if start not in STARTS:
        raise ShardplanError(f"start must be one of {', '.join(STARTS)}, got {start!r}")
    if problem.acyclic:
        return _monotone_start(problem, start, rng, restart, placement_slots)
    if start == "random":
        a = rng.integers(k, size=n)
    elif start == "topo":
        key = problem.rank if restart == 0 else rng.random(n)
        a = _runs(problem, np.lexsort((key, problem.level)), placement_slots)
    else:
        a = _metis(problem, rng, placement_slots)
    return _repair(problem, np.asarray(a, dtype=np.int64), placement_slots, rng)


def cut_points(weights: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where to cut a sequence of node ``weights`` into ``len(targets)`` runs whose weights
    are in the proportions of ``targets``: the k - 1 bounds (run i is ``[b[i-1], b[i])``)
    after the last node whose prefix weight stays within each cut (``floor``), and at the
    prefix weight nearest it (``nearest``: one node later where that is strictly closer).
    O(n + k log n).

    Examples
    --------
    >>> f, c = cut_points(np.array([0., 7., 6., 6., 6.]), np.ones(4))  # cuts at 6.25, 12.5, 18.75
    >>> f.tolist(), c.tolist()
    ([1, 2, 3], [2, 3, 4])
    """
    cum = np.cumsum(weights)
    cuts = np.cumsum(targets)[:-1] * (cum[-1] / max(float(targets.sum()), 1e-300))
    floor = np.searchsorted(cum, cuts, side="right")  # cum[b - 1] <= cut < cum[b]
    n = len(cum)
    below = np.where(floor > 0, cum[np.maximum(floor - 1, 0)], 0.0)
    above = cum[np.minimum(floor, n - 1)]
    nearest = np.where((floor < n) & (above - cuts < cuts - below), floor + 1, floor)
    return floor, nearest


def _runs(problem: Problem, order: np.ndarray, placement_slots: np.ndarray) -> np.ndarray:
    """``order`` cut into k consecutive runs of about the target weights, each at least its
    minimum size; run i is component i. Each cut goes after the last node whose prefix
    weight stays within its target, or at the prefix weight nearest the target (a heavy
    node after a light run joins it when that is closer); of the two, the cheaper partition.
    O(n log n) plus two evaluations of the objective."""
    floor, nearest = cut_points(problem.weight[order], problem.target[placement_slots])
    a = _cut(problem, order, placement_slots, floor)
    if np.array_equal(nearest, floor):
        return a
    b = _cut(problem, order, placement_slots, nearest)
    if np.array_equal(a, b):
        return a
    cost_a = problem.objective(a, _placement_start(problem, a))
    cost_b = problem.objective(b, _placement_start(problem, b))
    return b if cost_b < cost_a else a


def _cut(problem: Problem, order: np.ndarray, placement_slots: np.ndarray,
         bounds: np.ndarray) -> np.ndarray:
    """``order`` cut at ``bounds`` (run i is ``[bounds[i-1], bounds[i])``), the bounds moved
    so that every run has at least its minimum size. O(n log n)."""
    n = problem.n
    mins = problem.min_size[placement_slots]
    lo = np.cumsum(mins)[:-1]
    hi = n - np.cumsum(mins[::-1])[::-1][1:]
    bounds = np.minimum(np.maximum(bounds, lo), hi).tolist()
    k = len(mins)
    for i in range(k - 1):  # forward: each run at least its minimum after the previous
        prev = bounds[i - 1] if i else 0
        bounds[i] = max(bounds[i], prev + int(mins[i]))
    for i in range(k - 2, -1, -1):  # backward: room for the runs after it
        nxt = bounds[i + 1] if i + 1 < k - 1 else n
        bounds[i] = min(bounds[i], nxt - int(mins[i + 1]))
    out = np.empty(n, dtype=np.int64)
    out[order] = np.searchsorted(np.asarray(bounds, dtype=np.int64), np.arange(n),
                                 side="right")
    return out


def _random_topological_order(problem: Problem, rng: np.random.Generator) -> np.ndarray:
    """A topological order drawn at random (Kahn's algorithm, ready nodes taken by random
    priority). O((n + m) log n)."""
    import heapq

    n = problem.n
    indeg = np.diff(problem.pred_ptr).astype(np.int64)
    prio = rng.random(n)
    ready = [(float(prio[v]), v) for v in np.flatnonzero(indeg == 0).tolist()]
    heapq.heapify(ready)
    out = []
    sp_, sc = problem.succ_ptr, problem.succ
    while ready:
        _, v = heapq.heappop(ready)
        out.append(v)
        for u in sc[sp_[v]:sp_[v + 1]].tolist():
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(ready, (float(prio[u]), u))
    return np.asarray(out, dtype=np.int64)


def _monotone_start(problem: Problem, start: str, rng: np.random.Generator, restart: int,
                    placement_slots: np.ndarray) -> np.ndarray:
    """A monotone start honouring the minimum sizes. ``topo``: as without the constraint
    (runs of the depth order are monotone); ``random``: runs of a random topological order;
    ``metis``: the METIS partition made monotone (:func:`make_monotone`), unless that leaves
    a component below its minimum size or costs more than the ``topo`` start, which is
    taken then. O(n log n + m) besides METIS."""
    n = problem.n
    key = problem.rank if restart == 0 else rng.random(n)
    topo = _runs(problem, np.lexsort((key, problem.level)), placement_slots)
    if start == "topo":
        return topo
    if start == "random":
        return _runs(problem, _random_topological_order(problem, rng), placement_slots)
    a = make_monotone(problem, _metis(problem, rng, placement_slots))
    size = np.bincount(a, minlength=problem.k)
    if np.any(size < problem.min_size[placement_slots]):
        return topo
    pa = _placement_start(problem, a)
    pt = _placement_start(problem, topo)
    return a if problem.objective(a, pa) <= problem.objective(topo, pt) else topo


def _metis(problem: Problem, rng: np.random.Generator,
           placement_slots: np.ndarray) -> np.ndarray:
    import pymetis

    n, k = problem.n, problem.k
    if k == 1:
        return np.zeros(n, dtype=np.int64)
    if n == 0:  # METIS would print an error of its own on stdout; the seed's draw is kept
        rng.integers(2**31 - 1)  # so the later restarts draw what they always drew
        return np.zeros(0, dtype=np.int64)
    u = np.concatenate((problem.src, problem.dst))
    v = np.concatenate((problem.dst, problem.src))
    keep = u != v
    u, v = u[keep], v[keep]
    pair = np.unique(u * n + v)
    u, v = pair // n, pair % n
    xadj = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(u, minlength=n), out=xadj[1:])
    wmax = float(problem.weight.max()) if n else 0.0
    vw = (np.rint(problem.weight / wmax * 1000) if wmax > 0 else np.ones(n)).astype(np.int64)
    tgt = problem.target[placement_slots]
    frac = (tgt / tgt.sum()).tolist() if tgt.sum() > 0 else None
    opts = pymetis.Options(seed=int(rng.integers(2**31 - 1)))
    adjacency = pymetis.CSRAdjacency(xadj.tolist(), v.tolist())
    _, parts = pymetis.part_graph(k, adjacency, vweights=vw.tolist(), tpwgts=frac,
                                  options=opts)
    return np.asarray(parts, dtype=np.int64)
