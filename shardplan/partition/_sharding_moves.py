"""Single-node moves: a pass over the nodes evaluating each node's move to every component by
its cost delta, chunks of the visiting order at once, with a lower-bound screen from
:data:`_SCREEN_K` components on (:func:`_node_pass`). See
:mod:`shardplan.partition._sharding_search`."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from shardplan.partition._sharding_problem import Problem

__all__ = []


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
