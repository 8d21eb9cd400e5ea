"""One restart's descent to a local optimum: node passes, placement rounds and node exchanges
until none lowers the objective (:func:`local_search`)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from shardplan.partition._sharding_moves import _Adjacency, _node_pass, _State
from shardplan.partition._sharding_placement import improve_placement
from shardplan.partition._sharding_problem import Problem
from shardplan.partition._sharding_swaps import SWAP_MAX_NODES, _swap_round

__all__ = ["SearchOutcome", "local_search"]


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
