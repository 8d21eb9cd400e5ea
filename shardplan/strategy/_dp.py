"""PaSE's dynamic program over dependent sets and connected subsets (paper 004, section III).

Given the tables of :mod:`shardplan.strategy.tables` (node cost vectors, edge cost matrices)
and a vertex sequence, :func:`solve` computes recurrence (4): for the i-th vertex v,

    f(v, phi_D(v)) = min_c [ l(v, c) + sum_{u in N(v) & D(v)} t(v, c, u, phi_u)
                             + sum_{connected subsets C(w)} f(w, phi_D(w) with v = c) ]

where C(v), the connected set, is the vertices up to v reachable from v through vertices up to
v; D(v), the dependent set, the later neighbours of C(v); and the connected subsets are the
components of C(v) - {v}, each the connected set of its last vertex w (whose dependent set lies
in D(v) + {v}). A vertex whose dependent set is empty closes a component of the graph; the sum
of their minima is the optimum of equation (1) (Theorem 1). Each table is a NumPy array indexed
by the configurations of D(v) (axes in sequence order); minima over v's configurations are
taken by broadcasting, a chunk of v's configurations at a time so that the working array stays
near ``chunk_elements``. The best strategy is read back by visiting vertices in reverse order:
every vertex's dependent set is later in the sequence, so already decided.

Orderings: :func:`generate_seq` (Fig. 3: repeatedly take the vertex with the smallest tentative
dependent set, then merge its set into its members'), ties broken by node id (the paper is
silent); :func:`bfs_sequence` (section III-A: breadth-first from node 0), with which every
prefix is connected, so recurrence (4) reduces to recurrence (2).

Three exact reductions, not in the paper, keep the tables small (what makes the Transformer at
64 devices seconds instead of the prototype's half hour):

* table axes range over *classes* of a dependent vertex's configurations: two configurations
  of u in D(v) are one class when every term of v's recurrence involving u (the edge matrix's
  column, the children's tables) is identical for them (e.g. a consumer's splits of dimensions
  that are not in the tensor it reads);
* likewise v itself only tries the cheapest configuration of each class of identical
  interfaces;
* :func:`prune_dominated` drops configurations that another one beats whatever the
  neighbours do.

Complexity: O(sum_v K_v prod_{u in D(v)} K_u (1 + deg(v))) time, O(sum_v prod_{D(v)} K_u)
memory for the argmin tables (cost tables are freed once their parent consumed them); the K_u
here are class counts, at most the configuration counts. Large tables are minimised one
candidate at a time in place (contiguous passes); small ones a chunk of candidates at a time.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.strategy.tables import Tables

__all__ = ["DPResult", "TableTooLargeError", "bfs_sequence", "check_finite", "generate_seq",
           "greedy_choice", "lower_bound", "plan_tables", "prune_dominated", "solve"]


#: Tables of at least this many entries take :func:`solve`'s large-table branch.
LARGE_TABLE = 2048


class TableTooLargeError(ShardplanError):
    """The DP tables of this ordering would exceed the memory budget (Table I's OOM)."""


@dataclass(frozen=True)
class DPResult:
    """What :func:`solve` found."""

    choice: np.ndarray
    value: float
    status: str  # "optimal" or "timed_out"
    max_dependent: int
    max_table: int
    table_bytes: int
    sequence: tuple[int, ...]


def _adjacency(n: int, edges: Sequence[tuple[int, int, np.ndarray]]) -> list[set[int]]:
    adj: list[set[int]] = [set() for _ in range(n)]
    for u, v, _ in edges:
        adj[u].add(v)
        adj[v].add(u)
    return adj


def generate_seq(n: int, adj: Sequence[set[int]],
                 sizes: Sequence[int] | None = None) -> list[int]:
    """GenerateSeq (paper 004 Fig. 3): next, the vertex whose tentative dependent set is
    smallest. Ties (the paper is silent) go to the smallest table ``K_v prod_{u in D} K_u``
    when ``sizes`` (configurations per node) are given, then to the smallest id.
    O((n + m) D log n) with a lazy heap, D the largest tentative dependent set."""
    dep = [set(a) for a in adj]
    logk = np.log(np.asarray(sizes, dtype=np.float64)) if sizes is not None else np.zeros(n)

    def key(v: int) -> tuple[int, float, int]:
        return (len(dep[v]), round(float(logk[v] + sum(logk[u] for u in dep[v])), 9), v)

    done = [False] * n
    heap = [key(v) for v in range(n)]
    heapq.heapify(heap)
    seq: list[int] = []
    while heap:
        k = heapq.heappop(heap)
        v = k[2]
        if done[v] or k != key(v):
            continue
        done[v] = True
        seq.append(v)
        dv = dep[v]
        for u in dv:
            dep[u] = (dep[u] | dv) - {u, v}
            heapq.heappush(heap, key(u))
    return seq


def bfs_sequence(n: int, adj: Sequence[set[int]]) -> list[int]:
    """Breadth-first order from node 0 (then from the smallest unvisited node). O(n + m)."""
    seen = [False] * n
    seq: list[int] = []
    for root in range(n):
        if seen[root]:
            continue
        seen[root] = True
        queue = deque([root])
        while queue:
            v = queue.popleft()
            seq.append(v)
            for u in sorted(adj[v]):
                if not seen[u]:
                    seen[u] = True
                    queue.append(u)
    return seq


@dataclass(frozen=True)
class _Structure:
    sequence: list[int]
    dep: list[list[int]]  # per vertex, D(v) sorted by sequence position
    children: list[list[int]]
    parent: list[int]


def plan_tables(n: int, adj: Sequence[set[int]], sequence: Sequence[int]) -> _Structure:
    """Dependent sets and connected subsets of a sequence (union-find over the prefix).
    O((n + m) D)."""
    pos = np.empty(n, dtype=np.int64)
    pos[np.asarray(sequence, dtype=np.int64)] = np.arange(n)
    root = list(range(n))

    def find(x: int) -> int:
        while root[x] != x:
            root[x] = root[root[x]]
            x = root[x]
        return x

    dep: list[list[int]] = [[] for _ in range(n)]
    children: list[list[int]] = [[] for _ in range(n)]
    parent = [-1] * n
    for i, v in enumerate(sequence):
        kids = {find(u) for u in adj[v] if pos[u] < i}
        d = {u for u in adj[v] if pos[u] > i}
        for w in kids:
            d.update(x for x in dep[w] if pos[x] > i)
            children[v].append(w)
            parent[w] = v
            root[w] = v
        dep[v] = sorted(d, key=lambda x: pos[x])
    return _Structure(list(sequence), dep, children, parent)


def prune_dominated(tables: Tables, *, candidates: int = 16, passes: int = 1,
                    check: Callable[[], bool] | None = None
                    ) -> tuple[Tables, list[np.ndarray]] | None:
    """Drop configurations that can never be strictly needed (exact).

    Configuration c of node v is dominated by c' when, whatever its neighbours choose,
    switching v from c to c' costs nothing more:
    ``l(v, c') - l(v, c) + sum_u max_phi (M_vu[c', phi] - M_vu[c, phi]) <= 0``. Removing
    dominated configurations keeps an optimal strategy (dominance is transitive, and the
    dominators here are never removed in the same pass). Dominators are taken among the
    ``candidates`` configurations with the lowest optimistic cost
    ``l(v, c) + sum_u min_phi M_vu[c, phi]``, which keeps the check O(candidates K deg K_u)
    per node. Not in the paper: it is what makes the Transformer at 64 devices a matter of
    seconds (the DP is exponential in the dependent sets, whose sizes multiply K).

    Returns the reduced tables and, per node, the kept rows of the original configurations;
    None when ``check()`` (called once per node) says the time is up.
    """
    n = tables.num_nodes
    keep = [np.flatnonzero(np.isfinite(c)) for c in tables.node_cost]
    for v in range(n):
        if keep[v].size == 0:
            keep[v] = np.arange(len(tables.node_cost[v]))
    inc: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(n)]
    for u, v, m in tables.edges:
        inc[u].append((v, m))
        inc[v].append((u, m.T))
    for _ in range(passes):
        changed = False
        for v in range(n):
            if check is not None and check():
                return None
            rows = keep[v]
            if rows.size <= 1:
                continue
            node = tables.node_cost[v][rows]
            mats = [m[np.ix_(rows, keep[u])] for u, m in inc[v]]
            optimistic = node + sum((mm.min(axis=1) for mm in mats), np.zeros(rows.size))
            cand = np.argsort(optimistic, kind="stable")[:candidates]
            with np.errstate(invalid="ignore"):  # inf - inf: nan, never "dominated"
                worst = node[cand][:, None] - node[None, :]  # (C, K): l(c') - l(c)
                for mm in mats:
                    diff = mm[cand][:, None, :] - mm[None, :, :]  # (C, K, K_u)
                    worst = worst + diff.max(axis=2)
            dominated = np.any(worst <= 0, axis=0)
            dominated[cand] = False
            if dominated.any():
                keep[v] = rows[~dominated]
                changed = True
        if not changed:
            break
    reduced = Tables(
        graph=tables.graph, devices=tables.devices, cost_model=tables.cost_model,
        objective=tables.objective, names=tables.names, dims=tables.dims,
        configs=tuple(tables.configs[v][keep[v]] for v in range(n)),
        node_cost=tuple(tables.node_cost[v][keep[v]] for v in range(n)),
        edges=tuple((u, v, m[np.ix_(keep[u], keep[v])]) for u, v, m in tables.edges),
        meta=tables.meta)
    return reduced, keep


def greedy_choice(tables: Tables, order: Sequence[int] | None = None,
                  check: Callable[[], bool] | None = None) -> np.ndarray:
    """A strategy that prices edges: visit the nodes in ``order`` (default: by id, which is
    a topological order for graphs) and give each the configuration that minimises its own
    cost plus the edges to the nodes already decided. O(sum_v K_v (1 + deg v)).

    The incumbent a search that runs out of time returns (with data parallelism, when a
    graph is known): unlike each node's cheapest configuration alone, it accounts for the
    re-sharding its choices cause. When ``check()`` says the time is up the remaining nodes
    take their cheapest own configuration.
    """
    n = tables.num_nodes
    inc: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(n)]
    for u, v, m in tables.edges:
        inc[u].append((v, m))
        inc[v].append((u, m.T))
    choice = np.full(n, -1, dtype=np.int64)
    late = False
    with np.errstate(invalid="ignore", over="ignore"):
        for i, v in enumerate(range(n) if order is None else order):
            if check is not None and not late and (i & 63) == 0 and check():
                late = True
            cost = tables.node_cost[v].copy()
            if not late:
                for u, m in inc[v]:
                    if choice[u] >= 0:
                        cost = cost + m[:, choice[u]]
            choice[v] = int(np.argmin(np.where(np.isnan(cost), np.inf, cost)))
    return choice


def lower_bound(tables: Tables) -> float:
    """Every node's and edge's cheapest cost, summed: no strategy costs less (costs are
    >= 0). O(sum of table sizes)."""
    return float(sum(float(np.min(c)) for c in tables.node_cost)
                 + sum(float(np.min(m)) for _, _, m in tables.edges))


def check_finite(tables: Tables) -> None:
    """One line naming the first node none of whose configurations has a finite cost."""
    for v, c in enumerate(tables.node_cost):
        if not np.any(np.isfinite(c)):
            raise ShardplanError(f"every configuration of node {v} ({tables.names[v]!r}) has "
                                 "an infinite cost (ruled out, e.g. by the memory limit): no "
                                 "strategy exists")


def _meet(keys: list[np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Common refinement of class labelings: (class of each of the k items, first item of
    each class)."""
    if not keys:
        return np.zeros(k, dtype=np.int64), np.zeros(1, dtype=np.int64)
    stacked = np.stack(keys, axis=1)
    _, first, inv = np.unique(stacked, axis=0, return_index=True, return_inverse=True)
    return inv.reshape(-1).astype(np.int64), first.astype(np.int64)


def _row_classes(m: np.ndarray) -> np.ndarray:
    """Label rows of ``m`` so that equal rows share a label."""
    _, inv = np.unique(m, axis=0, return_inverse=True)
    return inv.reshape(-1).astype(np.int64)


def _column_classes(m: np.ndarray) -> np.ndarray:
    return _row_classes(np.ascontiguousarray(m.T))


def _argmin_dtype(k: int) -> type:
    return np.uint8 if k <= 255 else np.uint16 if k <= 65535 else np.int64


def table_bytes(tables: Tables, st: _Structure) -> tuple[int, int]:
    """(largest table entries, peak bytes of live cost tables plus all argmin tables)."""
    ks = [len(c) for c in tables.node_cost]
    size = [int(np.prod([ks[u] for u in st.dep[v]], dtype=np.float64)) for v in range(len(ks))]
    live = peak = argmins = 0
    for v in st.sequence:
        argmins += size[v] * np.dtype(_argmin_dtype(ks[v])).itemsize
        live += size[v] * 8
        peak = max(peak, live + argmins)
        live -= sum(size[w] * 8 for w in st.children[v])
    return max(size, default=0), int(peak)


def solve(tables: Tables, *, ordering: str = "generate-seq", time_limit: float | None = None,
          progress: Callable[[str, float, float], None] | None = None,
          max_table_bytes: float = 4e9, chunk_elements: int = 1 << 22,
          prune: bool = True, deadline: float | None = None,
          incumbent: np.ndarray | None = None,
          large_table: int = LARGE_TABLE) -> DPResult:
    """Minimise equation (1) over the tables exactly (recurrence 4).

    Parameters
    ----------
    tables : Tables
    ordering : {"generate-seq", "bfs"}
    time_limit : float, optional
        Seconds from the call (pruning included); ``deadline`` is the same as an absolute
        ``time.perf_counter()`` value (the earlier of the two counts). When reached, the
        result is ``incumbent`` (default: :func:`greedy_choice`), evaluated in full, with
        status ``timed_out``.
    incumbent : ndarray, optional
        The strategy to return if the time runs out.
    progress : callable, optional
        ``progress("pase", vertices done, n)``.
    max_table_bytes : float
        Refuse (:class:`TableTooLargeError`) an ordering whose tables would need more.
    chunk_elements : int
        Working-array budget per broadcast step of the small-table branch (1: one
        candidate configuration at a time).
    prune : bool
        Drop dominated configurations first (:func:`prune_dominated`; exact).
    large_table : int
        Tables of at least this many entries are minimised one candidate at a time in place;
        smaller ones by broadcasting over chunks of candidates. Both give the same table;
        the threshold only picks the faster branch (0 forces the large-table branch
        everywhere, a huge value the small-table one; the tests force each).

    Returns
    -------
    DPResult
    """
    t0 = time.perf_counter()
    if time_limit is not None:
        deadline = t0 + time_limit if deadline is None else min(deadline, t0 + time_limit)
    check_finite(tables)
    original = tables

    def expired() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    def give_up(seq: Sequence[int] = (), max_dep: int = 0, max_table: int = 0,
                peak: int = 0) -> DPResult:
        choice = incumbent if incumbent is not None else greedy_choice(original)
        return DPResult(np.asarray(choice, dtype=np.int64), original.evaluate(choice),
                        "timed_out", max_dep, max_table, peak, tuple(seq))

    keep: list[np.ndarray] | None = None
    if prune:
        pruned = prune_dominated(tables, check=expired)
        if pruned is None:
            return give_up()
        tables, keep = pruned
    n = tables.num_nodes
    adj = _adjacency(n, tables.edges)
    if ordering == "generate-seq":
        seq = generate_seq(n, adj, [len(c) for c in tables.node_cost])
    elif ordering == "bfs":
        seq = bfs_sequence(n, adj)
    else:
        raise ShardplanError(f"unknown ordering {ordering!r} (choose generate-seq or bfs)")
    st = plan_tables(n, adj, seq)
    max_table, peak = table_bytes(tables, st)
    max_dep = max((len(d) for d in st.dep), default=0)
    if peak > max_table_bytes:
        raise TableTooLargeError(
            f"{ordering} ordering needs {peak / 2**30:.3g} GiB of DP tables (largest dependent "
            f"set {max_dep}), over the {max_table_bytes / 2**30:.3g} GiB budget")
    ks = [len(c) for c in tables.node_cost]
    mat: dict[tuple[int, int], np.ndarray] = {}
    for u, v, m in tables.edges:
        mat[(u, v)] = m
        mat[(v, u)] = m.T

    # Tables live over *classes* of the dependent vertices' configurations: two
    # configurations of u in D(v) are one class when every term of v's recurrence that
    # involves u (the edge matrix column, the children's tables) is identical for them.
    cost_tab: dict[int, tuple[np.ndarray, list[np.ndarray]]] = {}
    arg_tab: dict[int, tuple[np.ndarray, list[np.ndarray]]] = {}
    roots: list[int] = []
    timed_out = False
    with np.errstate(invalid="ignore", over="ignore"):  # inf + inf stays inf, quietly
        peak_entries = 0
        for i, v in enumerate(seq):
            dv = st.dep[v]
            axis = {u: a for a, u in enumerate(dv)}
            kids = [(st.dep[w], *cost_tab.pop(w)) for w in st.children[v]]
            # Class map of each axis: the meet of the terms' own classes.
            cls: list[np.ndarray] = []
            rep: list[np.ndarray] = []
            for u in dv:
                keys = []
                if u in adj[v]:
                    keys.append(_column_classes(mat[(v, u)]))
                for dw, _, kcls in kids:
                    if u in dw:
                        keys.append(kcls[dw.index(u)])
                inv, first = _meet(keys, ks[u])
                cls.append(inv)
                rep.append(first)
            shape = tuple(len(r) for r in rep)
            # v's own configurations: one per class of identical interfaces (the cheapest).
            vkeys = [_row_classes(mat[(v, u)][:, rep[axis[u]]]) for u in dv if u in adj[v]]
            vkeys += [kcls[0] for _, _, kcls in kids]
            vcls, _ = _meet(vkeys, ks[v])
            order = np.lexsort((tables.node_cost[v], vcls))
            first_of = np.ones(len(order), dtype=bool)
            first_of[1:] = vcls[order[1:]] != vcls[order[:-1]]
            cands = order[first_of]
            width = int(np.prod(shape, dtype=np.int64)) if shape else 1
            peak_entries = max(peak_entries, width)
            best = np.full(shape, np.inf)
            arg = np.zeros(shape, dtype=np.int64)
            # Per-term views over D(v)'s axes, built once per vertex.
            edge_terms = []
            for u in dv:
                if u in adj[v]:
                    a = axis[u]
                    sh = [1] * len(shape)
                    sh[a] = shape[a]
                    edge_terms.append((mat[(v, u)][:, rep[a]], sh))
            child_terms = []
            for dw, tab, kcls in kids:
                rest = [kcls[j][rep[axis[x]]] for j, x in enumerate(dw) if j > 0]
                sh = [1] * len(shape)
                for x in dw[1:]:
                    sh[axis[x]] = shape[axis[x]]
                ident = all(np.array_equal(r, np.arange(tab.shape[j + 1]))
                            for j, r in enumerate(rest))
                child_terms.append((tab, kcls[0], None if ident else np.ix_(*rest), sh))
            if width >= large_table:
                # Large tables: one candidate at a time, running minimum in place (contiguous
                # passes; an argmin across a candidate axis is several times slower).
                buf = np.empty(shape)
                mask = np.empty(shape, dtype=bool)
                for j, c in enumerate(cands):
                    if deadline is not None and j % 8 == 0 and time.perf_counter() > deadline:
                        timed_out = True
                        break
                    buf.fill(tables.node_cost[v][c])
                    for m, sh in edge_terms:
                        buf += m[c].reshape(sh)
                    for tab, cls0, gather, sh in child_terms:
                        part = tab[cls0[c]]
                        if gather is not None:
                            part = part[gather]
                        buf += part.reshape(sh)
                    np.less(buf, best, out=mask)
                    np.copyto(best, buf, where=mask)
                    np.copyto(arg, c, where=mask)
            else:
                chunk = max(1, min(len(cands), chunk_elements // max(width, 1)))
                for c0 in range(0, len(cands), chunk):
                    if deadline is not None and time.perf_counter() > deadline:
                        timed_out = True
                        break
                    cc = cands[c0:c0 + chunk]
                    acc = np.empty((len(cc), *shape))
                    acc[...] = tables.node_cost[v][cc].reshape((len(cc),) + (1,) * len(shape))
                    for m, sh in edge_terms:
                        acc += m[cc].reshape((len(cc), *sh))
                    for tab, cls0, gather, sh in child_terms:
                        part = tab[cls0[cc]]
                        if gather is not None:
                            part = part[(slice(None), *gather)]
                        # np.ix_ keeps dw's axis order, which is D(v)'s order restricted to dw.
                        acc += part.reshape((len(cc), *sh))
                    local = np.argmin(acc, axis=0)
                    low = np.take_along_axis(acc, local[None], axis=0)[0]
                    better = low < best
                    best = np.where(better, low, best)
                    arg = np.where(better, cc[local], arg)
            if timed_out:
                break
            cost_tab[v] = (best, cls)
            arg_tab[v] = (arg.astype(_argmin_dtype(ks[v])), cls)
            if not dv:
                roots.append(v)
            if progress is not None:
                progress("pase", i + 1, n)

    if timed_out:
        return give_up(seq, max_dep, max_table, peak)
    value = float(sum(float(cost_tab[r][0]) for r in roots))
    if not np.isfinite(value):
        raise ShardplanError("every strategy has an infinite cost somewhere (configurations "
                             "ruled out, e.g. by the memory limit, on both ends of an edge)")
    choice = np.full(n, -1, dtype=np.int64)
    for v in reversed(seq):
        tab, cls = arg_tab[v]
        idx = tuple(int(cls[a][choice[u]]) for a, u in enumerate(st.dep[v]))
        choice[v] = int(tab[idx])
    if keep is not None:
        choice = np.array([int(keep[v][choice[v]]) for v in range(n)], dtype=np.int64)
    return DPResult(choice, value, "optimal", max_dep, peak_entries, peak, tuple(seq))
