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

import numpy as np

from shardplan._rng import make_rng
from shardplan._workers import process_pool
from shardplan.errors import ShardplanError

__all__ = ["STARTS", "SWAP_MAX_NODES", "Problem", "RestartResult", "RestartsSummary",
           "SearchOutcome", "default_workers", "greedy_placement", "improve_placement",
           "initial_assignment", "local_search", "merge_traces", "restart_rng", "run_restart",
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

    @property
    def n(self) -> int:
        return int(self.weight.shape[0])

    @classmethod
    def build(cls, weight: np.ndarray, src: np.ndarray, dst: np.ndarray, rank: np.ndarray,
              level: np.ndarray, cost: np.ndarray, k: int, *, target: np.ndarray | None = None,
              scale: np.ndarray | None = None, min_size: np.ndarray | None = None,
              initial_placement: np.ndarray | None = None) -> Problem:
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
            initial_placement=initial_placement,
        )

    def objective(self, assignment: np.ndarray, placement: np.ndarray) -> float:
        """The objective from scratch, vectorised: O(n + m)."""
        w = np.bincount(assignment, weights=self.weight, minlength=self.k)
        imb = float(np.sum(self.scale[placement] * (w - self.target[placement]) ** 2))
        cu, cv = assignment[self.src], assignment[self.dst]
        cut = cu != cv
        return imb + float(np.sum(self.cost[placement[cu[cut]], placement[cv[cut]]]))

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
    mins = problem.min_size[placement_slots]
    if start == "random":
        a = rng.integers(k, size=n)
    elif start == "topo":
        key = problem.rank if restart == 0 else rng.random(n)
        order = np.lexsort((key, problem.level))
        cum = np.cumsum(problem.weight[order])
        tgt = problem.target[placement_slots]
        bounds = np.searchsorted(cum, np.cumsum(tgt)[:-1] * (cum[-1] / max(tgt.sum(), 1e-300)),
                                 side="right")
        # Each run gets at least its minimum size.
        lo = np.cumsum(mins)[:-1]
        hi = n - np.cumsum(mins[::-1])[::-1][1:]
        bounds = np.minimum(np.maximum(bounds, lo), hi)
        bounds = np.maximum.accumulate(bounds)
        a = np.empty(n, dtype=np.int64)
        a[order] = np.searchsorted(bounds, np.arange(n), side="right")
    elif start == "metis":
        a = _metis(problem, rng, placement_slots)
    else:
        raise ShardplanError(f"start must be one of {', '.join(STARTS)}, got {start!r}")
    return _repair(problem, np.asarray(a, dtype=np.int64), placement_slots, rng)


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
def greedy_placement(problem: Problem, comm: np.ndarray) -> np.ndarray:
    """Greedy component -> slot assignment (the paper's "greedy assignment", made precise).

    The component with the most traffic goes to the slot with the cheapest k-1 links; then,
    repeatedly, the unplaced component with the most edges to placed ones goes to the free
    slot that adds the least cross-edge cost, ties to the cheaper-connected slot. Used only
    when all slots are alike (the flat partitioners). O(k^2 D).
    """
    m = problem.cost
    k, d = problem.k, m.shape[0]
    traffic = comm + comm.T
    sym = m + m.T
    free = np.ones(d, dtype=bool)
    placement = np.full(k, -1, dtype=np.int64)
    placed = np.zeros(k, dtype=bool)
    first = int(np.argmax(traffic.sum(axis=1)))
    near = np.sort(sym + np.where(np.eye(d, dtype=bool), np.inf, 0.0), axis=1)[:, :k - 1]
    placement[first] = int(np.argmin(near.sum(axis=1))) if k > 1 else 0
    free[placement[first]] = False
    placed[first] = True
    for _ in range(k - 1):
        cand = np.flatnonzero(~placed)
        score = traffic[np.ix_(cand, np.flatnonzero(placed))].sum(axis=1)
        c = int(cand[np.argmax(score)])
        pc = placement[placed]
        # Added cost of c on each free slot f: A[c,j] M[f,p_j] + A[j,c] M[p_j,f].
        add = m[:, pc] @ comm[c, placed] + m[pc, :].T @ comm[placed, c]
        tie = sym[:, pc].sum(axis=1)
        fr = np.flatnonzero(free)
        best = fr[np.lexsort((fr, tie[fr], add[fr]))[0]]
        placement[c] = best
        free[best] = False
        placed[c] = True
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


def improve_placement(problem: Problem, assignment: np.ndarray, placement: np.ndarray,
                      eps: float, max_rounds: int | None = None) -> tuple[np.ndarray, bool]:
    """Best-improvement swaps of two components' slots and moves to free slots, between
    slots of equal target, scale and minimum size, until none lowers the cost. Each round
    O(k^2 D); at most ``max_rounds`` (default 4k) rounds."""
    k = problem.k
    if k < 2:
        return placement, False
    comm = problem.comm_matrix(assignment)
    if not comm.any():
        return placement, False
    key = np.stack((problem.target, problem.scale, problem.min_size.astype(np.float64)), 1)
    same = (key[:, None, :] == key[None, :, :]).all(axis=2)  # slot x slot
    d = problem.cost.shape[0]
    placement = placement.copy()
    improved = False
    for _ in range(max_rounds or 4 * k):
        swap, move = slot_swap_deltas(comm, problem.cost, placement)
        swap = np.where(same[np.ix_(placement, placement)], swap, np.inf)
        np.fill_diagonal(swap, np.inf)
        used = np.zeros(d, dtype=bool)
        used[placement] = True
        move = np.where(same[placement] & ~used[None, :], move, np.inf)
        i, j = np.unravel_index(int(np.argmin(swap)), swap.shape)
        mi, mf = np.unravel_index(int(np.argmin(move)), move.shape) if d > k else (0, 0)
        best_swap = swap[i, j]
        best_move = move[mi, mf] if d > k else np.inf
        if min(best_swap, best_move) >= -eps:
            break
        if best_swap <= best_move:
            placement[i], placement[j] = placement[j], placement[i]
        else:
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
            st.placement, placed = improve_placement(problem, st.assignment, st.placement, eps)
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
    return greedy_placement(problem, problem.comm_matrix(assignment))


@dataclass(frozen=True)
class RestartResult:
    restart: int
    outcome: SearchOutcome
    start_cost: float


def run_restart(problem: Problem, start: str, seed: int, restart: int,
                deadline: float | None, max_iterations: int,
                clock_zero: float | None = None, swaps: bool = True) -> RestartResult:
    """One restart: its own generator (seed, restart), a start partition, then local search."""
    rng = restart_rng(seed, restart)
    slots = (problem.initial_placement if problem.initial_placement is not None
             else np.arange(problem.k))
    a0 = initial_assignment(problem, start, rng, restart, np.asarray(slots))
    p0 = _placement_start(problem, a0)
    start_cost = problem.objective(a0, p0)
    out = local_search(problem, a0, p0, rng, deadline=deadline, max_iterations=max_iterations,
                       clock_zero=clock_zero, swaps=swaps)
    return RestartResult(restart, out, start_cost)


def _pooled_restart(problem: Problem, start: str, seed: int, restart: int,
                    deadline: float | None, max_iterations: int, clock_zero: float | None,
                    swaps: bool) -> RestartResult | None:
    """A restart in a worker process; None when it begins after the deadline (workers take
    queued restarts that can no longer be cancelled)."""
    if deadline is not None and time.monotonic() >= deadline:
        return None
    return run_restart(problem, start, seed, restart, deadline, max_iterations, clock_zero,
                       swaps)


@dataclass(frozen=True)
class RestartsSummary:
    best: RestartResult
    results: tuple[RestartResult, ...]
    timed_out: bool
    trace: tuple[tuple[float, float], ...] = field(default=())


def run_restarts(problem: Problem, *, start: str, seed: int, restarts: int, workers: int,
                 deadline: float | None, max_iterations: int,
                 progress: Callable[[str, float, float], None] | None = None,
                 clock_zero: float | None = None, swaps: bool = True) -> RestartsSummary:
    """Run ``restarts`` restarts on ``workers`` processes (in this process when 1) and keep
    the best by (cost, restart index): the same for any worker count or scheduling when no
    deadline cuts the search short. Restarts not begun by the deadline are dropped; running
    ones stop at their next check (every 128 nodes) and report their best state."""
    zero = time.monotonic() if clock_zero is None else clock_zero
    results: list[RestartResult] = []
    skipped = 0
    workers = max(1, min(workers, restarts))
    if workers == 1:
        for r in range(restarts):
            if r > 0 and deadline is not None and time.monotonic() >= deadline:
                skipped = restarts - r
                break
            results.append(run_restart(problem, start, seed, r, deadline, max_iterations, zero,
                                       swaps))
            if progress is not None:
                progress("restarts", len(results), restarts)
    else:
        with process_pool(workers) as pool:
            pending = {pool.submit(_pooled_restart, problem, start, seed, r, deadline,
                                   max_iterations, zero, swaps) for r in range(restarts)}
            while pending:
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
