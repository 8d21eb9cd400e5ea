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

This module runs the restarts (:func:`run_restarts`, in a process pool or on Ray); the phases
of one restart are modules of their own, in the order a restart meets them:

========================  ==================================================================
module                    phase
========================  ==================================================================
``_sharding_problem``     :class:`Problem`, the seeded generator of a restart
``_sharding_starts``      the start: random, topological or METIS, balanced
``_sharding_acyclic``     the acyclic repair (:func:`make_monotone`, :func:`allowed_range`)
``_sharding_coarsen``     multilevel: heavy-edge matching, search coarse, project and refine
``_sharding_local``       one restart's descent (:func:`local_search`)
``_sharding_moves``       single-node moves (:func:`_node_pass`)
``_sharding_swaps``       node exchanges (Kernighan-Lin)
``_sharding_placement``   components on slots: greedy, then swaps and moves
========================  ==================================================================
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardplan._workers import executor
from shardplan.partition._sharding_coarsen import _multilevel
from shardplan.partition._sharding_local import SearchOutcome, local_search
from shardplan.partition._sharding_placement import _placement_start
from shardplan.partition._sharding_problem import Problem, restart_rng
from shardplan.partition._sharding_starts import initial_assignment

__all__ = ["RestartResult", "RestartsSummary", "default_workers", "merge_traces", "run_restart",
           "run_restarts", "search_deadline"]


@dataclass(frozen=True)
class RestartResult:
    restart: int
    outcome: SearchOutcome
    start_cost: float


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
