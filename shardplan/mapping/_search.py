"""Parmesan's optimal device mapping: Algorithm 1 (binary search on the target) and its inner
depth-first backtracking (Algorithm 2, appendix D -- not in our text; rebuilt from section
5.1's description).

Inner search (:class:`P2PSearch`, :class:`AllreduceSearch`): does a mapping with every stage
time <= t exist? Replicas of stages (the vertices of G') are assigned one at a time in a
fixed order; a device is tried for vertex v only if every stage time that the assignment
fixes or bounds stays <= t. The paper checks a stage once its time is fully determined (its
"checking scheme"); we check earlier and never later, with *partial* lower bounds that are
exact once determined:

- p2p: the bound of a placed vertex u is ``C[s_u, p(u)]`` plus, for each adjacent stage, the
  exact transfer cost if that neighbour is placed and the cheapest cost from ``p(u)`` to any
  other device if not. Placing v on d raises the bounds of v's placed neighbours and fixes
  v's own; all of them over every free d at once (one NumPy pass per vertex). At the start
  of every replica the "cheapest other device" is recomputed over the devices still free
  (earlier replicas hold the rest for good in that subtree), which tightens every later
  bound.
- all-reduce: a stage's time is ``max C over its placed replicas + max over its placed ring
  links``, plus the least possible next ring link; before a stage's first replica, the
  least possible slowest link of any ring of R free allowed devices
  (:func:`~shardplan.mapping._bounds.ring_bottleneck`) must fit.
- both: a device is allowed for stage s only if its eq. 8 / 9 bound is <= t, and after every
  placement each stage must still have a free allowed device for each unplaced replica.

- link contention (p2p and overlap views on topologies with links): a placement adds its
  transfers' bytes to the loads of the links on their routes, which can raise the time of
  any placed replica whose transfers cross those links, not only of its neighbours. The
  vectorised check over the candidates adds to the bounds above the contention each new
  transfer already sees (lower bounds: loads only grow); each candidate tried is then
  placed for real, the contention extra of every placed transfer recomputed from the link
  loads, and every placed replica checked against t (O(K H) for K placed transfers of H
  hops), undone on backtrack. A leaf's times are therefore exact.

Order: p2p places replica 0's stages (starting from the heaviest-talking stage, then always
the stage with most bytes to the placed ones), then replica 1 in the same order, ...;
all-reduce places all replicas of the tightest stage (largest eq. 9 bound) first, then the
next stage. Candidates are tried cheapest-bound first, so the first leaf is a greedy mapping
(the "heuristic mapping" of the initial upper bound).

Symmetry (exact: the search explores the lexicographically smallest mapping of every class
of equivalent ones, which satisfies all rules at once):

- twin devices: d and e are twins when swapping them is an automorphism of the topology
  (same peak FLOP/s, same latency and bandwidth to every other device, same between them);
  among the free devices of a twin class only the lowest id is tried (identical GPUs in a
  box, identical devices of a block of ``random-blk-*``);
- identical replicas (p2p): replicas are interchangeable copies, so replica r's first
  vertex gets a higher device id than replica r-1's;
- ring (all-reduce): eq. 7 is invariant under rotating and reflecting a stage's ring, so
  replica 0 gets the ring's lowest id and, for R >= 3 and a symmetric bandwidth matrix (a
  reflection reverses the links), replica R-1 a higher id than replica 1;
- grid automorphisms (:mod:`shardplan.mapping._symmetry`: translations of tori, reflections,
  axis swaps): a vertex's device must be the smallest of its orbit under the automorphisms
  that fix every device placed so far (on a torus the first vertex goes to device 0 only).
  With link contention, twins and automorphisms must also map every route onto the route
  of the mapped pair (:func:`~shardplan.mapping._stage_time.routes_preserved`); single-path
  routing breaks ties between equal paths one way, so few grid symmetries survive.

All rules prefer low ids, so before searching the devices are relabelled best first (by
their eq. 8 / 9 bound, :func:`make_search`); the cheapest-first value order then agrees with
the rules instead of fighting them. Outcomes come back in the caller's ids.

Several targets concurrently (section 5.2's "multi-threaded batch"): Python threads do not
run in parallel, so with ``workers > 1`` each round searches ``workers`` targets that split
the interval evenly, in forked worker processes; the interval becomes (largest proven-
infeasible target, smallest found value). With ``workers = 1`` it is plain bisection.

Termination: bisection stops when the interval is below ``epsilon`` (relative), then one
last search at a target just below the best value (relative 1e-9) proves it optimal; a
target that hits a time limit counts as "not found" (the paper's heuristic) and makes the
status ``timed_out``.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardplan._rng import make_rng
from shardplan._workers import process_pool
from shardplan.mapping._bounds import (
    allreduce_node_bounds,
    lower_bound,
    min_pair_costs,
    p2p_node_bounds,
    ring_bottleneck,
)
from shardplan.mapping._local import improve
from shardplan.mapping._stage_time import (
    MappingProblem,
    permute_devices,
    routes_preserved,
    stage_times,
)

__all__ = ["AllreduceSearch", "P2PSearch", "SearchOutcome", "consecutive_devices",
           "make_search", "solve", "twin_classes"]

_STRICT = 1e-9
_FINITE = 1e300


class _Timeout(Exception):
    pass


def _value_hash(m: np.ndarray) -> np.ndarray:
    """A 64-bit mix of every entry's float bits (``-0.0`` read as ``0.0``); equal values hash
    equal. Wrapping uint64 arithmetic."""
    h = (np.asarray(m, dtype=np.float64) + 0.0).view(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    h ^= h >> np.uint64(31)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(29)
    return h


def _twin_candidates(problem: MappingProblem, block: int = 256) -> list[np.ndarray]:
    """Per device d, the devices e > d that may be its twin: a necessary condition tested on
    hashes for all pairs at once in O(D^2) (exact checks follow in :func:`twin_classes`).

    With ``f`` a hash of values and random weights ``r``, ``c`` per device, twins d and e have
    ``T[d, e] == T[e, d]`` where ``T[d, e] = sum over x not in {d, e} of f(m[d, x]) r_x +
    f(m[x, d]) c_x`` (summed over both matrices): row d equals row e outside {d, e}, and so do
    the columns. ``T[d, e]`` is a row sum less the one term of column e, so all of T costs
    O(D^2), computed in blocks of ``block`` rows."""
    d_count = problem.device_flops.size
    rng = np.random.default_rng(0x7417)
    parts = []
    for m in (problem.latency, problem.inv_bandwidth):
        f = _value_hash(m)
        np.fill_diagonal(f, np.uint64(0))
        r = rng.integers(1, 2**63, size=d_count, dtype=np.uint64) | np.uint64(1)
        c = rng.integers(1, 2**63, size=d_count, dtype=np.uint64) | np.uint64(1)
        k = (f * r[None, :]).sum(axis=1, dtype=np.uint64) + \
            (f * c[:, None]).sum(axis=0, dtype=np.uint64)
        parts.append((f, r, c, k))
    fl = problem.device_flops
    out: list[np.ndarray] = []
    idx = np.arange(d_count)
    for lo in range(0, d_count, block):
        rows = idx[lo:lo + block]
        t = np.zeros((rows.size, d_count), dtype=np.uint64)
        tt = np.zeros((rows.size, d_count), dtype=np.uint64)
        for f, r, c, k in parts:
            t += k[rows, None] - f[rows, :] * r[None, :] - f[:, rows].T * c[None, :]
            tt += k[None, :] - f[:, rows].T * r[rows, None] - f[rows, :] * c[rows, None]
        cand = (t == tt) & (fl[rows, None] == fl[None, :]) & (idx[None, :] > rows[:, None])
        out.extend(np.flatnonzero(row) for row in cand)
    return out


def twin_classes(problem: MappingProblem) -> np.ndarray:
    """Class id of every device (its lowest twin's id): swapping two devices of one class is
    an automorphism of the topology. Exact float equality.

    Candidate pairs come from a hash test over all pairs (:func:`_twin_candidates`, O(D^2));
    each candidate is then checked exactly against its class's lowest device, O(D) a pair.
    O(D^2 + D x candidates): O(D^2) when there are no twins (a random or measured topology)
    and when every device is a twin of device 0 (a flat one)."""
    lat, ib, fl = problem.latency, problem.inv_bandwidth, problem.device_flops
    d_count = fl.size
    cls = np.arange(d_count)
    candidates = _twin_candidates(problem)
    for d in range(d_count):
        if cls[d] != d:
            continue
        rest = candidates[d]
        rest = rest[cls[rest] == rest]
        if rest.size == 0:
            continue
        others = np.ones((rest.size, d_count), dtype=bool)
        others[:, d] = False
        others[np.arange(rest.size), rest] = False
        ok = fl[rest] == fl[d]
        for m in (lat, ib):
            row = np.where(others, m[rest] == m[d][None, :], True).all(axis=1)
            col = np.where(others, m[:, d][None, :] == m[:, rest].T, True).all(axis=1)
            ok &= row & col & (m[d, rest] == m[rest, d])
        if problem.contention and problem.links is not None:  # swaps must keep the routes
            ids = problem.topology_ids(np.arange(d_count))
            for j in np.flatnonzero(ok):
                g = np.arange(problem.links.next_hop.shape[0])
                g[ids[d]], g[ids[rest[j]]] = ids[rest[j]], ids[d]
                ok[j] = routes_preserved(problem.links, g)
        cls[rest[ok]] = d
    # Twin-ness with one representative is an equivalence for these matrices; check pairs.
    return cls


def _first_free_mask(free: np.ndarray, cls: np.ndarray | None) -> np.ndarray:
    if cls is None:
        return free
    ids = np.flatnonzero(free)
    _, first = np.unique(cls[ids], return_index=True)
    out = np.zeros_like(free)
    out[ids[first]] = True
    return out


@dataclass(frozen=True)
class SearchOutcome:
    """One inner search: ``found`` (then ``devices``, ``value``), ``infeasible`` or
    ``timeout``; ``nodes`` explored."""

    status: str
    devices: np.ndarray | None
    value: float
    nodes: int


class _Base:
    model = ""

    def __init__(self, problem: MappingProblem, node_bounds: np.ndarray,
                 use_symmetry: bool = True) -> None:
        self.p = problem
        self.S, self.R, self.D = problem.num_stages, problem.num_replicas, problem.num_devices
        self.node_bounds = node_bounds
        cls = twin_classes(problem) if use_symmetry else np.arange(self.D)
        self.cls = cls if (cls != np.arange(self.D)).any() else None
        self.use_symmetry = self.symmetry = use_symmetry
        self.group = problem.automorphisms if use_symmetry else None
        self.ids = np.arange(self.D)
        self.perm: np.ndarray | None = None  # search id -> caller's device id

    def search(self, target: float, deadline: float | None, *,
               symmetry: bool | None = None) -> SearchOutcome:
        """Is there a mapping with every stage time <= ``target``? Stops at ``deadline``
        (``time.monotonic``). ``symmetry=False`` drops the symmetry rules for this call (the
        greedy first leaf: they only prune, and a leaf found without them is as valid)."""
        self.symmetry = self.use_symmetry if symmetry is None else symmetry
        self.target = float(target)
        self.deadline = deadline
        self.nodes = 0
        self.allowed = self.node_bounds <= self.target
        self.dev = np.full((self.S, self.R), -1, dtype=np.int64)
        self.free = np.ones(self.D, dtype=bool)
        self.remaining = np.full(self.S, self.R, dtype=np.int64)
        self.stab = None if self.group is None else np.ones(self.group.shape[0], dtype=bool)
        if (self.allowed.sum(axis=1) < self.remaining).any():
            return SearchOutcome("infeasible", None, math.inf, 0)
        self._reset()
        # One Python frame (two for p2p) per placed vertex: S x R can pass the default limit.
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 3 * self.S * self.R + 1000))
        try:
            ok = self._dfs(0)
        except _Timeout:
            return SearchOutcome("timeout", None, math.inf, self.nodes)
        finally:
            sys.setrecursionlimit(limit)
        if not ok:
            return SearchOutcome("infeasible", None, math.inf, self.nodes)
        value = float(stage_times(self.p, self.dev, self.model).max())
        dev = self.dev.copy() if self.perm is None else self.perm[self.dev]
        return SearchOutcome("found", dev, value, self.nodes)

    def _orbit_min(self) -> np.ndarray | None:
        """Devices that are the smallest of their orbit under the automorphisms fixing every
        placed device (None: no such symmetry left)."""
        if not self.symmetry or self.stab is None:
            return None
        sub = self.group[self.stab]
        if sub.shape[0] <= 1:
            return None
        return sub.min(axis=0) == self.ids

    def _fix(self, d: int) -> np.ndarray | None:
        """Restrict the stabiliser to the automorphisms fixing ``d``; returns the old one."""
        old = self.stab
        if old is not None:
            self.stab = old & (self.group[:, d] == d)
        return old

    def _counts_ok(self) -> bool:
        """Every stage still has a free allowed device for each of its unplaced replicas
        (a necessary condition, checked after every placement)."""
        have = (self.allowed & self.free[None, :]).sum(axis=1)
        return bool((have >= self.remaining).all())

    def _tick(self) -> None:
        # Every node: a node is O(D) NumPy work, far more than reading the clock, and on
        # thousands of devices a few hundred nodes already take a noticeable time.
        self.nodes += 1
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise _Timeout

    def _reset(self) -> None:
        raise NotImplementedError

    def _dfs(self, i: int) -> bool:
        raise NotImplementedError


def _p2p_stage_order(problem: MappingProblem) -> list[int]:
    """Stage order inside a replica: the stage with most bytes first, then always the stage
    adjacent to most placed stages (ties: most bytes to them, most bytes in all, id)."""
    m, adj = problem.stage_bytes, problem.adjacent
    order: list[int] = []
    left = set(range(problem.num_stages))
    while left:
        placed = np.array(order, dtype=np.int64)

        def key(s: int, placed: np.ndarray = placed) -> tuple[float, float, float, int]:
            to_placed = float(m[s, placed].sum()) if placed.size else 0.0
            n_adj = float(adj[s, placed].sum()) if placed.size else 0.0
            return (-n_adj, -to_placed, -float(m[s].sum()), s)

        s = min(left, key=key)
        order.append(s)
        left.remove(s)
    return order


class P2PSearch(_Base):
    """Inner search for the ``p2p`` and ``overlap`` views (see the module docstring).

    A placed replica's bound is kept as its communication part (exact for placed
    neighbours, the cheapest possible for the others) and combined with its compute as the
    view does; under ``overlap`` the stage's all-reduce (the largest ring link placed so
    far, weighted) is added to every replica of the stage."""

    model = "p2p"

    def __init__(self, problem: MappingProblem, node_bounds: np.ndarray | None = None,
                 use_symmetry: bool = True, check: Callable[[], None] | None = None) -> None:
        if node_bounds is None:
            node_bounds = p2p_node_bounds(problem, check=check)
        super().__init__(problem, node_bounds, use_symmetry)
        self.model = problem.view
        minc = min_pair_costs(problem, check=check)
        self.base = np.zeros_like(problem.compute)  # cheapest communication per (s, d)
        for (s, _t), v in minc.items():
            self.base[s] += v
        self.minc = dict(minc)
        order = _p2p_stage_order(problem)
        adj = problem.adjacent
        self.stage_order = order
        pos = {s: i for i, s in enumerate(order)}
        # Pair costs are ``tensors * L + bytes * I`` with the view's pair matrices (inf on the
        # diagonal and where no route, 0 without bytes): rows are computed when needed from
        # the (D, D) matrices and their transposes rather than stored per adjacent pair,
        # which took S^2 D^2 memory (gigabytes on a thousand devices).
        self.lat, self.ib = problem.pair_latency, problem.pair_inv_bandwidth
        self.lat_t, self.ib_t = self.lat.T.copy(), self.ib.T.copy()
        self.minc0 = minc
        self.base0 = self.base.copy()
        # For each position in a replica: (earlier neighbour stage t, tensors, bytes).
        self.links: list[list[tuple[int, float, float]]] = []
        for s in order:
            self.links.append([(t, float(problem.tensors[s, t]), float(problem.stage_bytes[s, t]))
                               for t in order[:pos[s]] if adj[s, t]])
        # the all-reduce term (overlap with replicas): rings break the symmetry of replicas
        self.ar_on = bool(problem.ar_weight) and self.R > 1 and \
            bool((problem.param_bytes > 0).any())
        # (stage, replica, position of the stage in a replica's order): replica by replica
        # (the cheapest partners are refreshed between replicas); with the all-reduce term,
        # stage by stage instead, so that every ring closes early and prunes
        self.order = [(s, r, k) for s, r, k in (
            ((s, r, k) for k, s in enumerate(order) for r in range(self.R)) if self.ar_on
            else ((s, r, k) for r in range(self.R) for k, s in enumerate(order)))]
        self.reflect = bool(np.array_equal(problem.inv_bandwidth, problem.inv_bandwidth.T)
                            and np.array_equal(problem.latency, problem.latency.T))
        self.contended = bool(problem.contention) and problem.links is not None
        if self.contended:
            ts, _ = problem.transfer_stages
            cap = int(ts.size) * self.R
            hops = problem.links.max_hops
            self.tr_paths = np.full((cap, hops), -1, dtype=np.int64)
            self.tr_sender = np.zeros(cap, dtype=np.int64)  # device
            self.tr_bytes = np.zeros(cap)
            self.tr_base = np.zeros(cap)  # bytes / bottleneck bandwidth
            self.tr_sv = np.zeros(cap, dtype=np.int64)  # sender vertex s * R + r
            self.tr_rv = np.zeros(cap, dtype=np.int64)  # receiver vertex
            self.link_inv = np.append(problem.links.inv_bandwidth, 0.0)  # [-1]: no link
            self.p2p_view = problem.view == "p2p"
            self.srow = np.repeat(np.arange(self.S)[:, None], self.R, axis=1)

    def _cost_line(self, lat: np.ndarray, ib: np.ndarray, tensors: float, nbytes: float,
                   x: int) -> np.ndarray:
        """Row x of the pair cost ``tensors * lat + nbytes * ib`` (0 without bytes, inf where
        no route), entry x set to inf. O(D)."""
        if nbytes <= 0:
            c = np.zeros(self.D)
        else:
            with np.errstate(invalid="ignore"):
                c = tensors * lat[x] + nbytes * ib[x]
            c[np.isnan(c)] = np.inf
        c[x] = np.inf
        return c

    def _reset(self) -> None:
        self.bound = np.zeros((self.S, self.R))  # communication part of placed replicas
        self.ar = np.zeros(self.S)  # largest ring link placed so far, per stage
        self.minc = dict(self.minc0)
        self.base = self.base0.copy()
        self.extra = np.zeros((self.S, self.R))  # contention's extra seconds so far
        if self.contended:
            num_links = self.p.links.num_links
            self.load = np.zeros(num_links + 1)  # bytes per link; [-1] padding stays 0
            self.own = np.zeros((self.D, num_links + 1))  # per sending device
            self.ntr = 0

    def _contended_lines(self, x: int, nbytes: float) -> tuple[np.ndarray, np.ndarray]:
        """For every device d, the contention seconds (over the uncontended ones) that a new
        transfer of ``nbytes`` from d to x, and one from x to d, see from the transfers
        placed so far: lower bounds of their final values (loads only grow), shape (D,)
        each (0 where no route: the pair already costs inf). O(D H)."""
        xs = np.full(self.D, x)
        res = []
        for src, dst, ib in ((self.ids, xs, self.p.inv_bandwidth[:, x]),
                             (xs, self.ids, self.p.inv_bandwidth[x])):
            pth = self.p.paths(src, dst)
            other = np.maximum(self.load[pth] - self.own[src[:, None], pth], 0.0)
            t = ((nbytes + other) * self.link_inv[pth]).max(axis=1) - nbytes * ib
            res.append(np.where(np.isfinite(ib), np.maximum(t, 0.0), 0.0))
        return res[0], res[1]

    def _contend(self, s: int, r: int, d: int, partners: list[tuple[int, float]]
                 ) -> tuple[bool, tuple[Any, ...]]:
        """Replica r of stage s was just placed on d (its bounds set): add its transfers
        with its placed ``partners`` (stage, bytes) to the link loads, recompute the
        contention extra of every placed replica, and check every placed replica's time
        against the target: ``(fits, undo)``; the caller passes ``undo`` to
        :meth:`_uncontend` on failure or backtrack. O(K H + S R) for K placed transfers of
        H hops."""
        p = self.p
        undo: tuple[Any, ...] = (self.load.copy(), self.extra, self.ntr, None, None)
        if partners:
            m = len(partners)
            xs = self.dev[[u for u, _ in partners], r]
            senders = np.append(xs, d)
            undo = (*undo[:3], self.own[senders], senders)
            nb = np.array([b for _, b in partners])
            src = np.concatenate([np.full(m, d), xs])
            dst = np.concatenate([xs, np.full(m, d)])
            sv = np.array([s * self.R + r] * m + [u * self.R + r for u, _ in partners])
            w = np.concatenate([nb, nb])
            paths = p.paths(src, dst)
            lo, hi = self.ntr, self.ntr + 2 * m
            self.tr_paths[lo:hi] = paths
            self.tr_sender[lo:hi] = src
            self.tr_bytes[lo:hi] = w
            self.tr_base[lo:hi] = w * p.inv_bandwidth[src, dst]
            self.tr_sv[lo:hi] = sv
            self.tr_rv[lo:hi] = np.concatenate([sv[m:], sv[:m]])
            self.ntr = hi
            on = paths >= 0  # a route crosses a link once: no repeats within a row
            rows = np.broadcast_to(np.arange(2 * m)[:, None], paths.shape)[on]
            np.add.at(self.load, paths[on], w[rows])
            np.add.at(self.own, (src[rows], paths[on]), w[rows])
        n = self.ntr
        if n:
            pth = self.tr_paths[:n]
            other = np.maximum(self.load[pth] - self.own[self.tr_sender[:n, None], pth], 0.0)
            val = ((self.tr_bytes[:n, None] + other) * self.link_inv[pth]).max(axis=1)
            base = self.tr_base[:n]
            with np.errstate(invalid="ignore"):  # inf - inf: no route, already inf
                ext = np.where(np.isfinite(base), np.maximum(val - base, 0.0), 0.0)
            sr = self.S * self.R
            extra = np.bincount(self.tr_sv[:n], weights=ext, minlength=sr)
            if self.p2p_view:
                extra += np.bincount(self.tr_rv[:n], weights=ext, minlength=sr)
            self.extra = extra.reshape(self.S, self.R)
        placed = self.dev >= 0
        srow = self.srow[placed]
        t = self._time(srow, self.dev[placed], self.bound[placed] + self.extra[placed])
        if self.ar_on:
            t = t + self.p.ar_weight * self.ar[srow]
        return bool((t <= self.target).all()), undo

    def _uncontend(self, undo: tuple[Any, ...]) -> None:
        load, extra, ntr, rows, senders = undo
        self.load, self.extra, self.ntr = load, extra, ntr
        if senders is not None:
            self.own[senders] = rows

    def _time(self, s: int, d: Any, comm: Any) -> Any:
        return self.p.combine(self.p.compute[s, d], comm)

    def _refresh(self) -> None:
        """At the start of a replica: the cheapest partner of every device among the *free*
        devices only (earlier replicas hold the others for good in this subtree), which
        raises every bound of this replica and of the ones after it. Pairs with the same
        tensors and bytes (both directions of a pair, at least) share one O(D F) minimum."""
        free = np.flatnonzero(self.free)
        self.base = np.zeros_like(self.p.compute)
        done: dict[tuple[float, float], np.ndarray] = {}
        for key in self.minc0:
            tens, nbytes = float(self.p.tensors[key]), float(self.p.stage_bytes[key])
            m = done.get((tens, nbytes))
            if m is None:
                if self.deadline is not None and time.monotonic() > self.deadline:
                    raise _Timeout  # O(D F) per pair: thousands of devices take seconds
                if not free.size:
                    m = np.full(self.D, np.inf)
                elif nbytes <= 0:
                    m = np.zeros(self.D)
                else:
                    with np.errstate(invalid="ignore"):
                        sub = tens * self.lat[:, free] + nbytes * self.ib[:, free]
                    sub[np.isnan(sub)] = np.inf
                    sub[free, np.arange(free.size)] = np.inf
                    m = sub.min(axis=1)
                done[(tens, nbytes)] = m
            self.minc[key] = m
            self.base[key[0]] += m
        with np.errstate(invalid="ignore"):
            low = self.p.combine(self.p.compute, self.base)
        self.allowed = self.allowed & (low <= self.target)

    def _dfs(self, i: int) -> bool:
        if i == len(self.order):
            return True
        self._tick()
        s, r, k = self.order[i]
        if k == 0 and r > 0 and not self.ar_on:
            if self.symmetry and not (self.free & self.allowed[s]
                                      & (self.ids > self.dev[s, r - 1])).any():
                return False  # cheap test before the refresh
            saved_state = (self.base, self.minc, self.allowed)
            self.minc = dict(self.minc)
            self._refresh()
            try:
                if not self._counts_ok():
                    return False
                return self._place(i, s, r, k)
            finally:
                self.base, self.minc, self.allowed = saved_state
        return self._place(i, s, r, k)

    def _place(self, i: int, s: int, r: int, k: int) -> bool:
        t = self.target
        p = self.p
        cand = self.free & self.allowed[s]
        if self.symmetry:
            cand &= _first_free_mask(self.free, self.cls)
            if k == 0 and r > 0:
                if not self.ar_on or self.R <= 2:  # replicas are interchangeable
                    cand &= self.ids > self.dev[s, r - 1]
                else:  # only rotating (and, symmetric, reflecting) the rings is free
                    cand &= self.ids > self.dev[s, 0]
                    if r == self.R - 1 and self.reflect:
                        cand &= self.ids > self.dev[s, 1]
            orbit = self._orbit_min()
            if orbit is not None:
                cand &= orbit
        if not cand.any():
            return False
        w = p.ar_weight if self.ar_on else 0.0
        val = self.base[s].copy()
        own_more = 0.0  # contention each new transfer sees already, for the own bound
        worst = None
        nbr_new = []
        with np.errstate(invalid="ignore"):  # inf - inf: an unroutable pair, never <= t
            for u, tens, nbytes in self.links[k]:
                x = self.dev[u, r]
                # What s on each d pays to u on x; what u on x pays to s on each d.
                own = self._cost_line(self.lat_t, self.ib_t, tens, nbytes, x)
                nbr = self._cost_line(self.lat, self.ib, tens, nbytes, x)
                val += own - self.minc[(s, u)]
                nb = self.bound[u, r] + nbr - self.minc[(u, s)][x]
                nbr_new.append((u, nb))
                more = self.extra[u, r]
                if self.contended and nbytes > 0:
                    out, back = self._contended_lines(x, nbytes)
                    own_more = own_more + (out + back if self.p2p_view else out)
                    more = more + (out + back if self.p2p_view else back)
                nt = self._time(u, x, nb + more) + w * self.ar[u]
                worst = nt if worst is None else np.maximum(worst, nt)
            own_t = self._time(s, self.ids, val + own_more)
            if w:
                new_ar = np.full(self.D, self.ar[s])
                if r >= 1:
                    new_ar = np.maximum(new_ar, p.ring_cost(s, self.dev[s, r - 1], self.ids))
                if r == self.R - 1:
                    new_ar = np.maximum(new_ar, p.ring_cost(s, self.ids, self.dev[s, 0]))
                placed = [self._time(s, self.dev[s, q], self.bound[s, q] + self.extra[s, q])
                          for q in range(r)]
                own_t = np.maximum(own_t, max(placed, default=0.0)) + w * new_ar
            else:
                new_ar = None
            worst = own_t if worst is None else np.maximum(worst, own_t)
            ok = cand & (worst <= t)
        choices = np.flatnonzero(ok)
        if choices.size == 0:
            return False
        choices = choices[np.argsort(worst[choices], kind="stable")]
        saved = [(u, self.bound[u, r]) for u, _ in nbr_new]
        saved_ar = self.ar[s]
        partners = [(u, nbytes) for u, _tens, nbytes in self.links[k] if nbytes > 0] \
            if self.contended else []
        for d in choices:
            d = int(d)
            self.dev[s, r] = d
            self.free[d] = False
            self.bound[s, r] = val[d]
            for u, nb in nbr_new:
                self.bound[u, r] = nb[d]
            if new_ar is not None:
                self.ar[s] = new_ar[d]
            self.remaining[s] -= 1
            old = self._fix(d)
            fits, undo = self._contend(s, r, d, partners) if self.contended else (True, None)
            if fits and self._counts_ok() and self._dfs(i + 1):
                return True
            if undo is not None:
                self._uncontend(undo)
            self.stab = old
            self.remaining[s] += 1
            self.free[d] = True
            self.dev[s, r] = -1
            self.ar[s] = saved_ar
        for u, b in saved:
            self.bound[u, r] = b
        return False


class AllreduceSearch(_Base):
    """Inner search for equation 7 (see the module docstring)."""

    model = "allreduce"

    def __init__(self, problem: MappingProblem, node_bounds: np.ndarray | None = None,
                 use_symmetry: bool = True) -> None:
        if node_bounds is None:
            node_bounds = allreduce_node_bounds(problem)
        super().__init__(problem, node_bounds, use_symmetry)
        r = self.R
        kth = np.partition(node_bounds, r - 1, axis=1)[:, r - 1]
        self.stage_order = [int(s) for s in np.argsort(-kth, kind="stable")]
        self.order = [(s, q) for s in self.stage_order for q in range(r)]
        ib = problem.inv_bandwidth.copy()
        np.fill_diagonal(ib, np.inf)
        self.ib = ib
        lat = problem.latency.copy()
        np.fill_diagonal(lat, np.inf)
        self.k = problem.allreduce_factor
        self.a = problem.allreduce_latency_factor
        self.next_link = np.maximum(ib.min(axis=1), 0.0)  # least link out of d
        self.next_lat = np.maximum(lat.min(axis=1), 0.0)
        # Reflecting a ring reverses its links: a symmetry only if bandwidth is symmetric.
        self.reflect = bool(np.array_equal(ib, ib.T))

    def _reset(self) -> None:
        self.max_c = np.zeros(self.S)
        self.max_ar = np.zeros(self.S)

    def _ring_fits(self, s: int, k: float) -> bool:
        """Before a stage's first replica: can a ring of R free allowed devices meet the
        target? Its slowest link is at least :func:`ring_bottleneck` over those devices and
        its slowest replica computes at least the R-th smallest ``C``."""
        avail = np.flatnonzero(self.free & self.allowed[s])
        if avail.size < self.R:
            return False
        comp = float(np.partition(self.p.compute[s, avail], self.R - 1)[self.R - 1])
        ring = k * ring_bottleneck(self.p.inv_bandwidth, self.R, avail) + \
            self.a[s] * float(self.next_lat[avail].min())
        return comp + ring <= self.target

    def _dfs(self, i: int) -> bool:
        if i == len(self.order):
            return True
        self._tick()
        s, r = self.order[i]
        R = self.R
        cand = self.free & self.allowed[s]
        if self.symmetry:
            cand &= _first_free_mask(self.free, self.cls)
            if r >= 1:
                cand &= self.ids > self.dev[s, 0]
            if r == R - 1 and R >= 3 and self.reflect:
                cand &= self.ids > self.dev[s, 1]
            orbit = self._orbit_min()
            if orbit is not None:
                cand &= orbit
        if not cand.any():
            return False
        k = self.k[s]
        if r == 0 and R > 2 and k > 0 and not self._ring_fits(s, k):
            return False
        comp = np.maximum(self.max_c[s], self.p.compute[s])
        if R == 1 or k == 0:
            ar = np.zeros(self.D)
            ar_bound = ar
        else:
            ar = np.full(self.D, self.max_ar[s])
            if r >= 1:
                ar = np.maximum(ar, self.p.ring_cost(s, self.dev[s, r - 1], self.ids))
            if r == R - 1:
                ar = np.maximum(ar, self.p.ring_cost(s, self.ids, self.dev[s, 0]))
                ar_bound = ar
            else:
                ar_bound = np.maximum(ar, k * self.next_link + self.a[s] * self.next_lat)
        with np.errstate(invalid="ignore"):
            worst = comp + ar_bound
        ok = cand & (worst <= self.target)
        choices = np.flatnonzero(ok)
        if choices.size == 0:
            return False
        choices = choices[np.argsort(worst[choices], kind="stable")]
        saved = (self.max_c[s], self.max_ar[s])
        for d in choices:
            d = int(d)
            self.dev[s, r] = d
            self.free[d] = False
            self.max_c[s] = comp[d]
            self.max_ar[s] = ar[d]
            self.remaining[s] -= 1
            old = self._fix(d)
            if self._counts_ok() and self._dfs(i + 1):
                return True
            self.stab = old
            self.remaining[s] += 1
            self.free[d] = True
            self.dev[s, r] = -1
        self.max_c[s], self.max_ar[s] = saved
        return False


def make_search(problem: MappingProblem, model: str, use_symmetry: bool = True, *,
                deadline: float | None = None) -> _Base:
    """The inner search for ``model``. With symmetry, devices are first relabelled best
    first (by the eq. 8 / 9 bound of the first stage placed, p2p, or the mean over stages,
    all-reduce): the symmetry rules all prefer low ids, and so does the cheapest-first value
    order once the ids follow quality, so the two stop pulling apart. Outcomes are reported
    in the original ids.

    The set-up (the p2p bounds of equation 8 solve S x D assignment problems) checks
    ``deadline`` (``time.monotonic``) as it goes and raises ``_Timeout`` past it."""

    def check() -> None:
        if deadline is not None and time.monotonic() > deadline:
            raise _Timeout

    if model != "allreduce":
        nb = p2p_node_bounds(problem, check=check)
        key = nb[_p2p_stage_order(problem)[0]]
        if not use_symmetry:
            return P2PSearch(problem, nb, use_symmetry=False, check=check)
        perm = np.lexsort((np.arange(problem.num_devices), key))
        check()
        search: _Base = P2PSearch(permute_devices(problem, perm), nb[:, perm],
                                  use_symmetry=True, check=check)
    else:
        nb = allreduce_node_bounds(problem)
        key = np.where(np.isfinite(nb), nb, 1e300).mean(axis=0)
        if not use_symmetry:
            return AllreduceSearch(problem, nb, use_symmetry=False)
        perm = np.lexsort((np.arange(problem.num_devices), key))
        check()
        search = AllreduceSearch(permute_devices(problem, perm), nb[:, perm],
                                 use_symmetry=True)
    check()
    search.perm = perm
    return search


def consecutive_devices(num_stages: int, num_replicas: int, order: str = "stage-major"
                        ) -> np.ndarray:
    """The CS mapping: shape (S, R). ``stage-major`` puts stage s's replicas on devices
    ``s R .. s R + R - 1`` (replicas side by side, the all-reduce-friendly layout the paper
    describes); ``replica-major`` puts replica r's pipeline on ``r S .. r S + S - 1``."""
    ids = np.arange(num_stages * num_replicas, dtype=np.int64)
    if order == "stage-major":
        return ids.reshape(num_stages, num_replicas)
    return ids.reshape(num_replicas, num_stages).T.copy()


# ---------------------------------------------------------------------------- worker processes
_WORKER: dict[str, Any] = {}


def _worker_search(target: float, deadline: float | None) -> SearchOutcome:
    return _WORKER["search"].search(target, deadline)


@dataclass(frozen=True)
class Solution:
    """What :func:`solve` returns: the mapping (S, R), its value, the best proven lower
    bound (None when the time limit ended the set-up before any bound was known),
    ``optimal`` or ``timed_out``, and search statistics."""

    devices: np.ndarray
    value: float
    lower_bound: float | None
    status: str
    stats: dict[str, Any]


def solve(problem: MappingProblem, model: str, *, seed: int = 0, time_limit: float | None = None,
          workers: int = 1, epsilon: float = 1e-4, target_time_limit: float | None = None,
          use_symmetry: bool = True, local_search: bool = True,
          progress: Callable[[str, float, float], None] | None = None) -> Solution:
    """Algorithm 1: the optimal mapping for ``model`` (see the module docstring).

    Returns the best mapping, its value, the best proven lower bound and a status
    (``optimal`` or ``timed_out``). Worst case O(D!) inner-search nodes (the problem is
    NP-complete, Theorem 6.1), each O(deg D) NumPy work.
    """
    t0 = time.monotonic()
    deadline = None if time_limit is None else t0 + float(time_limit)
    rng = make_rng(seed)
    n_used = problem.num_stages * problem.num_replicas
    starts = {
        "consecutive": consecutive_devices(problem.num_stages, problem.num_replicas),
        "random": rng.permutation(problem.num_devices)[:n_used].reshape(
            problem.num_stages, problem.num_replicas),
    }
    best_dev, best = None, math.inf
    initial = {}
    for name, dev in starts.items():
        v = float(stage_times(problem, dev, model).max())
        initial[name] = v
        if best_dev is None or v < best:
            best_dev, best = dev, v
    try:
        search = make_search(problem, model, use_symmetry, deadline=deadline)
    except _Timeout:  # the set-up alone outlasted the time limit: the best start, no bound
        return Solution(np.asarray(best_dev, dtype=np.int64), best, None, "timed_out",
                        {"model": model, "initial": initial, "setup_timed_out": True,
                         "rounds": 0, "nodes": 0, "targets": 0, "workers": workers,
                         "search_seconds": time.monotonic() - t0})
    lo = lower_bound(problem, model, search.node_bounds)
    proven = lo
    greedy = search.search(math.inf, deadline, symmetry=False)
    stats: dict[str, Any] = {"model": model, "initial_lower_bound": lo, "initial": initial,
                             "rounds": 0, "nodes": greedy.nodes, "targets": 0,
                             "twin_classes": int(np.unique(search.cls).size)
                             if search.cls is not None else problem.num_devices}
    if greedy.status == "found":
        stats["initial"]["greedy"] = greedy.value
        if greedy.value < best:
            best_dev, best = greedy.devices, greedy.value
    timed_out = greedy.status == "timeout"  # the overall deadline passed
    if local_search and not timed_out and math.isfinite(best):
        ls_deadline = None if time_limit is None else \
            min(deadline, time.monotonic() + 0.25 * float(time_limit))
        dev, steps = improve(problem, model, best_dev, deadline=ls_deadline)
        value = float(stage_times(problem, dev, model).max())
        stats["initial"]["local_search"] = value
        stats["local_search_steps"] = steps
        if value < best:
            best_dev, best = dev, value
    if not math.isfinite(best) and not timed_out:
        # Every start uses an unroutable pair: look for any mapping of finite time.
        out = search.search(_FINITE, deadline)
        stats["nodes"] += out.nodes
        timed_out = out.status == "timeout"
        if out.status == "found":
            best_dev, best = out.devices, out.value
    heuristic_timeouts = 0  # targets stopped by target_time_limit, counted "not found"
    hi = best
    use_pool = False
    if workers > 1 and not timed_out:
        import multiprocessing as mp

        if "fork" in mp.get_all_start_methods():
            _WORKER["search"] = search  # inherited by the forked workers
            use_pool = True
        else:  # pragma: no cover - no fork: plain bisection
            workers = 1
    try:
        # Workers die with this process and are terminated, not waited for, on Ctrl-C.
        with process_pool(workers) if use_pool else contextlib.nullcontext() as pool:
            while not timed_out and math.isfinite(hi) and hi > lo:
                if deadline is not None and time.monotonic() >= deadline:
                    timed_out = True
                    break
                if hi - lo <= epsilon * hi:
                    t = hi * (1.0 - _STRICT)
                    if t <= lo:
                        break
                    targets = [t]
                else:
                    k = workers if pool is not None else 1
                    targets = [lo + (hi - lo) * (j + 1) / (k + 1) for j in range(k)]
                stats["rounds"] += 1
                stats["targets"] += len(targets)
                tdl = deadline
                if target_time_limit is not None:
                    cap = time.monotonic() + float(target_time_limit)
                    tdl = cap if tdl is None else min(tdl, cap)
                if pool is not None and len(targets) > 1:
                    outs = list(pool.map(_worker_search, targets, [tdl] * len(targets)))
                else:
                    outs = [search.search(t, tdl) for t in targets]
                new_lo = lo
                for t, out in zip(targets, outs, strict=True):
                    stats["nodes"] += out.nodes
                    if out.status == "found":
                        if out.value < best:
                            best_dev, best = out.devices, out.value
                        hi = min(hi, out.value)
                    else:
                        new_lo = max(new_lo, t)
                        if out.status == "infeasible":
                            proven = max(proven, t)
                        else:
                            heuristic_timeouts += 1
                lo = min(new_lo, hi)
                if deadline is not None and time.monotonic() >= deadline:
                    timed_out = True
                if progress is not None:
                    gap = max(hi - lo, 0.0) / max(hi, 1e-300)
                    progress("map", stats["rounds"],
                             stats["rounds"] + math.log2(max(gap / epsilon, 1.0)) + 1)
    finally:
        _WORKER.clear()
    status = "timed_out" if timed_out or heuristic_timeouts else "optimal"
    if status == "optimal":
        proven = best
    stats["timed_out_targets"] = heuristic_timeouts
    stats["search_seconds"] = time.monotonic() - t0
    stats["workers"] = workers
    return Solution(np.asarray(best_dev, dtype=np.int64), best, min(proven, best), status,
                    stats)

