"""Parmesan's operator clustering (paper 002, section 4.2, equation 4).

Repeatedly fuse the two adjacent hyper-operators ``u -> v`` with the smallest

    cost(u, v) = c_u(u) + c_u(v) - alpha * c_m(u, v)

whose fusion keeps the hyper-operator graph acyclic (the pair is convex: no other path from
u to v) and fits in a device's memory, until K hyper-operators remain.

Made fast (the issue asks for 10^4 operators): a binary heap of candidate pairs with *lazy*
updates (every hyper-operator has a version; a fusion bumps the survivor's version and pushes
its new pairs; stale entries are skipped when popped), and an *incremental* convexity test: a
topological order of the hyper-operators is maintained under fusions, so "is there another
path u -> ... -> v" is a depth-first search from u's other successors restricted to positions
before v's. After fusing a convex edge u -> v, the ancestors of v positioned between u and v
move in front of the fused node (they cannot be reached from u); the window is reordered in
O(w log w). A pair found non-convex or too big is dropped for good: fusions elsewhere never
remove a path or shrink a hyper-operator, so it cannot become valid again without u or v
changing (which pushes it anew).

Decisions where the paper is silent (its appendix B is not in our text): c_u is forward +
backward seconds on the fastest device; c_m(u, v) is ``2 * (tensors * latency + bytes *
inverse bandwidth)`` over the edges between u and v (both passes, the nominal link of
:class:`~._pipeline_dp.StageContext`); the memory check is parameters x (2 + optimizer state)
+ outputs x (largest in-flight count) / R + extra <= the smallest device memory. Ties break
by unit ids, so clustering is deterministic.

Complexity: O((n + m) log m) heap work plus the convexity searches and window reorders,
each bounded by the number of hyper-operators between u and v in the order.
"""

from __future__ import annotations

import heapq

import numpy as np

from shardplan.ir import Graph

__all__ = ["Clusterer"]


class Clusterer:
    """Incremental operator clustering; call :meth:`run` with decreasing targets.

    Parameters
    ----------
    graph : Graph
    seconds : ndarray, shape (n,)
        c_u of every operator.
    memory : ndarray, shape (n,)
        Memory estimate of every operator (additive).
    memory_cap : float
    alpha : float
    latency, inv_bandwidth : float
        The nominal link of c_m.
    """

    def __init__(self, graph: Graph, seconds: np.ndarray, memory: np.ndarray, memory_cap: float,
                 alpha: float, latency: float, inv_bandwidth: float) -> None:
        n = graph.num_nodes
        self.n = n
        self.alpha = float(alpha)
        self.lat = float(latency)
        self.inv = float(inv_bandwidth)
        self.cap = float(memory_cap)
        self.cu = [float(x) for x in seconds]
        self.mem = [float(x) for x in memory]
        self.members: list[list[int] | None] = [[i] for i in range(n)]
        # succ[u][w] = [bytes, tensors]; pred[w] = set of u.
        self.succ: list[dict[int, list[float]]] = [{} for _ in range(n)]
        self.pred: list[set[int]] = [set() for _ in range(n)]
        for a, b, nb in zip(graph.src.tolist(), graph.dst.tolist(),
                             graph.edge_bytes.tolist(), strict=True):
            e = self.succ[a].get(b)
            if e is None:
                self.succ[a][b] = [float(nb), 1.0 if nb > 0 else 0.0]
                self.pred[b].add(a)
            else:
                e[0] += nb
                e[1] += 1.0 if nb > 0 else 0.0
        rank = graph.topological_rank
        self.pos = [int(x) for x in rank]
        self.at = np.full(n, -1, dtype=np.int64)  # position -> unit
        self.at[rank] = np.arange(n)
        self.version = [0] * n
        self.alive = n
        self.merges = 0
        self.rejected = 0
        self.heap: list[tuple[float, int, int, int, int]] = []
        for a in range(n):
            for b in self.succ[a]:
                self._push(a, b)

    # ------------------------------------------------------------------ helpers
    def _cm(self, u: int, v: int) -> float:
        e = self.succ[u][v]
        return 2.0 * (e[1] * self.lat + e[0] * self.inv)

    def _push(self, u: int, v: int) -> None:
        cost = self.cu[u] + self.cu[v] - self.alpha * self._cm(u, v)
        heapq.heappush(self.heap, (cost, u, v, self.version[u], self.version[v]))

    def _other_path(self, u: int, v: int) -> bool:
        """Whether v is reachable from u other than by the edge u -> v."""
        limit = self.pos[v]
        pos = self.pos
        stack = [w for w in self.succ[u] if w != v and pos[w] < limit]
        seen = set(stack)
        while stack:
            x = stack.pop()
            for w in self.succ[x]:
                if w == v:
                    return True
                if w not in seen and pos[w] < limit:
                    seen.add(w)
                    stack.append(w)
        return False

    def _reorder(self, u: int, v: int) -> None:
        """After fusing v into u: keep ``pos`` a topological order."""
        lo, hi = self.pos[u], self.pos[v]
        window = self.at[lo + 1:hi]
        window = window[window >= 0].tolist()
        if not window:
            self.at[hi] = -1
            return
        inwin = set(window)
        anc: set[int] = set()
        stack = [w for w in self.pred[u] if w in inwin]  # v's preds now belong to u
        anc.update(stack)
        while stack:
            x = stack.pop()
            for w in self.pred[x]:
                if w in inwin and w not in anc:
                    anc.add(w)
                    stack.append(w)
        if not anc:
            self.at[hi] = -1
            return
        slots = [lo] + [self.pos[w] for w in window] + [hi]
        seq = [w for w in window if w in anc] + [u] + [w for w in window if w not in anc]
        self.at[slots] = -1
        for p, w in zip(slots, seq, strict=False):
            self.pos[w] = p
            self.at[p] = w

    def _fuse(self, u: int, v: int) -> None:
        """Fuse v into u (edge u -> v)."""
        del self.succ[u][v]
        self.pred[v].discard(u)
        for w, e in self.succ[v].items():
            self.pred[w].discard(v)
            self.pred[w].add(u)
            f = self.succ[u].get(w)
            if f is None:
                self.succ[u][w] = e
            else:
                f[0] += e[0]
                f[1] += e[1]
        for w in self.pred[v]:
            e = self.succ[w].pop(v)
            f = self.succ[w].get(u)
            if f is None:
                self.succ[w][u] = e
                self.pred[u].add(w)
            else:
                f[0] += e[0]
                f[1] += e[1]
        self.succ[v] = {}
        self.pred[v] = set()
        mu, mv = self.members[u], self.members[v]
        assert mu is not None and mv is not None
        mu.extend(mv)
        self.members[v] = None
        self.cu[u] += self.cu[v]
        self.mem[u] += self.mem[v]
        self.version[u] += 1
        self.version[v] += 1
        self.alive -= 1
        self.merges += 1
        self._reorder(u, v)
        for w in self.succ[u]:
            self._push(u, w)
        for w in self.pred[u]:
            self._push(w, u)

    # ------------------------------------------------------------------ public
    def run(self, target: int) -> int:
        """Fuse until at most ``target`` hyper-operators remain or no pair is valid."""
        heap = self.heap
        while self.alive > target and heap:
            _, u, v, vu, vv = heapq.heappop(heap)
            if self.members[u] is None or self.members[v] is None or \
                    vu != self.version[u] or vv != self.version[v]:
                continue
            if self.mem[u] + self.mem[v] > self.cap or self._other_path(u, v):
                self.rejected += 1
                continue
            self._fuse(u, v)
        return self.alive

    def unit_of(self) -> np.ndarray:
        """Operator -> hyper-operator id, ids 0..K-1 in topological order of the units."""
        alive = [u for u in range(self.n) if self.members[u] is not None]
        alive.sort(key=lambda u: self.pos[u])
        out = np.empty(self.n, dtype=np.int64)
        for i, u in enumerate(alive):
            members = self.members[u]
            assert members is not None
            out[members] = i
        return out
