"""Placement of components on slots: the greedy construction, and best-improvement swaps of two
components and moves of a component to a free slot between passes over the nodes (all deltas
of a round in one O(k^2 D) matrix product on small instances, kept up to date on large ones:
:class:`_SlotCosts`, :class:`_SwapTable`). See :mod:`shardplan.partition._sharding_search`."""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from shardplan.partition._sharding_problem import Problem

__all__ = ["greedy_placement", "improve_placement", "slot_swap_deltas"]


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


def _placement_start(problem: Problem, assignment: np.ndarray) -> np.ndarray:
    if problem.initial_placement is not None:
        return np.asarray(problem.initial_placement, dtype=np.int64).copy()
    return greedy_placement(problem, problem.comm_sparse(assignment))


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
