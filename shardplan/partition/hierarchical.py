"""The ``hierarchical`` partitioner: paper 000's recursive partitioning along the topology's
natural hierarchy (section 2.5)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp

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
from shardplan.partition._sharding_local import local_search
from shardplan.partition._sharding_problem import Problem
from shardplan.partition._sharding_search import run_restarts
from shardplan.registry import Progress, Result, register, take_options

__all__ = ["DEFAULTS", "hierarchical", "hierarchy_groups"]

DEFAULTS: Mapping[str, Any] = {"stages": None, "restarts": 4, "start": "metis",
                               "max_iterations": 1000, "refine": True, "swaps": True,
                               "coarsen": True, "acyclic": True,
                               **SETTING_DEFAULTS}


#: With a time limit and ``refine``, the share of the time the splits' extra restarts
#: leave to the refinement (a split's first restart always runs).
_REFINE_SHARE = 0.2


def hierarchy_groups(topology: Topology) -> list[list[tuple[int, ...]]]:
    """The topology's ``levels`` (outermost first) followed by the devices themselves, each
    level as a list of device groups; levels that would not split anything are dropped."""
    d = topology.num_devices
    out: list[list[tuple[int, ...]]] = []
    prev = 1
    for lv in topology.levels:
        groups = [tuple(sorted(g)) for g in lv.groups]
        if len(groups) > prev:
            out.append(groups)
            prev = len(groups)
    if prev < d:
        out.append([(i,) for i in range(d)])
    return out


def _group_means(m: np.ndarray, groups: list[tuple[int, ...]]) -> np.ndarray:
    """``out[a, b]`` = mean of ``m`` over the device pairs of groups a and b (0 on the
    diagonal), shape (k, k). With S the (k, P) group indicator over the P devices of the
    groups, the block sums are ``S M_P S^T`` (M_P: M among those devices): O(P^2 + k P)
    instead of a Python loop over k^2 blocks (16 million of them on a flat topology of
    4096 devices), and on a level below the top only the parent's block of M (the sums
    run over the same devices in the same order as over the whole matrix)."""
    k = len(groups)
    sizes = np.array([len(g) for g in groups], dtype=np.float64)
    members = np.fromiter((x for g in groups for x in g), dtype=np.int64)
    devices = np.unique(members)
    d = devices.size
    if d < m.shape[0]:
        m = m[np.ix_(devices, devices)]
    members = np.searchsorted(devices, members)
    owner = np.repeat(np.arange(k), [len(g) for g in groups])
    ind = sp.csr_matrix((np.ones(members.size), (owner, members)), shape=(k, d))
    sums = np.asarray((ind @ np.asarray(ind @ m).T).T)
    out = sums / (sizes[:, None] * sizes[None, :])
    np.fill_diagonal(out, 0.0)
    return out


class _Recursion:
    def __init__(self, graph: Graph, topology: Topology, levels: list[list[tuple[int, ...]]],
                 *, restarts: int, start: str, max_iter: int, seed: int,
                 deadline: float | None, clock_zero: float, progress: Progress | None,
                 swaps: bool, coarsen: bool, acyclic: bool = False,
                 cost: np.ndarray | None = None,
                 means: dict[tuple[tuple[int, ...], ...], np.ndarray] | None = None,
                 restart_until: float | None = None) -> None:
        self.g, self.levels = graph, levels
        self.m = topology.cost_matrix if cost is None else cost
        self.means = {} if means is None else means  # group means by split, shared by runs
        self.restarts, self.start, self.max_iter = restarts, start, max_iter
        self.seed, self.deadline, self.zero, self.progress = seed, deadline, clock_zero, progress
        self.swaps, self.coarsen, self.acyclic = swaps, coarsen, acyclic
        self.rank, self.depth = graph.topological_rank, graph.levels
        self.device_of = np.full(graph.num_nodes, -1, dtype=np.int64)
        self.local = np.full(graph.num_nodes, -1, dtype=np.int64)  # scratch: ids in a split
        self.leads = [{grp[0]: j for j, grp in enumerate(lv)} for lv in levels]
        self.device_order: list[int] = []  # devices in the order the recursion leaves them
        self.timed_out = False
        self.solved = 0
        self.total = 1 + sum(len(lv) for lv in levels[:-1])
        self.calls = 0
        # Work left, in nodes still to split (every level splits every node once): with a
        # deadline, a split's restarts after its first begin only within its share of the
        # time left, so that a slow start does not leave the last splits no time at all.
        self.work_left = graph.num_nodes * len(levels)
        self.restart_until = deadline if restart_until is None else restart_until

    def solve(self, nodes: np.ndarray, devices: tuple[int, ...], depth: int,
              edges: np.ndarray | None = None) -> None:
        """Place ``nodes`` on ``devices`` (a group of level ``depth - 1``); ``edges``: the
        ids of the graph's edges among them, in order (None: every edge)."""
        if len(devices) == 1:
            self.device_of[nodes] = devices[0]
            self.device_order.append(devices[0])
            return
        if edges is None:
            edges = np.arange(self.g.src.size)
        lead = self.leads[depth]  # the level's groups by their first device
        children = [self.levels[depth][j] for j in sorted(lead[d] for d in devices
                                                           if d in lead)]
        assert sum(len(c) for c in children) == len(devices)
        if len(children) == 1:
            self.solve(nodes, devices, depth + 1, edges)
            return
        part, order, es, ed = self._split(nodes, children, edges)
        self.solved += 1
        if self.progress is not None:
            self.progress("subproblems", self.solved, self.total)
        pe = np.where(part[es] == part[ed], part[es], -1)  # the group an edge stays in
        for i in order:  # acyclic: upstream groups first, so devices end in pipeline order
            self.solve(nodes[part == i], children[i], depth + 1, edges[pe == i])

    def _split(self, nodes: np.ndarray, children: list[tuple[int, ...]],
               edges: np.ndarray | None = None
               ) -> tuple[np.ndarray, list[int], np.ndarray, np.ndarray]:
        """Split ``nodes`` among ``children`` (groups of devices) by the local search, one
        slot per group: M between groups is the mean over their device pairs, target weight
        proportional to the group's devices, imbalance scaled by 1 / |group|, at least
        |group| nodes per group. Returns the group of every node, the groups in component
        order (with ``acyclic``, edges among the nodes run from earlier groups to later) and
        the ``edges``' ends as positions in ``nodes`` (``edges``: the ids of the edges among
        ``nodes``, None: found here in O(N + M)). O(n + m) besides the search, for the n
        nodes and m edges of the split."""
        g = self.g
        k = len(children)
        sizes = np.array([len(c) for c in children], dtype=np.float64)
        local = self.local
        local[nodes] = np.arange(nodes.size)
        if edges is None:
            edges = np.flatnonzero((local[g.src] >= 0) & (local[g.dst] >= 0))
        es, ed = local[g.src[edges]], local[g.dst[edges]]
        local[nodes] = -1
        key = tuple(children)
        if key not in self.means:
            self.means[key] = _group_means(self.m, children)
        mg = self.means[key]
        w = g.weight[nodes]
        problem = Problem.build(
            w, es, ed, self.rank[nodes], self.depth[nodes], mg,
            k, target=float(w.sum()) * sizes / sizes.sum(), scale=1.0 / sizes,
            min_size=sizes.astype(np.int64), initial_placement=np.arange(k),
            acyclic=self.acyclic)
        self.calls += 1
        begin_by = None
        if self.restart_until is not None:
            now = time.monotonic()
            begin_by = now + (self.restart_until - now) * nodes.size / max(self.work_left,
                                                                           nodes.size)
        self.work_left -= nodes.size
        summary = run_restarts(problem, start=self.start, seed=self.seed * 1_000_003 + self.calls,
                               restarts=self.restarts, workers=1, deadline=self.deadline,
                               max_iterations=self.max_iter, clock_zero=self.zero,
                               swaps=self.swaps, coarsen=self.coarsen, begin_by=begin_by)
        self.timed_out |= summary.timed_out
        out = summary.best.outcome
        # Component i sits on slot placement[i]: report the slot of every node.
        return out.placement[out.assignment], [int(x) for x in out.placement], es, ed


@register("partition", "hierarchical")
def hierarchical(graph: Graph, topology: Topology, *, options: Mapping[str, Any], seed: int,
                 time_limit: float | None, progress: Progress | None = None) -> Result:
    """Recursive sharding-cost partitioning along the topology's levels (paper 000, 2.5).

    Parameters
    ----------
    graph, topology
        ``topology.levels`` (outermost first, e.g. region, rack, box) gives the hierarchy; the
        devices are the last level. A topology without levels is partitioned flat.
    options
        ``stages``: must be the number of devices (the hierarchy places one component on
        every device); ``restarts`` (per subproblem, default 4), ``start`` (``metis``
        (default), ``random`` or ``topo``), ``max_iterations`` (passes per restart),
        ``refine`` (default true: finish with the flat local search over all devices from
        the hierarchical partition), ``swaps`` (node exchanges, see :mod:`.heuristic`;
        default true), ``coarsen`` (the coarse pass of the ``random`` and ``topo`` starts in
        each subproblem, see :mod:`.heuristic`; default true), ``acyclic`` (default true:
        every split keeps edges running from earlier groups to later ones, so the devices'
        components form a DAG a pipeline runs; the same recursion then also runs without
        the constraint, reported in the plan's ``acyclic`` entry; false: paper 000's
        problem).
    seed : int
        Same seed, same plan.
    time_limit : float or None
        Subproblems stop at it and the plan is completed from their best states, status
        ``timed_out``. With ``acyclic``, the constrained recursion has the first half, the
        comparison the second. Within that, a subproblem's restarts after its first begin
        only within its share of the time left (its nodes against the nodes still to
        split; with ``refine``, of the time less a fifth kept for the refinement), so that
        slow early splits do not leave the last ones only their starts; the plan is then
        ``timed_out`` too.

    Returns
    -------
    Result
        k = devices single-device stages, objective ``sharding_cost``; stats
        ``subproblems``, ``hierarchy`` (groups per level), ``before_refine``.

    Notes
    -----
    The paper partitions the graph over the k_1 outermost groups with its heuristic, then
    each group's nodes over its k_2 subgroups, down to the devices, but leaves the
    subproblem's cost unspecified. We take, for a split of a parent group's nodes into child
    groups g of |g| devices: M between two groups = the mean of M over their device pairs
    (exact for a hierarchical topology, where it is constant), target weight
    ``|g| / |parent| * W_parent`` and imbalance ``(W_g - target)^2 / |g|``, the least
    ``sum (W_d - mean)^2`` the group's devices can reach once it holds W_g (so the levels
    optimise the same objective as the flat cost); edges to nodes outside the parent are
    ignored (their cost was fixed by the outer level); each group receives at least |g|
    nodes so that no device ends empty. With k = O(1) children per level, the local search
    costs O(N n^2) overall against O(N (Kn)^2) flat (the paper's analysis); our passes are
    O(m k) each. The final refinement is our addition: one flat local search over all K
    devices, started from the hierarchical partition, which only lowers the cost. Its node
    passes evaluate all K moves only of the nodes a lower bound does not rule out (near the
    hierarchical partition, few), and its placement rounds keep the table of swap deltas up
    to date as components swap devices (O(K x the rows that changed) a round, not O(K^2 D):
    4096 devices took 12.9 s a round, then 0.9 s with the slot costs kept, now milliseconds)
    and check the deadline every round, as the node passes do before every chunk: every
    phase stops at the time limit. ``benchmarks/paper000_hierarchical.py --scale`` runs
    10^5 nodes onto 4096 devices (4 x 8 x 16 x 8).

    With ``acyclic``, each split is monotone in its groups' component order (see
    :mod:`.heuristic`) and the recursion visits the groups in that order, so numbering the
    devices in the order it reaches them numbers the final components monotonically (an
    edge between two groups runs forward by the outer split, one inside a group by the
    inner); the refinement keeps that numbering monotone.
    """
    opts = take_options("hierarchical", options, DEFAULTS)
    sharding_settings(graph, opts)  # bad settings: one line, before the search
    k = num_components(graph, topology, opts["stages"])
    if k != topology.num_devices:
        raise ShardplanError(f"hierarchical places a component on every device: stages must "
                             f"be {topology.num_devices}, got {k} (use heuristic for fewer)")
    restarts = check_int_option("restarts", opts["restarts"])
    start = check_start(opts["start"])
    max_iter = check_int_option("max_iterations", opts["max_iterations"])
    refine = check_bool_option("refine", opts["refine"])
    swaps = check_bool_option("swaps", opts["swaps"])
    coarsen = check_bool_option("coarsen", opts["coarsen"])
    acyclic = check_bool_option("acyclic", opts["acyclic"])
    t0 = time.monotonic()
    deadline, end = split_deadline(t0, time_limit, acyclic)
    levels = hierarchy_groups(topology)
    cost = topology.cost_matrix  # once: an implicit topology computes it on every access
    means: dict[tuple[tuple[int, ...], ...], np.ndarray] = {}  # both runs split alike

    def run(constrained: bool, until: float | None, report: Progress | None
            ) -> tuple[np.ndarray, np.ndarray, float, bool, int]:
        rec = _Recursion(graph, topology, levels, restarts=restarts, start=start,
                         max_iter=max_iter, seed=seed, deadline=until, clock_zero=t0,
                         progress=report, swaps=swaps, coarsen=coarsen, acyclic=constrained,
                         cost=cost, means=means,
                         restart_until=None if until is None or not refine
                         else until - _REFINE_SHARE * (until - t0))
        rec.solve(np.arange(graph.num_nodes), tuple(range(topology.num_devices)), 0)
        if constrained:  # components numbered in the order the recursion left the devices
            placement = np.asarray(rec.device_order, dtype=np.int64)
            label = np.empty(topology.num_devices, dtype=np.int64)
            label[placement] = np.arange(placement.size)
            assignment = label[rec.device_of]
        else:
            assignment = rec.device_of.copy()
            placement = np.arange(topology.num_devices)
        problem = flat_problem(graph, topology, k, acyclic=constrained, cost=cost)
        assert not constrained or problem.is_monotone(assignment)
        before = problem.objective(assignment, placement)
        timed_out = rec.timed_out
        if refine:
            from shardplan._rng import make_rng

            out = local_search(problem, assignment, placement, make_rng(seed), deadline=until,
                               max_iterations=max_iter, swaps=swaps)
            assignment, placement = out.assignment, out.placement
            timed_out |= out.timed_out
        return assignment, placement, before, timed_out, rec.calls

    assignment, placement, before, timed_out, calls = run(acyclic, deadline, progress)
    free = None
    if acyclic:
        fa, fp, _, f_timed, _ = run(False, end, None)
        free = (fa, fp, "timed_out" if f_timed else "feasible")
    plan = make_plan(graph, topology, "hierarchical", assignment, placement,
                     status="timed_out" if timed_out else "feasible", seed=seed, options=opts,
                     seconds=time.monotonic() - t0,
                     meta={"acyclic": acyclic_report(graph, topology, assignment, placement,
                                                     free, exact=False)})
    stats = {"k": k, "subproblems": calls, "hierarchy": [len(lv) for lv in levels],
             "before_refine": before, "flat": not topology.levels}
    return Result(plan, stats)
