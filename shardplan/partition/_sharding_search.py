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
  sizes are kept incrementally (and recomputed exactly after each pass). A pass evaluates
  chunks of its visiting order together and moves the first node of a chunk that moves (the
  moves of one node at a time, without a Python step per node), and from
  :data:`_SCREEN_K` components on it evaluates the k deltas only of the nodes whose lower
  bound of them, O(degree), admits a move (:func:`_node_pass`);
- the placement of components on slots (the paper's "greedy assignment", recomputed by the
  paper after every trial move) is kept fixed during a pass over the nodes and improved
  between passes: greedy construction, then best-improvement swaps of two components and moves
  of a component to a free slot, all deltas of a round in one O(k^2 D) matrix product on small
  instances, kept up to date on large ones (:class:`_SlotCosts`; with every slot used, the
  swap table itself, :class:`_SwapTable`: O(k * changed rows) a round);
- when no single move helps, the best exchanges of two nodes of different components
  (Kernighan-Lin's move; every pair evaluated at once, O(n^2) vectorised, graphs up to
  :data:`SWAP_MAX_NODES` nodes): in a balanced partition every single move unbalances.

A restart ends at a local optimum: no single-node move, placement swap or node exchange
lowers the objective (or at ``max_iterations`` passes, or at the deadline).
"""

from __future__ import annotations

import functools
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

    @functools.cached_property
    def symmetric(self) -> bool:
        """Whether ``cost`` is symmetric (computed once: O(D^2))."""
        return bool(np.array_equal(self.cost, self.cost.T))

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

    def __init__(self, a: sp.csr_matrix, cost: np.ndarray, placement: np.ndarray,
                 symmetric: bool | None = None) -> None:
        self.a, self.a_t = a, a.T.tocsr()
        self.s = (a + self.a_t).tocoo()
        self.cost = cost
        self.symmetric = (bool(np.array_equal(cost, cost.T)) if symmetric is None
                          else symmetric)
        self.reset(placement)

    def reset(self, placement: np.ndarray) -> None:
        m, p = self.cost, placement
        rows = m[p, :]
        # M symmetric: M[:, p]^T is M[p, :], the same numbers without the column gather.
        cols = rows if self.symmetric else m[:, p].T
        self.g = np.asarray(self.a @ cols + self.a_t @ rows)

    def move(self, c: int, old: int, new: int) -> None:
        m, g = self.cost, self.g
        lo, hi = self.a_t.indptr[c], self.a_t.indptr[c + 1]  # i with A[i, c] > 0
        if hi > lo:
            g[self.a_t.indices[lo:hi]] += self.a_t.data[lo:hi, None] * (m[:, new] - m[:, old])
        lo, hi = self.a.indptr[c], self.a.indptr[c + 1]  # i with A[c, i] > 0
        if hi > lo:
            g[self.a.indices[lo:hi]] += self.a.data[lo:hi, None] * (m[new, :] - m[old, :])

    def deltas(self, placement: np.ndarray, moves: bool = True
               ) -> tuple[np.ndarray, np.ndarray | None]:
        """``(swap (k, k), move (k, D))`` as :func:`slot_swap_deltas` returns them (``move``
        None without ``moves``)."""
        p = placement
        f = self.g[:, p]
        diag = np.diag(f).copy()
        swap = f + f.T
        swap -= diag[:, None]
        swap -= diag[None, :]
        r, c, w = self.s.row, self.s.col, self.s.data
        if w.size:  # the i-j edges stay cut: put back what f counted as if the partner stayed
            np.add.at(swap, (r, c), w * (self.cost[p[r], p[c]] + self.cost[p[c], p[r]]))
        move = self.g - diag[:, None] if moves else None
        return swap, move


class _SwapTable:
    """The swap deltas of :class:`_SlotCosts` (entry ``(i, j)``: swap the slots of i and j;
    ``inf`` on the diagonal and between slots of different labels) kept as a (k, k) table
    with the minimum of every row (first column on ties), for placements without free
    slots.

    Swapping i and j changes the slot costs of their neighbours only (:meth:`_SlotCosts.move`)
    and the slots of i and j, so only the rows and columns of R = {i, j} and their
    neighbours change: they are recomputed by the formula of :meth:`_SlotCosts.deltas`
    (the same floating-point operations in the same order, so the same numbers), a row
    outside R compares its minimum with its new entries in R's columns, and only a row
    whose minimum was in one of them is scanned again. O(|R| k + dirty rows * k) a round
    instead of O(k^2); the best swap is the first minimum in row-major order, as
    ``argmin`` over the full table takes it."""

    def __init__(self, costs: _SlotCosts, placement: np.ndarray,
                 lp: np.ndarray | None) -> None:
        self.costs = costs
        self.p = placement  # the caller's array, updated in place by it
        self.nbr = costs.s.tocsr()
        self.other = None if lp is None else lp[:, None] != lp[None, :]
        self.k = placement.size
        self.full()

    def full(self) -> None:
        swap, _ = self.costs.deltas(self.p, moves=False)
        if self.other is not None:
            swap[self.other] = np.inf
        np.fill_diagonal(swap, np.inf)
        self.t = swap
        self.arg = np.argmin(swap, axis=1)
        self.low = swap[np.arange(self.k), self.arg]

    def best(self) -> tuple[int, int, float]:
        i = int(np.argmin(self.low))
        return i, int(self.arg[i]), float(self.low[i])

    def _corr(self, r: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The neighbours of the components ``r`` (as (position in r, neighbour)) and what
        the edges between them put back: ``w (M[p_x, p_y] + M[p_y, p_x])``."""
        s, m, p = self.nbr, self.costs.cost, self.p
        length = s.indptr[r + 1] - s.indptr[r]
        idx = np.arange(int(length.sum())) + np.repeat(s.indptr[r] - (np.cumsum(length)
                                                                      - length), length)
        pos = np.repeat(np.arange(r.size), length)
        y = s.indices[idx]
        x = r[pos]
        return pos, y, s.data[idx] * (m[p[x], p[y]] + m[p[y], p[x]])

    def update(self, r: np.ndarray) -> None:
        """Recompute after the slot costs and slots of ``r`` (sorted, unique) changed."""
        g, p, t, k = self.costs.g, self.p, self.t, self.k
        d = g[np.arange(k), p]
        g_r = g[r][:, p]  # f[x, y] for x in r
        g_c = g[:, p[r]]  # f[y, x] for x in r
        rows = g_r + g_c.T
        rows -= d[r][:, None]
        rows -= d[None, :]
        cols = g_c + g_r.T
        cols -= d[:, None]
        cols -= d[r][None, :]
        pos, y, w = self._corr(r)
        if w.size:  # each (x, y) once: the neighbour lists have no repeats
            rows[pos, y] += w
            cols[y, pos] += w
        if self.other is not None:
            rows[self.other[r]] = np.inf
            cols[self.other[:, r]] = np.inf
        t[r, :] = rows
        t[:, r] = cols
        t[r, r] = np.inf
        # Row minima: R's rows afresh; the others against their new entries in R's columns.
        in_r = np.zeros(k, dtype=bool)
        in_r[r] = True
        dirty = in_r | in_r[self.arg]
        rest = np.flatnonzero(~dirty)
        if rest.size:
            sub = cols[rest]  # t[rest][:, r], as just written
            j = np.argmin(sub, axis=1)
            val = sub[np.arange(rest.size), j]
            col = r[j]
            low, arg = self.low[rest], self.arg[rest]
            take = (val < low) | ((val == low) & (col < arg))
            self.low[rest[take]] = val[take]
            self.arg[rest[take]] = col[take]
        redo = np.flatnonzero(dirty)
        self.arg[redo] = np.argmin(t[redo], axis=1)
        self.low[redo] = t[redo, self.arg[redo]]

    def neighbours(self, c: int) -> np.ndarray:
        s = self.nbr
        return s.indices[s.indptr[c]:s.indptr[c + 1]]


#: Rounds after which the kept slot costs are recomputed from scratch (no float drift).
_REFRESH_ROUNDS = 256
#: Up to this k^2 D, a round's deltas are recomputed densely (:func:`slot_swap_deltas`).
_DENSE_WORK = 1 << 25
#: Above the dense regime and without free slots, from this k on the swap deltas are kept
#: in a :class:`_SwapTable` instead of recomputed every round (the same swaps).
_TABLE_MIN_K = 2


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
    costs = None if dense is not None else _SlotCosts(a, problem.cost, placement,
                                                      problem.symmetric)
    if costs is not None and d == k and k >= _TABLE_MIN_K:
        return _table_rounds(costs, placement, None if uniform else label[placement], eps,
                             max_rounds or 4 * k, deadline)
    improved = False
    move: np.ndarray | None
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
            assert move is not None  # with free devices the deltas include moves
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


def _table_rounds(costs: _SlotCosts, placement: np.ndarray, lp: np.ndarray | None,
                  eps: float, max_rounds: int, deadline: float | None
                  ) -> tuple[np.ndarray, bool]:
    """The rounds of :func:`improve_placement` when every slot holds a component (swaps
    only), the swap deltas kept in a :class:`_SwapTable`: the same swaps in the same order,
    O(|R| k) a round instead of O(k^2)."""
    table: _SwapTable | None = None
    improved = False
    for rounds in range(max_rounds):
        if deadline is not None and time.monotonic() >= deadline:
            break
        if table is None:
            table = _SwapTable(costs, placement, lp)
        elif rounds % _REFRESH_ROUNDS == 0:
            costs.reset(placement)
            table.full()
        i, j, best = table.best()
        if best >= -eps:
            break
        pi, pj = int(placement[i]), int(placement[j])
        costs.move(i, pi, pj)
        costs.move(j, pj, pi)
        placement[i], placement[j] = pj, pi
        improved = True
        table.update(np.unique(np.concatenate(([i, j], table.neighbours(i),
                                               table.neighbours(j)))))
    return placement, improved


# ---------------------------------------------------------------------- local search
@dataclass
class _State:
    assignment: np.ndarray
    placement: np.ndarray
    weight: np.ndarray  # per component
    size: np.ndarray  # per component


def _ranges(lo: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The index ranges ``[lo_i, lo_i + length_i)`` concatenated, and where each begins in
    the result (every length at least 1). O(R + total)."""
    ends = np.cumsum(length)
    begins = ends - length
    return np.arange(int(ends[-1])) + np.repeat(lo - begins, length), begins


def _padded(ptr: np.ndarray, nbr: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR lists with a sentinel entry ``n`` put first in every list (so that no list is
    empty and sums over a list start from the sentinel's zero). O(n + m)."""
    xptr = ptr + np.arange(n + 1)
    out = np.full(nbr.size + n, n, dtype=np.int64)
    out[np.arange(nbr.size) + np.repeat(np.arange(n), np.diff(ptr)) + 1] = nbr
    return xptr, out


@dataclass(frozen=True, eq=False)
class _Adjacency:
    """A problem's successor and predecessor lists with a sentinel first in each
    (:func:`_padded`), whether its cost matrix is symmetric, and whether the weights allow
    the pass's screening (none negative). Built once per :func:`local_search`."""

    sptr: np.ndarray
    succ: np.ndarray
    pptr: np.ndarray
    pred: np.ndarray
    symmetric: bool
    nonnegative: bool
    entries: float  # mean list length with the sentinel, successors plus predecessors

    @classmethod
    def of(cls, problem: Problem) -> _Adjacency:
        n = problem.n
        sptr, succ = _padded(problem.succ_ptr, problem.succ, n)
        pptr, pred = _padded(problem.pred_ptr, problem.pred, n)
        return cls(sptr, succ, pptr, pred, problem.symmetric,
                   bool(np.all(problem.weight >= 0)),
                   (succ.size + pred.size) / max(n, 1))


#: Components from which a pass screens nodes by a lower bound of their best move's delta
#: before evaluating all k moves (below, evaluating all of them is as cheap).
_SCREEN_K = 32
#: Node moves evaluated together: at most this many (node, component) entries of summed
#: cost rows at a time, and at most :data:`_CHUNK_MAX` nodes a step.
_CHUNK_ENTRIES, _CHUNK_MIN, _CHUNK_MAX = 1 << 20, 16, 4096


def _node_pass(problem: Problem, st: _State, order: np.ndarray, eps: float,
               deadline: float | None, adj: _Adjacency | None = None,
               screen: bool | None = None) -> tuple[int, bool]:
    """One pass of single-node moves in ``order``: each node moves to the component of the
    most negative cost delta when that is below ``-eps``. Returns (moves, timed_out).

    The same moves as visiting the nodes one by one, vectorised: the deltas of a chunk of
    the order are evaluated together against the current state (as ``(rows, k)`` arrays),
    and the first node of the chunk that moves is moved; the nodes before it saw the same
    state as one-by-one visits would have, and the next chunk starts after it. Moves are
    rare once a partition is near a local optimum, so chunks grow (doubling up to
    :data:`_CHUNK_MAX` nodes) while none moves and shrink after a move. With ``screen``
    (default: k at least :data:`_SCREEN_K`), a node's k deltas are evaluated only when a
    lower bound of them, O(degree) to compute, is below ``-eps`` (it then may move):

        delta_b >= w^2 min_x s_x + 2 w min_x s_x (W_x - T_x)
                   + n_c min_{x != y} M'_xy + (deg - n_c) min(0, min M')
                   + s_c w (w - 2 (W_c - T_c)) - cut_c

    for every b != c (n_c of its deg edges lead into its component c, whose edges cost
    ``cut_c`` now; M' the cost among the placed slots), less a rounding margin. The
    deadline is checked before every chunk. O(sum of (degree + 1) * k) NumPy work for
    the nodes evaluated in full, O(degree + 1) for the screened ones."""
    a = st.assignment
    k = problem.k
    if adj is None:
        adj = _Adjacency.of(problem)
    if screen is None:
        screen = k >= _SCREEN_K
    screen = screen and adj.nonnegative
    p = st.placement
    # zs[x] = M'[:, x] (the costs of a successor in component x, for each component the
    # node may join), zp[x] = M'[x, :] (a predecessor's); row k (the sentinel's) is 0.
    zp = np.zeros((k + 1, k))
    zp[:k] = problem.cost[np.ix_(p, p)]
    if adj.symmetric:
        zs = zp
    else:
        zs = np.zeros((k + 1, k))
        zs[:k] = zp[:k].T
    tgt, scl, mins = problem.target[p], problem.scale[p], problem.min_size[p]
    wts = problem.weight
    a_ext = np.append(a, k)  # the sentinel's component: row k of zs and zp
    sptr, succ, pptr, pred = adj.sptr, adj.succ, adj.pptr, adj.pred
    rows_max = max(1, int(_CHUNK_ENTRIES // max(1.0, k * adj.entries)))
    if screen:
        off = zp[:k] + np.diag(np.full(k, np.inf))
        m_off = float(off.min()) if k > 1 else 0.0
        m_low = min(0.0, float(zp.min()))
        m_abs = float(np.abs(zp).max())
        s_min, s_max = float(scl.min()), float(scl.max())

    def lists(vs: np.ndarray) -> tuple[np.ndarray, ...]:
        ls, lp = sptr[vs + 1] - sptr[vs], pptr[vs + 1] - pptr[vs]
        i_s, b_s = _ranges(sptr[vs], ls)
        i_p, b_p = _ranges(pptr[vs], lp)
        return a_ext[succ[i_s]], b_s, ls, a_ext[pred[i_p]], b_p, lp

    def best_moves(vs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every node's best component and its delta (the state is the pass's now)."""
        cs, b_s, _, cp, b_p, _ = lists(vs)
        cut = np.add.reduceat(zs[cs], b_s, axis=0)
        cut += np.add.reduceat(zp[cp], b_p, axis=0)
        rows = np.arange(vs.size)
        c, w = a[vs], wts[vs]
        dev = st.weight - tgt
        delta = (scl[None, :] * w[:, None]) * (w[:, None] + 2.0 * dev[None, :]) + cut
        delta += (scl[c] * w * (w - 2.0 * dev[c]) - cut[rows, c])[:, None]
        delta[rows, c] = np.inf
        if problem.acyclic:  # from its predecessors' latest component to its successors'
            lo = np.maximum.reduceat(np.where(cp == k, 0, cp), b_p)
            hi = np.minimum(np.minimum.reduceat(cs, b_s), k - 1)
            cols = np.arange(k)[None, :]
            delta[(cols < lo[:, None]) | (cols > hi[:, None])] = np.inf
        b = np.argmin(delta, axis=1)
        return b, delta[rows, b]

    def may_move(vs: np.ndarray) -> np.ndarray:
        """False where no move of the node can have a delta below ``-eps`` (the bound)."""
        cs, b_s, ls, cp, b_p, lp = lists(vs)
        c, w = a[vs], wts[vs]
        cr_s, cr_p = np.repeat(c, ls), np.repeat(c, lp)
        cut_c = np.add.reduceat(zs[cs, cr_s], b_s) + np.add.reduceat(zp[cp, cr_p], b_p)
        n_c = (np.add.reduceat((cs == cr_s).astype(np.int64), b_s)
               + np.add.reduceat((cp == cr_p).astype(np.int64), b_p))
        deg = ls + lp - 2
        dev = st.weight - tgt
        sd_min = float((scl * dev).min())
        bound = (w * w * s_min + 2.0 * w * sd_min + n_c * m_off + (deg - n_c) * m_low
                 + scl[c] * w * (w - 2.0 * dev[c]) - cut_c)
        margin = 1e-9 * (s_max * w * (w + 2.0 * float(np.abs(dev).max())) + deg * m_abs)
        return bound - margin < -eps

    moves, pos, step = 0, 0, _CHUNK_MIN
    total = order.size
    while pos < total:
        if deadline is not None and time.monotonic() >= deadline:
            return moves, True
        vs = order[pos:pos + step]
        c = a[vs]
        ok = st.size[c] > mins[c]
        if screen and ok.any():
            ok[ok] = may_move(vs[ok])
        cand = np.flatnonzero(ok)
        hit = None
        for lo in range(0, cand.size, rows_max):
            sub = cand[lo:lo + rows_max]
            b, val = best_moves(vs[sub])
            h = np.flatnonzero(val < -eps)
            if h.size:
                hit = (int(sub[h[0]]), int(b[h[0]]))
                break
        if hit is None:
            pos += vs.size
            step = min(2 * step, _CHUNK_MAX)
            continue
        j, to = hit
        v = int(vs[j])
        frm = int(a[v])
        w = wts[v]
        a[v] = to
        a_ext[v] = to
        st.weight[frm] -= w
        st.weight[to] += w
        st.size[frm] -= 1
        st.size[to] += 1
        moves += 1
        pos += j + 1
        step = min(max(_CHUNK_MIN, 2 * (j + 1)), _CHUNK_MAX)
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
    O(n^2 + m k) time and O(n^2) memory. With ``acyclic``, only the nodes that may leave
    their component at all (a predecessor's component before theirs or a successor's
    after) enter the pairwise arrays; every other entry is ``inf``.
    """
    n = problem.n
    block, free = _swap_block(problem, assignment, placement, comp_weight)
    if free is None:
        return block
    out = np.full((n, n), np.inf)
    out[np.ix_(free, free)] = block
    return out


def _swap_block(problem: Problem, a: np.ndarray, placement: np.ndarray,
                comp_weight: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`swap_deltas` among the nodes that may be exchanged at all: the block and
    its nodes (None: all of them, the block is the whole array)."""
    n, k = problem.n, problem.k
    mp = problem.cost[np.ix_(placement, placement)]
    src, dst = problem.src, problem.dst
    cnt_out = np.bincount(src * k + a[dst], minlength=n * k).reshape(n, k).astype(np.float64)
    cnt_in = np.bincount(dst * k + a[src], minlength=n * k).reshape(n, k).astype(np.float64)
    c = cnt_out @ mp.T + cnt_in @ mp
    g = c - c[np.arange(n), a][:, None]
    if not problem.acyclic:
        return _pair_deltas(problem, a, placement, comp_weight, mp, g, None, None, None), None
    lo = np.zeros(n, dtype=np.int64)
    hi = np.full(n, k - 1, dtype=np.int64)
    np.maximum.at(lo, dst, a[src])
    np.minimum.at(hi, src, a[dst])
    free = np.flatnonzero((lo < a) | (hi > a))
    if free.size == n:
        return _pair_deltas(problem, a, placement, comp_weight, mp, g, None, lo, hi), None
    if free.size < 2:
        return np.full((free.size, free.size), np.inf), free
    return _pair_deltas(problem, a, placement, comp_weight, mp, g, free, lo, hi), free


def _pair_deltas(problem: Problem, a: np.ndarray, placement: np.ndarray,
                 comp_weight: np.ndarray, mp: np.ndarray, g: np.ndarray,
                 nodes: np.ndarray | None, lo: np.ndarray | None,
                 hi: np.ndarray | None) -> np.ndarray:
    """:func:`swap_deltas` among ``nodes`` (all when None): the same operations, entry for
    entry, on the rows and columns of those nodes only; ``lo``/``hi``: the acyclic
    bounds of every node (None: no constraint)."""
    src, dst = problem.src, problem.dst
    w = problem.weight
    if nodes is None:
        an, gn, wn = a, g, w
        es, ed = src, dst
    else:
        an, gn, wn = a[nodes], g[nodes], w[nodes]
        local = np.full(problem.n, -1, dtype=np.int64)
        local[nodes] = np.arange(nodes.size)
        inside = (local[src] >= 0) & (local[dst] >= 0)
        es, ed = local[src[inside]], local[dst[inside]]
    x = gn[:, an]  # x[v, u] = G[v, comp(u)]
    delta = x + x.T
    dev2 = 2.0 * (comp_weight - problem.target[placement])
    sa = problem.scale[placement][an]
    d = wn[:, None] - wn[None, :]
    term = sa[:, None] * d
    term *= d - dev2[an][:, None]
    delta += term
    np.multiply(sa[None, :], d, out=term)
    d += dev2[an][None, :]
    term *= d
    delta += term
    cut = an[es] != an[ed]
    if np.any(cut):
        s_, d_ = es[cut], ed[cut]
        corr = mp[an[s_], an[d_]] + mp[an[d_], an[s_]]
        np.add.at(delta, (s_, d_), corr)
        np.add.at(delta, (d_, s_), corr)
    bad = an[:, None] == an[None, :]
    if lo is not None and hi is not None:
        # v may take u's component and u v's; neighbours are not exchanged
        ln, hn = (lo, hi) if nodes is None else (lo[nodes], hi[nodes])
        ok = (ln[:, None] <= an[None, :]) & (an[None, :] <= hn[:, None])
        ok &= ok.T
        ok[es, ed] = False
        ok[ed, es] = False
        bad |= ~ok
    np.putmask(delta, bad, np.inf)
    return delta


def _swap_round(problem: Problem, st: _State, eps: float) -> bool:
    """Apply improving exchanges of two nodes of different components (:func:`swap_deltas`);
    False when there is none. Sizes do not change."""
    n, k = problem.n, problem.k
    a = st.assignment
    w = problem.weight
    block, free = _swap_block(problem, a, st.placement, st.weight)
    # Apply a batch: the best exchanges whose deltas do not interact (distinct component
    # pairs, nodes not adjacent to a node already exchanged in this round).
    flat = block.ravel()
    cand = np.flatnonzero(flat < -eps)
    if cand.size == 0:
        return False
    cand = cand[np.argsort(flat[cand], kind="stable")][:4 * k]
    if free is not None:  # positions in the block -> in the (n, n) array, order kept
        row, col = np.divmod(cand, free.size)
        cand = free[row] * n + free[col]
    touched_comp = np.zeros(k, dtype=bool)
    touched_node = np.zeros(n, dtype=bool)
    sp, sc, pp, pc = problem.succ_ptr, problem.succ, problem.pred_ptr, problem.pred
    for pos in cand.tolist():
        v, u = divmod(pos, n)
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
    adj = _Adjacency.of(problem)
    zero = time.monotonic() if clock_zero is None else clock_zero
    trace = [(time.monotonic() - zero, problem.objective(st.assignment, st.placement))]
    passes = 0
    timed_out = False
    settled = False  # improve_placement found no better placement for this assignment
    swap_seconds = 0.0
    while passes < max_iterations:
        if deadline is not None and time.monotonic() >= deadline:
            timed_out = True
            break
        moves, timed_out = _node_pass(problem, st, rng.permutation(problem.n), eps, deadline,
                                      adj)
        passes += 1
        placed = False
        if moves:
            settled = False
        # A placement found settled for this very assignment stays settled: skip the call
        # (it would return the same; a round costs O(k^2) on thousands of devices).
        if optimize_placement and not timed_out and not settled:
            st.placement, placed = improve_placement(problem, st.assignment, st.placement, eps,
                                                     deadline=deadline)
            settled = not placed and (deadline is None or time.monotonic() < deadline)
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
                settled = False
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
                 coarsen: bool = False, ray: str | None = None,
                 begin_by: float | None = None) -> RestartsSummary:
    """Run ``restarts`` restarts on ``workers`` processes (in this process when 1) and keep
    the best by (cost, restart index): the same for any worker count or scheduling when no
    deadline cuts the search short. Restarts not begun by the deadline are dropped; running
    ones stop at their next check (before every chunk of a node pass) and report their best
    state. ``ray``: the restarts run as tasks on that Ray cluster
    (:class:`shardplan._workers.RayExecutor`), their deadline sent as seconds left.
    ``begin_by``: no restart after the first begins later than this (``time.monotonic``;
    a share of the time left, see :mod:`.hierarchical`); skipped restarts make the summary
    ``timed_out``."""
    zero = time.monotonic() if clock_zero is None else clock_zero
    results: list[RestartResult] = []
    skipped = 0
    workers = max(1, min(workers, restarts))
    if workers == 1 and ray is None:
        for r in range(restarts):
            if r > 0 and any(t is not None and time.monotonic() >= t
                             for t in (deadline, begin_by)):
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
                    if begun and begin_by is not None and time.monotonic() >= begin_by:
                        break
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
