"""The ``heuristic`` partitioner: paper 000's move-based local search (section 2.3).

Minimises the sharding cost of section 2.1 (:mod:`shardplan.cost._sharding`) over partitions
into k components placed on k distinct devices, from several starts run in parallel worker
processes, keeping the best.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Topology
from shardplan.partition._sharding_common import (
    SETTING_DEFAULTS,
    acyclic_report,
    check_bool_option,
    check_int_option,
    check_start,
    flat_problem,
    make_plan,
    num_components,
    sharding_settings,
    split_deadline,
)
from shardplan.partition._sharding_search import default_workers, run_restarts
from shardplan.registry import Progress, Result, register, take_options

__all__ = ["DEFAULTS", "heuristic"]

#: Options and their defaults (``workers=None``: the cores this process may use).
DEFAULTS: Mapping[str, Any] = {"stages": None, "workers": None, "restarts": 8,
                               "start": "metis", "max_iterations": 1000,
                               "swaps": True, "coarsen": True, "acyclic": True, "ray": None,
                               **SETTING_DEFAULTS}


@register("partition", "heuristic")
def heuristic(graph: Graph, topology: Topology, *, options: Mapping[str, Any], seed: int,
              time_limit: float | None, progress: Progress | None = None) -> Result:
    """Local search for a low sharding cost (paper 000, section 2.3), with random restarts.

    Parameters
    ----------
    graph, topology
        Node weights ``graph.weight``; M is ``topology.cost_matrix``.
    options
        ``stages`` (k, default every device), ``restarts`` (default 8), ``workers``
        (processes, default the cores; 1 runs in this process), ``start`` (``metis``, the
        default: a pymetis k-way partition, seeded per restart; ``random`` as in the paper;
        ``topo``: the depth order cut into k runs of equal weight; see
        ``benchmarks/paper000_figure1.py`` for how they compare), ``max_iterations`` (passes
        per restart, default 1000), ``swaps`` (default true: when no single move improves,
        exchange two nodes of different components; graphs up to 1500 nodes), ``coarsen``
        (default true: the ``random`` and ``topo`` starts are made on a coarsened graph and
        refined level by level, see Notes; false runs the paper's search from a random
        partition of the graph itself; not with ``acyclic``), ``acyclic`` (default true: only
        partitions whose components form a DAG, so that the plan trains as a pipeline; the
        same search then also runs without the constraint, and the plan's ``acyclic`` entry
        reports both costs; false: paper 000's unconstrained problem), ``ray`` (a Ray
        cluster's address, ``local`` or ``auto``: the restarts run there as tasks; the same
        plan as local processes for a seed).
    seed : int
        Restart r draws from a generator of ``(seed, r)`` only: the same seed gives the same
        plan whatever the worker count.
    time_limit : float or None
        Restarts not begun by then are dropped and running ones stop; status ``timed_out``.
        With ``acyclic``, the constrained search has the first half, the comparison the
        second.

    Returns
    -------
    Result
        A plan of k single-device stages, objective ``sharding_cost``, status ``feasible``
        (``timed_out`` when the time limit cut the search short), and an ``acyclic`` entry
        (:func:`~shardplan.partition._sharding_common.acyclic_report`); stats ``restarts``
        (per-restart start and final cost, passes), ``trace`` (best cost over time).

    Notes
    -----
    The paper's loop tries, for every ordered pair of components (i, j) and every node of
    C_i, the move to C_j, recomputes a greedy assignment of components to devices and the
    whole cost, and keeps the first improving move: O(N (kn)^2) per its analysis. Here a
    node's moves to all k components are evaluated together by their cost delta in
    O(degree * k) with incrementally kept component weights, the best one is taken, and the
    placement of components on devices (the paper's greedy assignment, which it leaves
    unspecified: we place the components by decreasing traffic on the free device adding the
    least cross-edge cost) is improved by slot swaps between passes rather than rebuilt after
    every move. A pass is O(m k + n k); a restart stops at a local optimum for both
    neighbourhoods or after ``max_iterations`` passes. Beyond the paper, a single-node local
    optimum is left by exchanging two nodes of different components (Kernighan-Lin's move,
    which the paper cites as its inspiration), all n^2 pairs evaluated in one vectorised
    O(n^2 + mk) step: in a balanced partition every single move unbalances, so the paper's
    search stops there.

    Also beyond the paper, a coarse pass for the ``random`` and ``topo`` starts: the graph
    is coarsened by heavy-edge matching (vectorised, O(m log m) a level) down to about 3
    nodes per component, the start is drawn on the coarsest graph, and the local search runs
    on every level from there down, each from the partition of the level above (a coarse
    partition costs exactly what its projection costs: edges inside a coarse node are never
    cut). From a random partition of the graph itself every edge is as likely cut as not and
    single moves unbalance, so the search crawled to poor local optima (1001 nodes on 96
    devices: 2-4 s and about twice the cost of the METIS start per restart); on the coarse
    levels whole clusters move at once. ``benchmarks/paper000_figure1.py`` and
    ``paper000_hierarchical.py`` compare both.
    """
    opts = take_options("heuristic", options, DEFAULTS)
    sharding_settings(graph, opts)  # bad settings: one line, before the search
    k = num_components(graph, topology, opts["stages"])
    restarts = check_int_option("restarts", opts["restarts"])
    workers = check_int_option("workers", opts["workers"], allow_none=True)
    start = check_start(opts["start"])
    max_iter = check_int_option("max_iterations", opts["max_iterations"])
    swaps = check_bool_option("swaps", opts["swaps"])
    coarsen = check_bool_option("coarsen", opts["coarsen"])
    acyclic = check_bool_option("acyclic", opts["acyclic"])
    t0 = time.monotonic()
    deadline, end = split_deadline(t0, time_limit, acyclic)
    common = dict(start=start, seed=seed, restarts=restarts,
                  workers=workers or default_workers(), max_iterations=max_iter,
                  clock_zero=t0, swaps=swaps, coarsen=coarsen, ray=opts["ray"])
    summary = run_restarts(flat_problem(graph, topology, k, acyclic=acyclic),
                           deadline=deadline, progress=progress, **common)
    best = summary.best.outcome
    free = None
    if acyclic:
        other = run_restarts(flat_problem(graph, topology, k), deadline=end, **common)
        free = (other.best.outcome.assignment, other.best.outcome.placement,
                "timed_out" if other.timed_out else "feasible")
    plan = make_plan(graph, topology, "heuristic", best.assignment, best.placement,
                     status="timed_out" if summary.timed_out else "feasible", seed=seed,
                     options=opts, seconds=time.monotonic() - t0,
                     meta={"acyclic": acyclic_report(graph, topology, best.assignment,
                                                     best.placement, free, exact=False)})
    if plan.objective.value > best.cost * (1 + 1e-9) + 1e-9:
        raise ShardplanError("internal error: the search's cost disagrees with the objective")
    stats = {
        "k": k, "start": start, "workers": workers or default_workers(),
        "restarts_run": len(summary.results), "best_restart": summary.best.restart,
        "restarts": [{"restart": r.restart, "start_cost": r.start_cost,
                      "cost": r.outcome.cost, "passes": r.outcome.passes,
                      "timed_out": r.outcome.timed_out} for r in summary.results],
        "trace": [list(p) for p in summary.trace],
    }
    return Result(plan, stats)
