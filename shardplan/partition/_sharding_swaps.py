"""Node exchanges (Kernighan-Lin's move): when no single move helps, the best exchanges of two
nodes of different components, every pair evaluated at once (O(n^2) vectorised, graphs up to
:data:`SWAP_MAX_NODES` nodes); in a balanced partition every single move unbalances."""

from __future__ import annotations

import numpy as np

from shardplan.partition._sharding_moves import _State
from shardplan.partition._sharding_problem import Problem

__all__ = ["SWAP_MAX_NODES", "swap_deltas"]


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
