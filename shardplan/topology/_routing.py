"""Shortest-path routing over physical links: end-to-end latency, bottleneck bandwidth, paths."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.ir._pairs import GridPairs, PairMatrix
from shardplan.ir.topology import Link, Topology

__all__ = ["GridRoutes", "Routes", "path", "route", "routes_of"]

_WEIGHTS = ("latency", "hops")


class Routes(NamedTuple):
    """Routing tables of a network of links (unpacks as ``bandwidth, latency, next_hop``).

    Attributes
    ----------
    bandwidth : ndarray of float, shape (D, D)
        Bottleneck bandwidth (bytes/s) along the route ``i -> j``; 0 on the diagonal and where
        j is unreachable from i.
    latency : ndarray of float, shape (D, D)
        Sum of the link latencies (s) along the route; 0 on the diagonal and when unreachable.
    next_hop : ndarray of int, shape (D, D)
        The device after i on the route ``i -> j``; -1 on the diagonal and when unreachable.
        Routing is by destination: following ``next_hop[., j]`` from any device walks one
        tree rooted at j, so every sub-route of a route is itself the route the table gives.
    """

    bandwidth: np.ndarray
    latency: np.ndarray
    next_hop: np.ndarray

    def path(self, i: int, j: int) -> list[int]:
        """Devices on the route from i to j, both ends included (see :func:`path`)."""
        return path(self.next_hop, i, j)

    def links_on_path(self, i: int, j: int) -> list[tuple[int, int]]:
        """The ``(src, dst)`` physical links a transfer from i to j crosses, in order."""
        p = self.path(i, j)
        return list(zip(p[:-1], p[1:], strict=True))

    @property
    def hops(self) -> np.ndarray:
        """Number of links on each route (0 on the diagonal, -1 when unreachable)."""
        return _hop_counts(self.next_hop)


def path(next_hop: np.ndarray, i: int, j: int) -> list[int]:
    """Devices on the route from device i to device j (both included) in a next-hop table.

    Parameters
    ----------
    next_hop : ndarray of int, shape (D, D)
        ``Routes.next_hop``.
    i, j : int
        Source and destination device ids.

    Returns
    -------
    list of int
        ``[i, ..., j]``; ``[i]`` when ``i == j``.

    Raises
    ------
    ShardplanError
        When a device id is out of range or j is unreachable from i.

    Notes
    -----
    O(hops). The walk follows the destination-rooted tree of j, so it always terminates.
    """
    n = next_hop.shape[0]
    if not (0 <= i < n and 0 <= j < n):
        raise ShardplanError(f"device ids {i}, {j} out of range 0..{n - 1}")
    out = [int(i)]
    cur = int(i)
    while cur != j:
        cur = int(next_hop[cur, j])
        if cur < 0:
            raise ShardplanError(f"device {j} is unreachable from device {i}")
        out.append(cur)
        assert len(out) <= n, "routing table has a loop"
    return out


def _hop_counts(next_hop: np.ndarray) -> np.ndarray:
    n = next_hop.shape[0]
    cols = np.broadcast_to(np.arange(n), (n, n))
    hops = np.where(next_hop >= 0, -2, -1)
    np.fill_diagonal(hops, 0)
    direct = next_hop == cols
    hops[direct] = 1
    while True:
        todo = hops == -2
        if not todo.any():
            return hops
        ii, jj = np.nonzero(todo)
        nxt = next_hop[ii, jj]
        ready = hops[nxt, jj] >= 0
        hops[ii[ready], jj[ready]] = hops[nxt[ready], jj[ready]] + 1


def route(num_devices: int, links: Iterable[Link], *, weight: str = "latency") -> Routes:
    """Route every ordered pair of devices over shortest paths of physical links.

    Parameters
    ----------
    num_devices : int
        D, the number of devices (link end points are ids in ``0..D-1``).
    links : iterable of Link
        Directed physical links ``src -> dst`` with their bandwidth (bytes/s) and latency (s).
        Give both directions for a bidirectional link. When a pair has several links, the one
        with the lowest latency (then the highest bandwidth) is used.
    weight : {"latency", "hops"}
        What a shortest path minimises: the total latency, ties broken towards fewer hops
        (default), or the number of hops, ties broken towards lower latency.

    Returns
    -------
    Routes
        ``(bandwidth, latency, next_hop)``: the route's bottleneck bandwidth and summed
        latency for every ordered pair, and the next-hop table (see :meth:`Routes.path`).

    Notes
    -----
    One route per pair (no multipath, no load balancing): latency = sum of the hop latencies
    on the chosen shortest path, bandwidth = the smallest link bandwidth on it. Contention
    between transfers sharing links is a simulator's business; it finds the shared links with
    :meth:`Routes.links_on_path`.

    Shortest paths come from Dijkstra on the *reversed* graph from every destination
    (``scipy.sparse.csgraph.shortest_path``), which yields a destination-rooted tree per
    device, hence a consistent next-hop table. Latency and bandwidth are then accumulated
    exactly along those trees. Complexity O(D (E + D) log D) for Dijkstra plus O(D^2 h) for
    the accumulation, h the largest hop count.

    The lexicographic tie-break of ``weight="latency"`` adds 1e-9 of the smallest positive
    link latency per hop, so two paths whose latencies differ by less than that are treated
    as tied (which is floating-point noise); ``weight="hops"`` is exactly lexicographic.
    """
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import shortest_path

    if weight not in _WEIGHTS:
        raise ShardplanError(f"unknown routing weight {weight!r} (choose from "
                             f"{', '.join(_WEIGHTS)})")
    n = int(num_devices)
    if n < 1:
        raise ShardplanError(f"routing needs at least one device, got {num_devices!r}")
    link_bw = np.zeros((n, n))
    link_lat = np.full((n, n), np.inf)
    for lk in links:
        s, d = int(lk.src), int(lk.dst)
        if not (0 <= s < n and 0 <= d < n) or s == d:
            raise ShardplanError(f"link {s} -> {d} is not between two distinct devices of "
                                 f"0..{n - 1}")
        if not lk.bandwidth > 0 or not lk.latency >= 0:
            raise ShardplanError(f"link {s} -> {d} needs positive bandwidth and latency >= 0")
        if (lk.latency, -lk.bandwidth) < (link_lat[s, d], -link_bw[s, d]):
            link_lat[s, d], link_bw[s, d] = lk.latency, lk.bandwidth
    has = link_bw > 0
    src, dst = np.nonzero(has)
    lat = link_lat[src, dst]

    if weight == "latency":
        pos = lat[lat > 0]
        eps = 1e-9 * float(pos.min()) if pos.size else 1.0
        w = lat + eps
    else:  # hops, then latency: the latency term of a whole path stays below one hop
        top = float(lat.max()) if lat.size else 0.0
        w = 1.0 + (lat / (2.0 * n * top) if top > 0 else np.zeros_like(lat))
    # Reversed graph (edge dst -> src): the predecessor of i in the tree grown from j is the
    # device after i on the route i -> j.
    graph = csr_matrix((w, (dst, src)), shape=(n, n))
    _, pred = shortest_path(graph, method="D", directed=True, return_predecessors=True)
    next_hop = pred.T.astype(np.int64)
    next_hop[next_hop < 0] = -1
    np.fill_diagonal(next_hop, -1)

    bandwidth = np.zeros((n, n))
    latency = np.zeros((n, n))
    done = np.zeros((n, n), dtype=bool)
    np.fill_diagonal(done, True)
    cols = np.broadcast_to(np.arange(n), (n, n))
    direct = next_hop == cols
    bandwidth[direct] = link_bw[direct]
    latency[direct] = link_lat[direct]
    done |= direct
    reachable = next_hop >= 0
    while True:
        todo = reachable & ~done
        if not todo.any():
            break
        ii, jj = np.nonzero(todo)
        k = next_hop[ii, jj]
        ready = done[k, jj]
        ii, jj, k = ii[ready], jj[ready], k[ready]
        assert ii.size, "routing table has a loop"
        latency[ii, jj] = link_lat[ii, k] + latency[k, jj]
        bandwidth[ii, jj] = np.minimum(link_bw[ii, k], bandwidth[k, jj])
        done[ii, jj] = True
    return Routes(bandwidth=bandwidth, latency=latency, next_hop=next_hop)


class GridRoutes:
    """Dimension-ordered routes of a grid topology (:class:`~shardplan.ir._pairs.GridPairs`),
    computed on demand: the same attributes and methods as :class:`Routes`, with
    ``bandwidth``, ``latency`` and ``next_hop`` as :class:`~shardplan.ir._pairs.PairMatrix`
    views (index them; whole-matrix uses build them). A route goes along axis 0 first, then
    axis 1, ..., the shorter way round a ring (forwards on a tie): a minimum-hop path, so its
    latency and bandwidth are the topology's. O(hops) a path, no O(D^2) table."""

    def __init__(self, topology: Topology, model: GridPairs) -> None:
        self.model = model
        self.bandwidth = topology.bandwidth
        self.latency = topology.latency
        self.next_hop = PairMatrix(model, "next_hop")

    def path(self, i: int, j: int) -> list[int]:
        n = self.model.num_devices
        if not (0 <= i < n and 0 <= j < n):
            raise ShardplanError(f"device ids {i}, {j} out of range 0..{n - 1}")
        return self.model.path(int(i), int(j))

    def links_on_path(self, i: int, j: int) -> list[tuple[int, int]]:
        p = self.path(i, j)
        return list(zip(p[:-1], p[1:], strict=True))

    @property
    def hops(self) -> np.ndarray:
        return np.asarray(PairMatrix(self.model, "hops"))


def routes_of(topology: Topology, *, weight: str = "latency") -> Routes | GridRoutes:
    """Routing tables of a topology: over its physical ``links`` when it has some.

    A grid built by :mod:`shardplan.topology` (its pair model, links as the model says) is
    routed dimension by dimension on demand (:class:`GridRoutes`), at any size; other
    topologies with links by shortest paths (:func:`route`, O(D^2) tables).

    A topology without links (flat, hierarchical, DGX-1, random, measured) is taken at its
    word: every pair with ``bandwidth > 0`` talks directly, over one hop with the matrices'
    values, even where a multi-hop detour would be faster (the builders' matrices are the
    model; re-routing them would change it).
    """
    model = topology.pair_model
    if isinstance(model, GridPairs) and _links_of_model(topology, model):
        if weight not in _WEIGHTS:
            raise ShardplanError(f"unknown routing weight {weight!r} (choose from "
                                 f"{', '.join(_WEIGHTS)})")
        return GridRoutes(topology, model)
    if topology.links:
        return route(topology.num_devices, topology.links, weight=weight)
    if weight not in _WEIGHTS:
        raise ShardplanError(f"unknown routing weight {weight!r} (choose from "
                             f"{', '.join(_WEIGHTS)})")
    n = topology.num_devices
    ok = topology.bandwidth > 0
    np.fill_diagonal(ok, False)
    next_hop = np.where(ok, np.broadcast_to(np.arange(n), (n, n)), -1).astype(np.int64)
    return Routes(bandwidth=np.where(ok, topology.bandwidth, 0.0),
                  latency=np.where(ok, topology.latency, 0.0), next_hop=next_hop)


def _links_of_model(topology: Topology, model: GridPairs) -> bool:
    """Whether the topology's links are exactly the grid's (the same pairs, bandwidth and
    latency): only then do the grid's routes describe it. O(links)."""
    src, dst = model.link_pairs()
    if len(topology.links) != src.size:
        return False
    bw, lat = model.link_bandwidth, model.hop_latency
    have = sorted((lk.src, lk.dst) for lk in topology.links
                  if lk.bandwidth == bw and lk.latency == lat)
    return have == sorted(zip(src.tolist(), dst.tolist(), strict=True))
