"""The ``brute-force`` partitioner: the exact optimum of the sharding cost (paper 000, 2.2).

The paper enumerates every partition into k components and every assignment of the
components to devices. We search the same space, exactly, as a depth-first branch and bound
over node -> device assignments, with the symmetry of identical devices broken and a lower
bound that prunes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

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
from shardplan.partition._sharding_search import run_restart, run_restarts
from shardplan.registry import Progress, Result, register, take_options

__all__ = ["DEFAULTS", "brute_force", "device_classes", "imbalance_lower_bound"]

#: Options: ``incumbent`` ``"heuristic"`` seeds the bound with a short local search
#: (``incumbent_restarts`` restarts from ``start``), ``"none"`` starts from nothing, as the
#: paper's enumeration does.
DEFAULTS: Mapping[str, Any] = {"stages": None, "incumbent": "heuristic",
                               "incumbent_restarts": 4, "start": "metis", "acyclic": True,
                               **SETTING_DEFAULTS}


def device_classes(cost: np.ndarray) -> np.ndarray:
    """Class id of every device; i and j share a class when swapping them leaves M unchanged
    (equal rows and columns outside ``{i, j}`` and ``M[i, j] == M[j, i]``).

    Such transpositions generate the symmetric group of each class (the relation is
    transitive: ``(a c) = (a b)(b c)(a b)``), so any permutation of a class maps solutions to
    solutions of equal cost. O(D^3), vectorised per device.
    """
    d = cost.shape[0]
    cls = np.full(d, -1, dtype=np.int64)
    nxt = 0
    for i in range(d):
        if cls[i] >= 0:
            continue
        cls[i] = nxt
        for j in range(i + 1, d):
            if cls[j] >= 0:
                continue
            mask = np.ones(d, dtype=bool)
            mask[[i, j]] = False
            if (np.array_equal(cost[i, mask], cost[j, mask])
                    and np.array_equal(cost[mask, i], cost[mask, j])
                    and cost[i, j] == cost[j, i]):
                cls[j] = nxt
        nxt += 1
    return cls


def imbalance_lower_bound(weights: list[float], remaining: float, mean: float) -> float:
    """Least ``sum_i (W_i + x_i - mean)^2`` over ``x >= 0`` with ``sum x = remaining``: the
    remaining weight poured into the lightest components up to a common level (water
    filling). Valid because node weights are non-negative. O(k log k)."""
    ws = sorted(weights)
    k = len(ws)
    acc = remaining
    j = 0
    level = -np.inf
    while j < k:
        acc += ws[j]
        j += 1
        level = acc / j
        if j == k or level <= ws[j]:
            break
    total = 0.0
    for t, w in enumerate(ws):
        x = level if t < j else w
        total += (x - mean) * (x - mean)
    return total


class _ZeroRows(dict):
    """``rows[u]``: a list of ``width`` zeros made the first time u is looked up."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width

    def __missing__(self, u: int) -> list[float]:
        row = [0.0] * self.width
        self[u] = row
        return row


class _Search:
    """Depth-first branch and bound over node -> device assignments (nodes by depth t in a
    topological order)."""

    def __init__(self, graph: Graph, cost: np.ndarray, k: int, deadline: float | None,
                 time_limit: float | None, progress: Progress | None,
                 acyclic: bool = False) -> None:
        n = graph.num_nodes
        self.n, self.k, self.deadline, self.progress = n, k, deadline, progress
        self.acyclic = acyclic
        self.time_limit = time_limit
        self.order = graph.topological_order.tolist()
        pos = np.empty(n, dtype=np.int64)
        pos[np.asarray(self.order)] = np.arange(n)
        self.cost = cost.tolist()
        self.cost_t = cost.T.tolist()
        self.num_devices = cost.shape[0]
        cls = device_classes(cost)
        self.class_of = cls.tolist()
        self.class_members = [np.flatnonzero(cls == c).tolist() for c in range(cls.max() + 1)]
        w = graph.weight
        self.w = [float(w[v]) for v in self.order]
        self.total = float(w.sum())
        self.mean = self.total / k
        self.suffix = np.concatenate((np.cumsum(np.asarray(self.w)[::-1])[::-1], [0.0])).tolist()
        # Per depth t: its later neighbours u (ascending) with the counts of edges t -> u and
        # u -> t, in CSR form (vectorised: O(m log m)); the vectors over x of the cost of the
        # t-u edges were t on d and u on x, (t->u) M[d][x] + (u->t) M[x][d], are built the
        # first time the search reaches depth t (:meth:`_later`): a search cut short by its
        # time limit on a large graph reaches few depths, and building them all up front
        # took seconds there.
        sp, dp = pos[graph.src], pos[graph.dst]
        first, second = np.minimum(sp, dp), np.maximum(sp, dp)
        uniq, inv = np.unique(first * max(n, 1) + second, return_inverse=True)
        inv = inv.reshape(-1)
        forward = sp < dp
        self._n_fwd = np.bincount(inv, weights=forward, minlength=uniq.size).astype(np.int64)
        self._n_bwd = np.bincount(inv, weights=~forward, minlength=uniq.size).astype(np.int64)
        self._second = (uniq % max(n, 1)).astype(np.int64)
        self._ptr = np.searchsorted(uniq // max(n, 1), np.arange(n + 1)).astype(np.int64)
        self._cost_np = cost
        self._later_cache: dict[int, tuple[list[int], list[list[list[float]]]]] = {}
        # Acyclic: the predecessors of every depth (placed before it), and the edge counts
        # between the devices of the partial partition (its quotient graph).
        self.preds: list[list[int]] = [[] for _ in range(n)] if acyclic else []
        if acyclic:
            for a, b in zip(sp.tolist(), dp.tolist(), strict=True):
                self.preds[b].append(a)
        self.quotient = [[0] * cost.shape[0] for _ in range(cost.shape[0])]
        # pend[u][x]: cost of u's edges to placed nodes were u on device x (rows made on
        # first use).
        self.pend = _ZeroRows(self.num_devices)
        self.placed_nbrs = [0] * n
        self.frontier: set[int] = set()
        self.dev = [-1] * n
        self.load = [0.0] * self.num_devices
        self.used: list[int] = []
        self.next_free = [0] * len(self.class_members)  # per class: members opened so far
        self.best = np.inf
        self.best_dev: list[int] | None = None
        self.nodes = 0
        self.timed_out = False
        self.trace: list[tuple[float, float]] = []
        self.t0 = time.monotonic()
        self.eps = 1e-12 * (abs(self.total) * max(self.w, default=0.0)
                            + float(np.abs(cost).max(initial=0.0)) + 1.0)

    def _later(self, t: int) -> tuple[list[int], list[list[list[float]]]]:
        """Depth t's later neighbours and, per neighbour, ``vec[d][x]`` (see ``__init__``)."""
        got = self._later_cache.get(t)
        if got is None:
            lo, hi = int(self._ptr[t]), int(self._ptr[t + 1])
            cost = self._cost_np
            got = (self._second[lo:hi].tolist(),
                   [(int(f) * cost + int(b) * cost.T).tolist()
                    for f, b in zip(self._n_fwd[lo:hi], self._n_bwd[lo:hi], strict=True)])
            self._later_cache[t] = got
        return got

    def offer(self, devs: list[int], value: float) -> None:
        if value < self.best:
            self.best = value
            self.best_dev = list(devs)
            self.trace.append((time.monotonic() - self.t0, value))

    def run(self) -> None:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 2 * self.n + 200))
        try:
            self._dfs(0, 0.0)
        finally:
            sys.setrecursionlimit(limit)

    def _place(self, t: int, d: int, sign: float) -> None:
        """Add (sign 1) or remove (sign -1) node t on device d in the frontier costs."""
        pend, frontier, placed = self.pend, self.frontier, self.placed_nbrs
        for u, vecs in zip(*self._later(t), strict=True):
            row, col = pend[u], vecs[d]
            for x in range(self.num_devices):
                row[x] += sign * col[x]
            placed[u] += 1 if sign > 0 else -1
            if placed[u] == 0:
                frontier.discard(u)
            else:
                frontier.add(u)
        if sign > 0:
            frontier.discard(t)
        elif placed[t] > 0:
            frontier.add(t)

    def _closes_cycle(self, t: int, d: int) -> bool:
        """Whether node t (its predecessors all placed: nodes go in topological order) on
        device d adds a quotient edge x -> d while d already reaches x. Edges are only ever
        added, so a partition is acyclic iff no placement on the way to it closed a cycle.
        O(deg + D^2)."""
        q, dev = self.quotient, self.dev
        sources = {dev[u] for u in self.preds[t]}
        sources.discard(d)
        sources = {x for x in sources if q[x][d] == 0}
        if not sources:
            return False
        seen = {d}
        stack = [d]
        while stack:
            y = stack.pop()
            for z, count in enumerate(q[y]):
                if count and z not in seen:
                    if z in sources:
                        return True
                    seen.add(z)
                    stack.append(z)
        return False

    def _link(self, t: int, d: int, sign: int) -> None:
        """Add (1) or remove (-1) the quotient edges of node t's in-edges, t on device d."""
        q, dev = self.quotient, self.dev
        for u in self.preds[t]:
            if dev[u] != d:
                q[dev[u]][d] += sign

    def _frontier_bounds(self, t: int, cands: list[int], need: int) -> list[float]:
        """Per candidate device d of node t: every unplaced node with placed neighbours
        (after t is placed on d) pays at least its cheapest allowed device's cost to them.
        Allowed: every device while components are still to open, else the used ones."""
        pend, used = self.pend, self.used
        later, later_vec = self._later(t)
        skip = set(later)
        skip.add(t)
        rest = [pend[u] for u in self.frontier if u not in skip]
        base_all = sum(min(row) for row in rest) if need > 0 else 0.0
        base_used = (sum(min(row[x] for x in used) for row in rest) if need == 0 else 0.0)
        min_used = [min(row[x] for x in used) for row in rest] if need == 1 and used else []
        out = []
        for d in cands:
            new = d not in used
            if need - new > 0:
                allowed = None
                base = base_all
            elif need == 0:
                allowed = used
                base = base_used
            else:  # this child opens the last component: the devices are then fixed
                allowed = [*used, d]
                base = (sum(min(mu, row[d]) for mu, row in zip(min_used, rest, strict=True))
                        if used else sum(row[d] for row in rest))
            extra = 0.0
            for u, vecs in zip(later, later_vec, strict=True):
                row, col = pend[u], vecs[d]
                if allowed is None:
                    extra += min([row[x] + col[x] for x in range(self.num_devices)])
                else:
                    extra += min([row[x] + col[x] for x in allowed])
            out.append(base + extra)
        return out

    def _dfs(self, t: int, cut: float) -> None:
        self.nodes += 1
        if (self.nodes & 15) == 0:
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self.timed_out = True
            if self.progress is not None and self.time_limit is not None:
                self.progress("seconds", time.monotonic() - self.t0, self.time_limit)
        if self.timed_out:
            return
        k, used, load, dev = self.k, self.used, self.load, self.dev
        if t == self.n:
            if len(used) == k:
                value = cut + sum((load[d] - self.mean) ** 2 for d in used)
                self.offer(dev, value)
            return
        left = self.n - t  # nodes still to place, this one included
        need = k - len(used)
        cands: list[int] = []
        if left > need:
            cands.extend(used)
        if need > 0:  # open one new device per class: the lowest unused member
            for c, members in enumerate(self.class_members):
                if self.next_free[c] < len(members):
                    cands.append(members[self.next_free[c]])
        if self.acyclic:
            cands = [d for d in cands if not self._closes_cycle(t, d)]
        w = self.w[t]
        rest = self.suffix[t + 1]
        row = self.pend[t]
        scored = []
        fronts = self._frontier_bounds(t, cands, need)
        for d, front in zip(cands, fronts, strict=True):
            add = row[d]
            load[d] += w
            loads = [load[x] for x in used]
            if d not in used:
                loads.append(load[d])
            loads.extend([0.0] * (k - len(loads)))
            lb = cut + add + front + imbalance_lower_bound(loads, rest, self.mean)
            load[d] -= w
            if lb < self.best - self.eps:
                scored.append((lb, d, add))
        scored.sort()
        for lb, d, add in scored:
            if lb >= self.best - self.eps:
                break
            new = d not in used
            if new:
                c = self.class_of[d]
                used.append(d)
                self.next_free[c] += 1
            dev[t] = d
            load[d] += w
            self._place(t, d, 1.0)
            if self.acyclic:
                self._link(t, d, 1)
            self._dfs(t + 1, cut + add)
            if self.acyclic:
                self._link(t, d, -1)
            self._place(t, d, -1.0)
            load[d] -= w
            dev[t] = -1
            if new:
                used.pop()
                self.next_free[c] -= 1
            if self.timed_out:
                return


@register("partition", "brute-force")
def brute_force(graph: Graph, topology: Topology, *, options: Mapping[str, Any], seed: int,
                time_limit: float | None, progress: Progress | None = None) -> Result:
    """The exact minimum of the sharding cost (paper 000, section 2.2).

    Parameters
    ----------
    graph, topology
        Node weights ``graph.weight`` (non-negative); M is ``topology.cost_matrix``.
    options
        ``stages`` (k, default every device); ``incumbent``: ``"heuristic"`` (default) first
        runs ``incumbent_restarts`` restarts of the local search (``start``, default
        ``metis``) in this process and uses its cost as the initial bound, ``"none"`` starts
        from an infinite bound like the paper's loop; ``acyclic`` (default true): the exact
        minimum over the partitions whose components form a DAG (which a pipeline runs),
        and, for the plan's ``acyclic`` entry, the exact minimum without the constraint
        too; false: paper 000's unconstrained problem.
    seed : int
        Seeds the incumbent search only; the optimum does not depend on it.
    time_limit : float or None
        Without one, the search runs to the end (it is exponential in n). With ``acyclic``,
        the constrained search has the first half, the unconstrained one the second.

    Returns
    -------
    Result
        Status ``optimal`` (with ``lower_bound`` = value) only when the search was
        exhaustive; otherwise the best plan found, ``timed_out``. Stats: ``nodes`` (search
        nodes), ``trace`` (best cost over time), ``device_classes``.

    Notes
    -----
    The search assigns nodes, in topological order, to devices; a leaf that uses exactly k
    devices is a partition into k non-empty components with its placement, so every pair
    (partition, assignment) of the paper's loop is reachable. Symmetry: devices whose swap
    leaves M unchanged (equal rows and columns, :func:`device_classes`) are interchangeable,
    so a node may open only the lowest-numbered unused device of each class; this prunes
    only mirror images of solutions already searched. Bound at a search node: the cross-edge
    cost of the edges between placed nodes (exact) plus the least weight imbalance reachable
    by pouring the unplaced weight into the lightest components
    (:func:`imbalance_lower_bound`). Children are tried cheapest bound first and pruned when
    the bound reaches the incumbent. Worst case O(k^n / (class symmetries) * (deg + k log k)).

    Sizes it finishes (one core of this 2-core machine, layered graphs of width 3 on 2 x 2
    GPUs, M in microseconds): 12 nodes in 0.1-0.3 s, 14 in about 1 s, 16-18 in 4-10 s, some
    20-node graphs in 1 s; the hard cases are those with many exactly balanced partitions,
    where only the cut bound prunes. The 25-node, 4-device graph of the contract test does
    not finish in 20 s; it then returns the best plan at the time limit, ``timed_out``.

    Acyclic (ours): nodes are placed in topological order, so placing a node adds exactly
    its in-edges to the quotient graph of the devices used; a child that would add an edge
    x -> d while d already reaches x closes a cycle and is cut. Edges are never removed on
    the way down, so the leaves reached are exactly the acyclic partitions, and the bound
    (which ignores the constraint) stays a lower bound: the search is exact over them
    (``tests/partition/test_acyclic.py`` checks it against an enumeration). Its incumbent
    is the acyclic local search's.
    """
    opts = take_options("brute-force", options, DEFAULTS)
    sharding_settings(graph, opts)  # bad settings: one line, before the search
    k = num_components(graph, topology, opts["stages"])
    if opts["incumbent"] not in ("heuristic", "none"):
        raise ShardplanError(f"option incumbent must be heuristic or none, got "
                             f"{opts['incumbent']!r}")
    restarts = check_int_option("incumbent_restarts", opts["incumbent_restarts"])
    start = check_start(opts["start"])
    acyclic = check_bool_option("acyclic", opts["acyclic"])
    t0 = time.monotonic()
    deadline, end = split_deadline(t0, time_limit, acyclic)

    def exact(constrained: bool, until: float | None, report: Progress | None
              ) -> tuple[np.ndarray, np.ndarray, str, _Search]:
        search = _Search(graph, topology.cost_matrix, k, until, time_limit, report,
                         acyclic=constrained)
        problem = flat_problem(graph, topology, k, acyclic=constrained)
        if opts["incumbent"] == "heuristic":
            inc = run_restarts(problem, start=start, seed=seed, restarts=restarts, workers=1,
                               deadline=until, max_iterations=1000, clock_zero=t0).best.outcome
            order = np.asarray(search.order)
            devs = inc.placement[inc.assignment[order]].tolist()
            value = inc.cost  # recomputed exactly below by make_plan
            search.best, search.best_dev = value + search.eps, devs
            search.trace.append((time.monotonic() - t0, value))
        search.run()
        if search.best_dev is None:  # timed out before the first leaf: the topological split
            out = run_restart(problem, "topo", seed, 0, None, 0).outcome
            assignment, placement = out.assignment, out.placement
        else:
            devs_by_node = np.empty(graph.num_nodes, dtype=np.int64)
            devs_by_node[np.asarray(search.order)] = search.best_dev
            placement = np.unique(devs_by_node)
            assignment = np.searchsorted(placement, devs_by_node)
        return assignment, placement, "timed_out" if search.timed_out else "optimal", search

    assignment, placement, status, search = exact(acyclic, deadline, progress)
    free = None
    if acyclic:
        fa, fp, f_status, _ = exact(False, end, None)
        free = (fa, fp, f_status)
    both = status == "optimal" and (free is None or free[2] == "optimal")
    plan = make_plan(graph, topology, "brute-force", assignment, placement, status=status,
                     seed=seed, options=opts, seconds=time.monotonic() - t0,
                     exact=status == "optimal",
                     meta={"acyclic": acyclic_report(graph, topology, assignment, placement,
                                                     free, exact=both)})
    stats = {"k": k, "nodes": search.nodes, "trace": [list(p) for p in search.trace],
             "device_classes": len(search.class_members)}
    return Result(plan, stats)
