"""Multilevel search: coarsen the graph by heavy-edge matching (:func:`coarse_levels`), search
the coarsest level, and project and refine level by level (:func:`_multilevel`)."""

from __future__ import annotations

import time

import numpy as np

from shardplan.partition._sharding_local import SearchOutcome, local_search
from shardplan.partition._sharding_placement import _placement_start
from shardplan.partition._sharding_problem import Problem
from shardplan.partition._sharding_starts import _repair, initial_assignment

__all__ = ["COARSE_NODES_PER_COMPONENT", "coarse_levels"]


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
