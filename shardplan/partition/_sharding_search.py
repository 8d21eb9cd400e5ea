"""The local search shared by the heuristic and hierarchical partitioners (paper 000, 2.3/2.5).

The objective, over a partition of nodes into k components placed on distinct *slots* of a
cost matrix ``M`` (devices, or groups of devices in the hierarchical partitioner), is

    sum_i s[p(i)] * (W_i - T[p(i)])^2  +  sum over cut edges (u, v) of M[p(c(u)), p(c(v))]

with per-slot target weight ``T`` and scale ``s``. With ``T = total / k`` and ``s = 1`` it is the
sharding cost of section 2.1; the hierarchical partitioner uses ``T_g = |g| W / |parent|`` and
``s_g = 1 / |g|`` for a group g of |g| devices, which is the least imbalance the group's devices
can reach once it holds weight W_g (see :mod:`shardplan.partition.hierarchical`).

How it is fast (the paper recomputes the whole objective for every trial move):

- a node's move to each of the k components is evaluated at once by its cost delta in
  O(degree * k) NumPy work: ``w (w - 2 (W_a - T_a))`` for leaving a, ``w (w + 2 (W_b - T_b))``
  for joining b, and the cut change from the components of its neighbours; component weights,
  sizes are kept incrementally (and recomputed exactly after each pass);
- the placement of components on slots (the paper's "greedy assignment", recomputed by the
  paper after every trial move) is kept fixed during a pass over the nodes and improved
  between passes: greedy construction, then best-improvement swaps of two components and moves
  of a component to a free slot, all deltas of a round in one O(k^2 D) matrix product;
- when no single move helps, the best exchanges of two nodes of different components
  (Kernighan-Lin's move; every pair evaluated at once, O(n^2) vectorised, graphs up to
  :data:`SWAP_MAX_NODES` nodes): in a balanced partition every single move unbalances.

A restart ends at a local optimum: no single-node move, placement swap or node exchange
lowers the objective (or at ``max_iterations`` passes, or at the deadline).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from shardplan._rng import make_rng
from shardplan._workers import executor
from shardplan.errors import ShardplanError

__all__ = ["COARSE_NODES_PER_COMPONENT", "STARTS", "SWAP_MAX_NODES", "Problem", "RestartResult",
           "RestartsSummary", "SearchOutcome", "allowed_range", "coarse_levels",
           "default_workers", "greedy_placement", "improve_placement", "initial_assignment",
           "local_search", "make_monotone", "merge_traces", "restart_rng", "run_restart",
           "run_restarts", "search_deadline", "slot_swap_deltas", "swap_deltas"]

STARTS = ("random", "topo", "metis")


@dataclass(frozen=True, eq=False)
class Problem:
    """A sharding-cost instance on local node ids ``0..n-1``.

    Attributes
    ----------
    weight : ndarray (n,)
    src, dst : ndarray (m,)
        Edges (parallel edges count once each).
    succ_ptr, succ, pred_ptr, pred : ndarray
        CSR successor / predecessor lists.
    rank : ndarray (n,)
        A topological rank of every node (for the ``topo`` start).
    level : ndarray (n,)
        Longest-path depth (the ``topo`` start sorts by it, ties at random after restart 0).
    cost : ndarray (D, D)
        M over the slots; diagonal zero.
    k : int
        Components.
    target, scale : ndarray (D,)
        Per slot: target weight T and scale s of the imbalance term.
    min_size : ndarray (D,)
        Per slot: the fewest nodes a component placed there must hold.
    initial_placement : ndarray (k,) or None
        Fixed start placement (hierarchical levels: identity); None: greedy.
    acyclic : bool
        Keep the partition *monotone*: every edge runs from a component to itself or to a
        later one (component ids in order), so the components form a DAG that a pipeline
        runs forward (acyclic DAG partitioning). Every start, move and exchange keeps it;
        see :func:`allowed_range`.
    """

    weight: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    succ_ptr: np.ndarray
    succ: np.ndarray
    pred_ptr: np.ndarray
    pred: np.ndarray
    rank: np.ndarray
    level: np.ndarray
    cost: np.ndarray
    k: int
    target: np.ndarray
    scale: np.ndarray
    min_size: np.ndarray
    initial_placement: np.ndarray | None = None
    acyclic: bool = False

    @property
    def n(self) -> int:
        return int(self.weight.shape[0])

    @classmethod
    def build(cls, weight: np.ndarray, src: np.ndarray, dst: np.ndarray, rank: np.ndarray,
              level: np.ndarray, cost: np.ndarray, k: int, *, target: np.ndarray | None = None,
              scale: np.ndarray | None = None, min_size: np.ndarray | None = None,
              initial_placement: np.ndarray | None = None, acyclic: bool = False) -> Problem:
        """Build CSR lists; default targets ``total / k``, scale 1, min size 1. O(m log m)."""
        n = int(weight.shape[0])
        d = int(cost.shape[0])
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)

        def csr(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            order = np.argsort(a, kind="stable")
            ptr = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(np.bincount(a, minlength=n), out=ptr[1:])
            return ptr, b[order]

        sp, sc = csr(src, dst)
        pp, pc = csr(dst, src)
        total = float(np.sum(weight))
        return cls(
            weight=np.asarray(weight, dtype=np.float64), src=src, dst=dst, succ_ptr=sp,
            succ=sc, pred_ptr=pp, pred=pc, rank=np.asarray(rank, dtype=np.int64),
            level=np.asarray(level, dtype=np.int64), cost=np.asarray(cost, dtype=np.float64),
            k=int(k),
            target=np.full(d, total / k) if target is None else np.asarray(target, np.float64),
            scale=np.ones(d) if scale is None else np.asarray(scale, np.float64),
            min_size=np.ones(d, np.int64) if min_size is None else np.asarray(min_size,
                                                                               np.int64),
            initial_placement=initial_placement, acyclic=bool(acyclic),
        )

    def objective(self, assignment: np.ndarray, placement: np.ndarray) -> float:
        """The objective from scratch, vectorised: O(n + m)."""
        w = np.bincount(assignment, weights=self.weight, minlength=self.k)
        imb = float(np.sum(self.scale[placement] * (w - self.target[placement]) ** 2))
        cu, cv = assignment[self.src], assignment[self.dst]
        cut = cu != cv
        return imb + float(np.sum(self.cost[placement[cu[cut]], placement[cv[cut]]]))

    def is_monotone(self, assignment: np.ndarray) -> bool:
        """Whether every edge runs from a component to itself or a later one. O(m)."""
        return bool(np.all(assignment[self.src] <= assignment[self.dst]))

    def comm_sparse(self, assignment: np.ndarray) -> sp.csr_matrix:
        """:meth:`comm_matrix` as a sparse ``(k, k)`` matrix: O(m), no k^2 memory (a
        partition onto thousands of devices has few pairs of components that talk)."""
        k = self.k
        cu, cv = assignment[self.src], assignment[self.dst]
        cut = cu != cv
        return sp.csr_matrix((np.ones(int(cut.sum())), (cu[cut], cv[cut])), shape=(k, k))

    def comm_matrix(self, assignment: np.ndarray) -> np.ndarray:
        """``A[i, j]`` = edges from component i to component j (i != j; diagonal 0). O(m)."""
        k = self.k
        cu, cv = assignment[self.src], assignment[self.dst]
        a = np.bincount(cu * k + cv, minlength=k * k).reshape(k, k).astype(np.float64)
        np.fill_diagonal(a, 0.0)
        return a


def restart_rng(seed: int, restart: int) -> np.random.Generator:
    """The generator of restart ``restart``: a function of the master seed and the index
    only, so results do not depend on the number of workers or on scheduling."""
    return make_rng(np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed,
                                                                                 restart]))))


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


def _metis(problem: Problem, rng: np.random.Generator,
           placement_slots: np.ndarray) -> np.ndarray:
    import pymetis

    n, k = problem.n, problem.k
    if k == 1:
        return np.zeros(n, dtype=np.int64)
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


# ---------------------------------------------------------------------- placement
def greedy_placement(problem: Problem, comm: np.ndarray | sp.spmatrix) -> np.ndarray:
    """Greedy component -> slot assignment (the paper's "greedy assignment", made precise).

    The component with the most traffic goes to the slot with the cheapest k-1 links; then,
    repeatedly, the unplaced component with the most edges to placed ones goes to the free
    slot that adds the least cross-edge cost, ties to the cheaper-connected slot. Used only
    when all slots are alike (the flat partitioners). ``comm`` is the (k, k) edge count
    matrix, dense or sparse.

    Kept incrementally: the traffic of every component to the placed ones and every slot's
    summed link cost to the placed slots are updated after each placement, and the cost a
    slot adds is summed over the chosen component's placed neighbours only. O(D^2 + k D +
    nnz(comm) D) instead of O(k^2 D): on 4096 devices, seconds instead of hours.
    """
    m = problem.cost
    k, d = problem.k, m.shape[0]
    a = sp.csr_matrix(comm)
    a_t = a.T.tocsr()
    traffic = (a + a_t).tocsr()
    sym = m + m.T
    free = np.ones(d, dtype=bool)
    placement = np.full(k, -1, dtype=np.int64)
    placed = np.zeros(k, dtype=bool)
    first = int(np.argmax(np.asarray(traffic.sum(axis=1)).ravel()))
    if k > 1:
        masked = sym + np.where(np.eye(d, dtype=bool), np.inf, 0.0)
        # The k-1 cheapest links of every slot, summed in ascending order.
        near = np.sort(np.partition(masked, k - 2, axis=1)[:, :k - 1], axis=1)
        placement[first] = int(np.argmin(near.sum(axis=1)))
    else:
        placement[first] = 0
    free[placement[first]] = False
    placed[first] = True
    score = np.zeros(k)  # edges of each component to the placed ones
    tie = np.zeros(d)  # summed link cost of each slot to the placed slots

    def placed_now(c: int) -> None:
        lo, hi = traffic.indptr[c], traffic.indptr[c + 1]
        score[traffic.indices[lo:hi]] += traffic.data[lo:hi]
        tie[:] += sym[:, placement[c]]

    placed_now(first)
    for _ in range(k - 1):
        c = int(np.argmax(np.where(placed, -np.inf, score)))
        # Added cost of c on each free slot f: A[c,j] M[f,p_j] + A[j,c] M[p_j,f] over the
        # placed neighbours j of c.
        add = np.zeros(d)
        for mat, along in ((a, "out"), (a_t, "in")):
            lo, hi = mat.indptr[c], mat.indptr[c + 1]
            js, ws = mat.indices[lo:hi], mat.data[lo:hi]
            keep = placed[js]
            if keep.any():
                pj = placement[js[keep]]
                add += (m[:, pj] @ ws[keep]) if along == "out" else (m[pj, :].T @ ws[keep])
        fr = np.flatnonzero(free)
        best = fr[np.lexsort((fr, tie[fr], add[fr]))[0]]
        placement[c] = best
        free[best] = False
        placed[c] = True
        placed_now(c)
    return placement


def slot_swap_deltas(comm: np.ndarray, cost: np.ndarray,
                     placement: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cross-edge cost change of every swap of two components' slots, and of every move of a
    component to another slot (``(k, k)`` and ``(k, D)``), in O(k^2 D).

    With ``B = M[p][:, p]`` and ``F[i, j] = sum_y A[i,y] B[j,y] + A[y,i] B[y,j]`` (the cost of
    i's edges were it on j's slot), swapping i and j changes the cost by
    ``F[i,j] + F[j,i] - F[i,i] - F[j,j] + (A + A^T)[i,j] (B + B^T)[i,j]``: the last term puts
    back the i-j edges, which F counts as if the partner stayed.
    """
    b = cost[np.ix_(placement, placement)]
    f = comm @ b.T + comm.T @ b
    diag = np.diag(f)
    swap = f + f.T - diag[:, None] - diag[None, :] + (comm + comm.T) * (b + b.T)
    g = comm @ cost[:, placement].T + comm.T @ cost[placement, :]
    move = g - diag[:, None]
    return swap, move


class _SlotCosts:
    """The cost of every component's cut edges on every slot, kept up to date as components
    change slots: ``G[i, x] = sum_y A[i, y] M[x, p_y] + A[y, i] M[p_y, x]`` (component i on
    slot x, the others where they are), shape (k, D).

    Built in O(nnz(A) D) from the sparse edge counts A; a component c moving from slot a
    to slot b changes only the rows of its neighbours, by ``A[i, c] (M[:, b] - M[:, a]) +
    A[c, i] (M[b, :] - M[a, :])``: O(deg(c) D). The swap and move deltas of
    :func:`slot_swap_deltas` then cost O(k^2 + k D) a round instead of O(k^2 D)."""

    def __init__(self, a: sp.csr_matrix, cost: np.ndarray, placement: np.ndarray) -> None:
        self.a, self.a_t = a, a.T.tocsr()
        self.s = (a + self.a_t).tocoo()
        self.cost = cost
        self.reset(placement)

    def reset(self, placement: np.ndarray) -> None:
        m, p = self.cost, placement
        self.g = np.asarray(self.a @ m[:, p].T + self.a_t @ m[p, :])

    def move(self, c: int, old: int, new: int) -> None:
        m, g = self.cost, self.g
        lo, hi = self.a_t.indptr[c], self.a_t.indptr[c + 1]  # i with A[i, c] > 0
        if hi > lo:
            g[self.a_t.indices[lo:hi]] += self.a_t.data[lo:hi, None] * (m[:, new] - m[:, old])
        lo, hi = self.a.indptr[c], self.a.indptr[c + 1]  # i with A[c, i] > 0
        if hi > lo:
            g[self.a.indices[lo:hi]] += self.a.data[lo:hi, None] * (m[new, :] - m[old, :])

    def deltas(self, placement: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(swap (k, k), move (k, D))`` as :func:`slot_swap_deltas` returns them."""
        p = placement
        f = self.g[:, p]
        diag = np.diag(f).copy()
        swap = f + f.T
        swap -= diag[:, None]
        swap -= diag[None, :]
        r, c, w = self.s.row, self.s.col, self.s.data
        if w.size:  # the i-j edges stay cut: put back what f counted as if the partner stayed
            np.add.at(swap, (r, c), w * (self.cost[p[r], p[c]] + self.cost[p[c], p[r]]))
        move = self.g - diag[:, None]
        return swap, move


#: Rounds after which the kept slot costs are recomputed from scratch (no float drift).
_REFRESH_ROUNDS = 256
#: Up to this k^2 D, a round's deltas are recomputed densely (:func:`slot_swap_deltas`).
_DENSE_WORK = 1 << 25


def improve_placement(problem: Problem, assignment: np.ndarray, placement: np.ndarray,
                      eps: float, max_rounds: int | None = None,
                      deadline: float | None = None) -> tuple[np.ndarray, bool]:
    """Best-improvement swaps of two components' slots and moves to free slots, between
    slots of equal target, scale and minimum size, until none lowers the cost, at most
    ``max_rounds`` (default 4k) rounds or until ``deadline`` (``time.monotonic``, checked
    every round). Each round O(k^2 + k D) with the slot costs kept up to date
    (:class:`_SlotCosts`), not recomputed; below ``k^2 D`` = 2^25 the dense O(k^2 D)
    recomputation, which is as cheap there."""
    k = problem.k
    if k < 2:
        return placement, False
    a = problem.comm_sparse(assignment)
    if a.nnz == 0:
        return placement, False
    key = np.stack((problem.target, problem.scale, problem.min_size.astype(np.float64)), 1)
    _, label = np.unique(key, axis=0, return_inverse=True)
    label = label.reshape(-1)
    uniform = bool((label == label[0]).all())
    d = problem.cost.shape[0]
    placement = placement.copy()
    # Small instances recompute the deltas densely each round (cheap there, and the same
    # float sums, so the same choices on exact ties, as before the incremental form).
    dense = problem.comm_matrix(assignment) if k * k * d <= _DENSE_WORK else None
    costs = None if dense is not None else _SlotCosts(a, problem.cost, placement)
    improved = False
    for rounds in range(max_rounds or 4 * k):
        if deadline is not None and time.monotonic() >= deadline:
            break
        if costs is None:
            assert dense is not None  # costs is None exactly when dense is not
            swap, move = slot_swap_deltas(dense, problem.cost, placement)
        else:
            if rounds and rounds % _REFRESH_ROUNDS == 0:
                costs.reset(placement)
            swap, move = costs.deltas(placement)
        lp = label[placement]
        if not uniform:
            swap[lp[:, None] != lp[None, :]] = np.inf
        np.fill_diagonal(swap, np.inf)
        i, j = np.unravel_index(int(np.argmin(swap)), swap.shape)
        best_swap = swap[i, j]
        best_move = np.inf
        if d > k:
            used = np.zeros(d, dtype=bool)
            used[placement] = True
            ok = ~used[None, :] if uniform else (lp[:, None] == label[None, :]) & ~used[None, :]
            move = np.where(ok, move, np.inf)
            mi, mf = np.unravel_index(int(np.argmin(move)), move.shape)
            best_move = move[mi, mf]
        if min(best_swap, best_move) >= -eps:
            break
        if best_swap <= best_move:
            pi, pj = int(placement[i]), int(placement[j])
            if costs is not None:
                costs.move(int(i), pi, pj)
                costs.move(int(j), pj, pi)
            placement[i], placement[j] = pj, pi
        else:
            if costs is not None:
                costs.move(int(mi), int(placement[mi]), int(mf))
            placement[mi] = mf
        improved = True
    return placement, improved


# ---------------------------------------------------------------------- local search
@dataclass
class _State:
    assignment: np.ndarray
    placement: np.ndarray
    weight: np.ndarray  # per component
    size: np.ndarray  # per component


def _node_pass(problem: Problem, st: _State, order: np.ndarray, eps: float,
               deadline: float | None) -> tuple[int, bool]:
    """One pass of single-node moves (best target component per node). Returns (moves,
    timed_out). O(sum of degree * k) NumPy work."""
    a = st.assignment
    mp = problem.cost[np.ix_(st.placement, st.placement)]
    tgt = problem.target[st.placement]
    scl = problem.scale[st.placement]
    mins = problem.min_size[st.placement]
    wts = problem.weight
    sp, sc, pp, pc = problem.succ_ptr, problem.succ, problem.pred_ptr, problem.pred
    moves = 0
    for t, v in enumerate(order.tolist()):
        if deadline is not None and (t & 127) == 0 and time.monotonic() >= deadline:
            return moves, True
        c = int(a[v])
        if st.size[c] <= mins[c]:
            continue
        w = wts[v]
        cs = a[sc[sp[v]:sp[v + 1]]]
        cp = a[pc[pp[v]:pp[v + 1]]]
        cut = mp[:, cs].sum(axis=1) + mp[cp, :].sum(axis=0)
        dev = st.weight - tgt
        delta = scl * w * (w + 2.0 * dev) + cut
        delta += scl[c] * w * (w - 2.0 * dev[c]) - cut[c]
        delta[c] = np.inf
        if problem.acyclic:
            lo = int(cp.max()) if cp.size else 0
            hi = int(cs.min()) if cs.size else problem.k - 1
            delta[:lo] = np.inf
            delta[hi + 1:] = np.inf
        b = int(np.argmin(delta))
        if delta[b] < -eps:
            a[v] = b
            st.weight[c] -= w
            st.weight[b] += w
            st.size[c] -= 1
            st.size[b] += 1
            moves += 1
    return moves, False


#: Largest graph (nodes) on which the pair-swap neighbourhood runs (it builds n x n arrays).
SWAP_MAX_NODES = 1500


def swap_deltas(problem: Problem, assignment: np.ndarray, placement: np.ndarray,
                comp_weight: np.ndarray) -> np.ndarray:
    """Objective change of exchanging every two nodes of different components (``inf`` for
    nodes of the same component): an ``(n, n)`` array.

    All pairs at once, vectorised: with ``G[v, c]`` the cut change of moving v alone to c,
    the exchange of v (in a) and u (in b) changes the cut by ``G[v, b] + G[u, a]`` plus, for
    each edge between them, ``M_ab + M_ba`` (the edge stays cut but changes direction, and
    both single moves counted it as removed), and the imbalance by
    ``s_a d (d - 2 (W_a - T_a)) + s_b d (d + 2 (W_b - T_b))`` with ``d = w_v - w_u``.
    O(n^2 + m k) time and O(n^2) memory.
    """
    n, k = problem.n, problem.k
    a = assignment
    mp = problem.cost[np.ix_(placement, placement)]
    tgt = problem.target[placement]
    scl = problem.scale[placement]
    src, dst = problem.src, problem.dst
    cnt_out = np.bincount(src * k + a[dst], minlength=n * k).reshape(n, k).astype(np.float64)
    cnt_in = np.bincount(dst * k + a[src], minlength=n * k).reshape(n, k).astype(np.float64)
    c = cnt_out @ mp.T + cnt_in @ mp
    g = c - c[np.arange(n), a][:, None]
    x = g[:, a]  # x[v, u] = G[v, comp(u)]
    delta = x + x.T
    dev = comp_weight - tgt
    w = problem.weight
    d = w[:, None] - w[None, :]
    delta += scl[a][:, None] * d * (d - 2.0 * dev[a][:, None])
    delta += scl[a][None, :] * d * (d + 2.0 * dev[a][None, :])
    cut = a[src] != a[dst]
    if np.any(cut):
        s_, d_ = src[cut], dst[cut]
        corr = mp[a[s_], a[d_]] + mp[a[d_], a[s_]]
        np.add.at(delta, (s_, d_), corr)
        np.add.at(delta, (d_, s_), corr)
    delta[a[:, None] == a[None, :]] = np.inf
    if problem.acyclic:  # v may take u's component and u v's; neighbours are not exchanged
        lo = np.zeros(n, dtype=np.int64)
        hi = np.full(n, k - 1, dtype=np.int64)
        np.maximum.at(lo, dst, a[src])
        np.minimum.at(hi, src, a[dst])
        ok = (lo[:, None] <= a[None, :]) & (a[None, :] <= hi[:, None])
        ok &= ok.T
        ok[src, dst] = False
        ok[dst, src] = False
        delta[~ok] = np.inf
    return delta


def _swap_round(problem: Problem, st: _State, eps: float) -> bool:
    """Apply improving exchanges of two nodes of different components (:func:`swap_deltas`);
    False when there is none. Sizes do not change."""
    n, k = problem.n, problem.k
    a = st.assignment
    w = problem.weight
    delta = swap_deltas(problem, a, st.placement, st.weight)
    # Apply a batch: the best exchanges whose deltas do not interact (distinct component
    # pairs, nodes not adjacent to a node already exchanged in this round).
    cand = np.flatnonzero(delta.ravel() < -eps)
    if cand.size == 0:
        return False
    cand = cand[np.argsort(delta.ravel()[cand], kind="stable")][:4 * k]
    touched_comp = np.zeros(k, dtype=bool)
    touched_node = np.zeros(n, dtype=bool)
    sp, sc, pp, pc = problem.succ_ptr, problem.succ, problem.pred_ptr, problem.pred
    for flat in cand.tolist():
        v, u = divmod(flat, n)
        av, au = int(a[v]), int(a[u])
        if touched_comp[av] or touched_comp[au] or touched_node[v] or touched_node[u]:
            continue
        a[v], a[u] = au, av
        st.weight[av] += w[u] - w[v]
        st.weight[au] += w[v] - w[u]
        touched_comp[[av, au]] = True
        for x in (v, u):
            touched_node[x] = True
            touched_node[sc[sp[x]:sp[x + 1]]] = True
            touched_node[pc[pp[x]:pp[x + 1]]] = True
    return True


@dataclass(frozen=True)
class SearchOutcome:
    """A local optimum (or the best state at the deadline) of one restart."""

    assignment: np.ndarray
    placement: np.ndarray
    cost: float
    passes: int
    timed_out: bool
    trace: tuple[tuple[float, float], ...] = ()


def _eps(problem: Problem) -> float:
    w = problem.weight
    scale = float(w.max() * w.sum()) if w.size else 0.0
    return 1e-12 * (scale + float(problem.cost.max(initial=0.0)) + 1.0)


def local_search(problem: Problem, assignment: np.ndarray, placement: np.ndarray,
                 rng: np.random.Generator, *, deadline: float | None = None,
                 max_iterations: int = 1000, optimize_placement: bool = True,
                 swaps: bool = True, clock_zero: float | None = None) -> SearchOutcome:
    """Move-based local search from ``(assignment, placement)`` to a local optimum.

    Each iteration is one pass over the nodes in a random order (single-node moves to the
    best component by cost delta), then placement improvement; when neither improves and
    ``swaps`` (graphs up to :data:`SWAP_MAX_NODES` nodes), the best exchange of two nodes
    (Kernighan-Lin's move, which the paper cites: it escapes the balanced states where every
    single move unbalances). Stops when nothing improves, after ``max_iterations`` passes,
    or at ``deadline`` (``time.monotonic``).
    The trace records ``(seconds since clock_zero, cost)`` after every pass.
    """
    k = problem.k
    st = _State(assignment.copy(), placement.copy(),
                np.bincount(assignment, weights=problem.weight, minlength=k).astype(np.float64),
                np.bincount(assignment, minlength=k))
    eps = _eps(problem)
    zero = time.monotonic() if clock_zero is None else clock_zero
    trace = [(time.monotonic() - zero, problem.objective(st.assignment, st.placement))]
    passes = 0
    timed_out = False
    swap_seconds = 0.0
    while passes < max_iterations:
        if deadline is not None and time.monotonic() >= deadline:
            timed_out = True
            break
        moves, timed_out = _node_pass(problem, st, rng.permutation(problem.n), eps, deadline)
        passes += 1
        placed = False
        if optimize_placement and not timed_out:
            st.placement, placed = improve_placement(problem, st.assignment, st.placement, eps,
                                                     deadline=deadline)
        # Recompute from scratch each pass: no drift in the incremental weights.
        st.weight = np.bincount(st.assignment, weights=problem.weight,
                                minlength=k).astype(np.float64)
        trace.append((time.monotonic() - zero, problem.objective(st.assignment, st.placement)))
        if timed_out:
            break
        if moves == 0 and not placed:
            if not (swaps and problem.n <= SWAP_MAX_NODES):
                break
            # Swap rounds until none improves, then node moves again. A round cannot be
            # interrupted: start one only if the last one's duration fits before the deadline.
            rounds = 0
            while True:
                now = time.monotonic()
                if deadline is not None and now + swap_seconds >= deadline:
                    timed_out = True
                    break
                if not _swap_round(problem, st, eps):
                    break
                swap_seconds = time.monotonic() - now
                rounds += 1
            if rounds:
                trace.append((time.monotonic() - zero,
                              problem.objective(st.assignment, st.placement)))
            if timed_out or rounds == 0:
                break
    return SearchOutcome(st.assignment, st.placement, trace[-1][1], passes, timed_out,
                         tuple(trace))


def _placement_start(problem: Problem, assignment: np.ndarray) -> np.ndarray:
    if problem.initial_placement is not None:
        return np.asarray(problem.initial_placement, dtype=np.int64).copy()
    return greedy_placement(problem, problem.comm_sparse(assignment))


@dataclass(frozen=True)
class RestartResult:
    restart: int
    outcome: SearchOutcome
    start_cost: float


# ---------------------------------------------------------------------- coarse pass
#: Coarsening stops once a level has at most this many nodes per component.
COARSE_NODES_PER_COMPONENT = 3
#: ... or when a level would keep more than this share of its nodes, or after this many.
_COARSE_MIN_SHRINK, _COARSE_MAX_LEVELS = 0.9, 40


def _match(problem: Problem, rng: np.random.Generator, max_weight: float,
           rounds: int = 3) -> tuple[np.ndarray, int]:
    """Heavy-edge matching, vectorised: every node proposes to the neighbour it shares the
    most edges with (ties at random, pairs heavier than ``max_weight`` excluded), mutual
    proposals are matched, ``rounds`` times over the nodes left. Returns the coarse id of
    every node (a matched pair shares one) and the number of coarse nodes. O(m log m)."""
    n, w = problem.n, problem.weight
    u = np.concatenate((problem.src, problem.dst))
    v = np.concatenate((problem.dst, problem.src))
    keep = u != v
    key, count = np.unique(u[keep] * n + v[keep], return_counts=True)
    a, b = key // n, key % n
    score = count + 0.5 * rng.random(count.size)  # counts are integers: noise breaks ties
    allowed = w[a] + w[b] <= max_weight
    mate = np.full(n, -1, dtype=np.int64)
    for _ in range(rounds):
        ok = allowed & (mate[a] < 0) & (mate[b] < 0)
        if not ok.any():
            break
        aa, bb, ss = a[ok], b[ok], score[ok]
        order = np.lexsort((-ss, aa))
        aa, bb = aa[order], bb[order]
        first = np.ones(aa.size, dtype=bool)
        first[1:] = aa[1:] != aa[:-1]
        best = np.full(n, -1, dtype=np.int64)
        best[aa[first]] = bb[first]
        cand = np.flatnonzero(best >= 0)
        mutual = cand[best[best[cand]] == cand]
        mate[mutual] = best[mutual]
    ids = np.arange(n)
    lead = np.flatnonzero((mate < 0) | (ids < mate))
    cmap = np.full(n, -1, dtype=np.int64)
    cmap[lead] = np.arange(lead.size)
    follow = np.flatnonzero(mate > ids)
    cmap[mate[follow]] = cmap[follow]
    return cmap, int(lead.size)


def _coarse_problem(problem: Problem, cmap: np.ndarray, nc: int) -> Problem:
    """The problem on coarse nodes: summed weights, the edges between different coarse nodes
    kept one by one (so the objective of a coarse partition equals that of its projection:
    edges inside a coarse node are never cut), earliest rank and depth of the members,
    minimum size 1."""
    big = np.iinfo(np.int64).max
    rank, level = np.full(nc, big), np.full(nc, big)
    np.minimum.at(rank, cmap, problem.rank)
    np.minimum.at(level, cmap, problem.level)
    cs, cd = cmap[problem.src], cmap[problem.dst]
    cut = cs != cd
    return Problem.build(np.bincount(cmap, weights=problem.weight, minlength=nc), cs[cut],
                         cd[cut], rank, level, problem.cost, problem.k, target=problem.target,
                         scale=problem.scale, min_size=np.ones_like(problem.min_size),
                         initial_placement=problem.initial_placement)


def coarse_levels(problem: Problem, rng: np.random.Generator, deadline: float | None = None
                  ) -> list[tuple[Problem, np.ndarray]]:
    """Successively coarser problems by heavy-edge matching, each with the map from the
    previous level's nodes to its own, until a level has at most
    :data:`COARSE_NODES_PER_COMPONENT` nodes per component (or stops shrinking, or the
    deadline passes). A coarse node weighs at most half the lightest target weight, so the
    coarsest level can still balance. O(m log m) a level."""
    out: list[tuple[Problem, np.ndarray]] = []
    cur = problem
    slots = problem.initial_placement if problem.initial_placement is not None else None
    target = problem.target if slots is None else problem.target[slots]
    max_weight = 0.5 * float(np.min(target[:problem.k])) if problem.k else 0.0
    while cur.n > COARSE_NODES_PER_COMPONENT * cur.k and len(out) < _COARSE_MAX_LEVELS:
        if deadline is not None and time.monotonic() >= deadline:
            break
        cmap, nc = _match(cur, rng, max_weight)
        if nc > _COARSE_MIN_SHRINK * cur.n:
            break
        cur = _coarse_problem(cur, cmap, nc)
        out.append((cur, cmap))
    return out


def _multilevel(problem: Problem, start: str, rng: np.random.Generator, restart: int,
                slots: np.ndarray, deadline: float | None, max_iterations: int,
                clock_zero: float | None, swaps: bool) -> tuple[SearchOutcome, float]:
    """A start on the coarsest level, then the local search on every level from the
    coarsest to the problem itself, each level starting from the partition of the one above
    (minimum sizes repaired where a coarse node held several nodes). Returns the outcome and
    the start's cost."""
    levels = coarse_levels(problem, rng, deadline)
    probs = [problem, *(lv[0] for lv in levels)]
    maps = [lv[1] for lv in levels]
    top = probs[-1]
    a = initial_assignment(top, start, rng, restart, slots)
    p = _placement_start(top, a)
    start_cost = top.objective(a, p)
    trace: list[tuple[float, float]] = []
    passes, timed_out = 0, False
    for i in range(len(probs) - 1, -1, -1):
        if i < len(probs) - 1:
            a = _repair(probs[i], a[maps[i]], p, rng)
        out = local_search(probs[i], a, p, rng, deadline=deadline,
                           max_iterations=max_iterations, clock_zero=clock_zero, swaps=swaps)
        a, p = out.assignment, out.placement
        trace.extend(out.trace)
        passes += out.passes
        timed_out |= out.timed_out
    return SearchOutcome(a, p, out.cost, passes, timed_out, tuple(trace)), start_cost


def run_restart(problem: Problem, start: str, seed: int, restart: int,
                deadline: float | None, max_iterations: int,
                clock_zero: float | None = None, swaps: bool = True,
                coarsen: bool = False) -> RestartResult:
    """One restart: its own generator (seed, restart), a start partition, then local search.

    With ``coarsen`` and a ``random`` or ``topo`` start, the start is made on a coarse
    version of the problem and refined level by level (:func:`_multilevel`): from a random
    partition of the fine graph the local search crawls (every edge is as likely cut as
    not, and single moves unbalance), while on the coarse levels whole clusters move at
    once. The ``metis`` start is a multilevel partition already and skips it, and so does
    an ``acyclic`` problem (contracting an edge can close a cycle among coarse nodes)."""
    rng = restart_rng(seed, restart)
    slots = np.asarray(problem.initial_placement if problem.initial_placement is not None
                       else np.arange(problem.k))
    if coarsen and start != "metis" and not problem.acyclic:
        out, start_cost = _multilevel(problem, start, rng, restart, slots, deadline,
                                      max_iterations, clock_zero, swaps)
        return RestartResult(restart, out, start_cost)
    a0 = initial_assignment(problem, start, rng, restart, slots)
    p0 = _placement_start(problem, a0)
    start_cost = problem.objective(a0, p0)
    out = local_search(problem, a0, p0, rng, deadline=deadline, max_iterations=max_iterations,
                       clock_zero=clock_zero, swaps=swaps)
    return RestartResult(restart, out, start_cost)


def _pooled_restart(problem: Problem, start: str, seed: int, restart: int,
                    deadline: float | None, max_iterations: int, clock_zero: float | None,
                    swaps: bool, coarsen: bool) -> RestartResult | None:
    """A restart in a worker process; None when it begins after the deadline (workers take
    queued restarts that can no longer be cancelled)."""
    if deadline is not None and time.monotonic() >= deadline:
        return None
    return run_restart(problem, start, seed, restart, deadline, max_iterations, clock_zero,
                       swaps, coarsen)


def _remote_restart(problem: Problem, start: str, seed: int, restart: int,
                    seconds_left: float | None, max_iterations: int, since_zero: float,
                    swaps: bool, coarsen: bool) -> RestartResult | None:
    """:func:`_pooled_restart` on a machine whose clock is not the caller's: the deadline
    as seconds left when it was sent, the search's start as seconds before that."""
    now = time.monotonic()
    deadline = None if seconds_left is None else now + seconds_left
    return _pooled_restart(problem, start, seed, restart, deadline, max_iterations,
                           now - since_zero, swaps, coarsen)


@dataclass(frozen=True)
class RestartsSummary:
    best: RestartResult
    results: tuple[RestartResult, ...]
    timed_out: bool
    trace: tuple[tuple[float, float], ...] = field(default=())


def run_restarts(problem: Problem, *, start: str, seed: int, restarts: int, workers: int,
                 deadline: float | None, max_iterations: int,
                 progress: Callable[[str, float, float], None] | None = None,
                 clock_zero: float | None = None, swaps: bool = True,
                 coarsen: bool = False, ray: str | None = None) -> RestartsSummary:
    """Run ``restarts`` restarts on ``workers`` processes (in this process when 1) and keep
    the best by (cost, restart index): the same for any worker count or scheduling when no
    deadline cuts the search short. Restarts not begun by the deadline are dropped; running
    ones stop at their next check (every 128 nodes) and report their best state. ``ray``:
    the restarts run as tasks on that Ray cluster (:class:`shardplan._workers.RayExecutor`),
    their deadline sent as seconds left."""
    zero = time.monotonic() if clock_zero is None else clock_zero
    results: list[RestartResult] = []
    skipped = 0
    workers = max(1, min(workers, restarts))
    if workers == 1 and ray is None:
        for r in range(restarts):
            if r > 0 and deadline is not None and time.monotonic() >= deadline:
                skipped = restarts - r
                break
            results.append(run_restart(problem, start, seed, r, deadline, max_iterations, zero,
                                       swaps, coarsen))
            if progress is not None:
                progress("restarts", len(results), restarts)
    else:
        # At most two restarts per worker are queued at a time: ``--restarts 1000000`` must
        # not create a million futures (and ``wait`` on them costs O(pending) a call).
        with executor(workers, ray=ray) as pool:
            pending: set[Any] = set()
            begun = 0
            while True:
                late = deadline is not None and time.monotonic() >= deadline
                while not late and begun < restarts and len(pending) < 2 * workers:
                    if ray is None:
                        pending.add(pool.submit(_pooled_restart, problem, start, seed, begun,
                                                deadline, max_iterations, zero, swaps,
                                                coarsen))
                    else:  # another machine's clock: times as seconds from now
                        now = time.monotonic()
                        pending.add(pool.submit(
                            _remote_restart, problem, start, seed, begun,
                            None if deadline is None else deadline - now, max_iterations,
                            now - zero, swaps, coarsen))
                    begun += 1
                if not pending:
                    break
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                done, pending = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
                for fut in done:
                    got = fut.result()
                    if got is None:
                        skipped += 1
                        continue
                    results.append(got)
                    if progress is not None:
                        progress("restarts", len(results), restarts)
                if deadline is not None and time.monotonic() >= deadline and pending:
                    for fut in pending:
                        fut.cancel()
                    # Running restarts return within one check interval.
                    for fut in pending:
                        got = None if fut.cancelled() else fut.result()
                        if got is None:
                            skipped += 1
                        else:
                            results.append(got)
                    pending = set()
            skipped += restarts - begun  # never begun: the deadline came first
    if not results:  # the deadline passed before the first restart could begin
        results.append(run_restart(problem, start, seed, 0, time.monotonic(), 0, zero))
    results.sort(key=lambda r: r.restart)
    best = min(results, key=lambda r: (r.outcome.cost, r.restart))
    timed_out = skipped > 0 or any(r.outcome.timed_out for r in results)
    return RestartsSummary(best, tuple(results), timed_out, merge_traces(results))


def merge_traces(results: Sequence[RestartResult]) -> tuple[tuple[float, float], ...]:
    """Best cost so far over time across restarts."""
    pts = sorted(p for r in results for p in r.outcome.trace)
    out: list[tuple[float, float]] = []
    best = np.inf
    for t, c in pts:
        if c < best:
            best = c
            out.append((round(t, 6), float(c)))
    return tuple(out)


def search_deadline(t0: float, time_limit: float | None) -> float | None:
    """The deadline the searches aim at: 95 % of the time limit, leaving the rest for the
    steps that cannot be interrupted (a swap round, building the plan, stopping workers)."""
    return None if time_limit is None else t0 + 0.95 * time_limit


def default_workers() -> int:
    """The cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
