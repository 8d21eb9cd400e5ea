"""Lower bounds on the optimal max stage time of a mapping: Parmesan equations 8 and 9.

Both bound, for every stage s and device d, the time a replica of s can have if it sits on
d, by letting the rest of the mapping be as good as it can be for s alone:

- p2p (equation 8): ``c_u(s, d) + min over injective placements of adj(s) on D \\ {d}`` of
  the summed transfer costs. Without latency this is the paper's "sorting approach"
  (heaviest neighbour on the fastest link, by the rearrangement inequality); with latency
  the costs ``latency[d, x] + M[s, s'] / bandwidth[d, x]`` of different neighbours need not
  sort alike, so we solve the small assignment problem exactly (``scipy.optimize.
  linear_sum_assignment``, deg(s) x (D - 1)), which equals the sorting result when latency
  is zero.
- all-reduce (equation 9): ``c_u(s, d) + 2 (R - 1) P(s) / R`` times the smallest possible
  worse of d's two ring links: the second smallest inverse bandwidth out of d for a
  symmetric topology and R >= 3 (the two ring neighbours are distinct devices), and
  ``max(min_x 1/B[x, d], min_y 1/B[d, y])`` otherwise (sorting, O(D log D) per device).

The paper takes ``max_s min_d``. The R replicas of s need R distinct devices, so we take the
R-th smallest over d instead of the minimum: still a valid lower bound (Proposition 5.1's
argument per replica), never weaker.

The same bounds serve every view of :mod:`._stage_time`: the communication terms combine
with compute as the view does (a sum, or a maximum under ``overlap``), both monotone, and the
view's weighted all-reduce adds its least possible value (latency and inverse bandwidth
each at their least over the device's ring links: a valid, slightly looser bound than
their least sum). A device without the memory a stage needs is never allowed (``inf``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from shardplan.mapping._stage_time import MappingProblem

__all__ = ["allreduce_min", "allreduce_node_bounds", "lower_bound", "min_pair_costs",
           "p2p_node_bounds", "ring_bottleneck"]


def min_pair_costs(problem: MappingProblem, *, check: Callable[[], None] | None = None
                   ) -> dict[tuple[int, int], np.ndarray]:
    """For every ordered adjacent pair (s, t): ``min over x != d`` of ``pair_cost(s, t)[d, x]``,
    shape (D,) -- the least stage s's replica on d can pay to talk to t. O(S^2 D^2).
    ``check`` is called before each pair (a deadline check that may raise)."""
    out = {}
    for s, t in zip(*np.nonzero(problem.adjacent), strict=True):
        if check is not None:
            check()
        out[(int(s), int(t))] = problem.pair_cost(int(s), int(t)).min(axis=1)
    return out


def p2p_node_bounds(problem: MappingProblem, *, check: Callable[[], None] | None = None
                    ) -> np.ndarray:
    """Equation 8's inner term for every stage and device, shape (S, D). O(S D A) with A the
    cost of one assignment problem of deg(s) rows and D - 1 columns. ``check`` is called
    between pieces of work (a deadline check that may raise)."""
    from scipy.optimize import linear_sum_assignment  # lazily: 0.15 s to import

    s_count, d_count = problem.compute.shape
    comm = np.zeros_like(problem.compute)
    for s in range(s_count):
        nbrs = np.flatnonzero(problem.adjacent[s])
        if nbrs.size == 0:
            continue
        if check is not None:
            check()
        costs = np.stack([problem.pair_cost(s, int(t)) for t in nbrs])  # (k, D, D)
        if nbrs.size == 1:
            comm[s] += costs[0].min(axis=1)
            continue
        if nbrs.size > d_count - 1:
            comm[s] = np.inf
            continue
        for d in range(d_count):
            if check is not None and d % 16 == 0:
                check()
            block = np.delete(costs[:, d, :], d, axis=1)  # (k, D - 1)
            if not np.all(np.isfinite(block.min(axis=1))):
                comm[s, d] = np.inf
                continue
            big = np.where(np.isfinite(block), block, 1e300)
            rows, cols = linear_sum_assignment(big)
            comm[s, d] += float(block[rows, cols].sum())
    out = problem.combine(problem.compute, comm)
    if problem.ar_weight:
        out = out + problem.ar_weight * allreduce_min(problem)
    return np.where(problem.fits, out, np.inf)


def allreduce_min(problem: MappingProblem) -> np.ndarray:
    """The least all-reduce seconds a replica of stage s on device d can see, (S, D).

    A ring link ``x -> y`` costs ``a_s lat[x, y] + k_s / B[x, y]``; d's ring has a link out
    of d and one into d, so its slowest link costs at least the cheaper of d's links in
    either direction, and (R >= 3, symmetric topology: two distinct neighbours) at least the
    second cheapest link at d. Evaluated per stage (O(S D^2)); above 1024 devices the two
    terms are bounded separately per direction (O(D^2 + S D), looser)."""
    if problem.num_replicas == 1:
        return np.zeros_like(problem.compute)
    ib = problem.inv_bandwidth.copy()
    np.fill_diagonal(ib, np.inf)
    lat = problem.latency.copy()
    np.fill_diagonal(lat, np.inf)
    k, a = problem.allreduce_factor, problem.allreduce_latency_factor
    s_count, d_count = problem.compute.shape
    out = np.zeros((s_count, d_count))
    symmetric = problem.num_replicas >= 3 and d_count >= 3 and np.array_equal(ib, ib.T) \
        and np.array_equal(lat, lat.T)
    with np.errstate(invalid="ignore"):
        if d_count > 1024:
            for s in np.flatnonzero(k > 0):
                out[s] = np.maximum(a[s] * lat.min(axis=1) + k[s] * ib.min(axis=1),
                                    a[s] * lat.min(axis=0) + k[s] * ib.min(axis=0))
            return out
        for s in np.flatnonzero(k > 0):
            cost = a[s] * lat + k[s] * ib
            if symmetric:
                out[s] = np.partition(cost, 1, axis=1)[:, 1]
            else:
                out[s] = np.maximum(cost.min(axis=1), cost.min(axis=0))
    return out


def allreduce_node_bounds(problem: MappingProblem) -> np.ndarray:
    """Equation 9's inner term ``c_u(s, d) + c_AR^min(s, d)`` for every (s, d), (S, D).
    O(D^2 log D + S D)."""
    return np.where(problem.fits, problem.compute + allreduce_min(problem), np.inf)


def ring_bottleneck(inv_bandwidth: np.ndarray, size: int,
                    devices: np.ndarray | None = None) -> float:
    """The least possible slowest link of a ring through ``size`` distinct devices (of
    ``devices``, default all): the smallest b such that the links with ``1/B <= b`` (in
    either direction: a ring uses each link one way) join at least ``size`` devices into one
    component (every link of a ring lies in one component of that graph). Kruskal on
    ``min(1/B, 1/B^T)``. O(D^2 log D)."""
    ib = inv_bandwidth if devices is None else inv_bandwidth[np.ix_(devices, devices)]
    n = ib.shape[0]
    if size <= 1:
        return 0.0
    if n < size:
        return math.inf
    w = np.minimum(ib, ib.T)
    iu, ju = np.triu_indices(n, 1)
    vals = w[iu, ju]
    order = np.argsort(vals, kind="stable")
    vals_l, iu_l, ju_l = vals[order].tolist(), iu[order].tolist(), ju[order].tolist()
    parent = list(range(n))
    count = [1] * n

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for v, a, b in zip(vals_l, iu_l, ju_l, strict=True):
        if not math.isfinite(v):
            break
        a, b = root(a), root(b)
        if a != b:
            if count[a] < count[b]:
                a, b = b, a
            parent[b] = a
            count[a] += count[b]
            if count[a] >= size:
                return float(v)
    return math.inf


def lower_bound(problem: MappingProblem, model: str,
                node_bounds: np.ndarray | None = None) -> float:
    """``max over s`` of the R-th smallest node bound of s over the devices (eq. 8 / 9,
    tightened as the module docstring says). All-reduce adds a bound of our own: a stage's
    ring of R devices has a slowest link of at least :func:`ring_bottleneck`, so
    ``t(s) >= R-th smallest C[s, .] + 2 (R - 1) P(s) / R * ring_bottleneck`` (it beats
    eq. 9 when R exceeds the groups of fast devices, as on ``random-blk-*``)."""
    if node_bounds is None:
        node_bounds = allreduce_node_bounds(problem) if model == "allreduce" else \
            p2p_node_bounds(problem)
    r = problem.num_replicas
    if node_bounds.size == 0:
        return 0.0
    kth = np.partition(node_bounds, r - 1, axis=1)[:, r - 1]
    best = float(kth.max())
    if problem.ar_weight and r > 1:
        ring = ring_bottleneck(problem.inv_bandwidth, r)
        lat = problem.latency.copy()
        np.fill_diagonal(lat, np.inf)
        comp = np.partition(np.where(problem.fits, problem.compute, np.inf), r - 1,
                            axis=1)[:, r - 1]
        k, a = problem.allreduce_factor, problem.allreduce_latency_factor
        with np.errstate(invalid="ignore"):
            ar = np.where(k > 0, k * ring + a * float(lat.min()), 0.0)
        if model == "allreduce":
            per = comp + ar
        else:  # the replica's time is at least its compute, plus the weighted all-reduce
            per = problem.combine(comp, 0.0) + problem.ar_weight * ar
        best = max(best, float(per.max()))
    return best
