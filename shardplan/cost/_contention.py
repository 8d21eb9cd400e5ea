"""Link contention: transfers that stream at once share the physical links of their routes.

The term the stage-time model adds with ``contention=True`` (see
:mod:`shardplan.cost._pipeline`, "Link contention") and the mapping search prices: every
transfer of a set streams at once; a transfer is what one device sends another; a device's
own transfers go one after another (the simulator's send queue), so they do not slow each
other, but they share every link of their routes with the other devices' transfers. A
transfer of ``b`` bytes then takes ``max over the links l of its route of (b + bytes of
the other senders' transfers over l) / bandwidth(l)`` seconds of bandwidth time. Routes are
the simulator's (:func:`shardplan.topology.routes_of`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

__all__ = ["LinkTable", "link_contention", "link_table", "route_links"]


@dataclass(frozen=True, eq=False)
class LinkTable:
    """A topology's physical links as the contention term sees them.

    Attributes
    ----------
    next_hop : ndarray of int64, shape (D, D)
        The routing table (:func:`shardplan.topology.routes_of`, the simulator's routes).
    keys : ndarray of int64, shape (L,)
        ``src * D + dst`` of every directed link, sorted; a link's id is its position.
    inv_bandwidth : ndarray, shape (L,)
        Seconds per byte of every link (of the lowest-latency, then fastest, link when a
        pair has several, as the simulator picks).
    max_hops : int
        The longest route.
    """

    next_hop: np.ndarray
    keys: np.ndarray
    inv_bandwidth: np.ndarray
    max_hops: int

    @property
    def num_links(self) -> int:
        return int(self.keys.size)


@lru_cache(maxsize=4)
def link_table(topology: Any) -> LinkTable | None:
    """The :class:`LinkTable` of a topology with physical ``links`` (None without). Cached
    per topology object (topologies are immutable). O(D (E + D) log D) routing."""
    if not topology.links:
        return None
    from shardplan.topology import routes_of  # the planning core's one routing

    routes = routes_of(topology)
    n = topology.num_devices
    best: dict[int, tuple[float, float]] = {}
    for lk in topology.links:
        key = int(lk.src) * n + int(lk.dst)
        cand = (float(lk.latency), -float(lk.bandwidth))
        if key not in best or cand < best[key]:
            best[key] = cand
    keys = np.array(sorted(best), dtype=np.int64)
    inv = np.array([-1.0 / best[int(k)][1] for k in keys])
    hops = routes.hops
    return LinkTable(next_hop=np.asarray(routes.next_hop, dtype=np.int64), keys=keys,
                     inv_bandwidth=inv, max_hops=max(int(hops.max()), 0))


def route_links(table: LinkTable, src: Any, dst: Any) -> np.ndarray:
    """The link ids of the route of every pair ``src[k] -> dst[k]``, shape (K, H) padded
    with -1 (no links for ``src == dst`` or an unreachable pair). O(K H)."""
    src = np.asarray(src, dtype=np.int64).reshape(-1)
    dst = np.asarray(dst, dtype=np.int64).reshape(-1)
    n = table.next_hop.shape[0]
    out = np.full((src.size, table.max_hops), -1, dtype=np.int64)
    cur = src.copy()
    active = (src != dst) & (table.next_hop[src, dst] >= 0)
    for h in range(table.max_hops):
        if not active.any():
            break
        nxt = table.next_hop[cur[active], dst[active]]
        pos = np.searchsorted(table.keys, cur[active] * n + nxt)
        out[np.flatnonzero(active), h] = pos
        cur[active] = nxt
        active &= cur != dst
    return out


def link_contention(paths: np.ndarray, link_inv: np.ndarray, sender: np.ndarray,
                    nbytes: np.ndarray, group: np.ndarray | None = None) -> np.ndarray:
    """Bandwidth seconds of concurrent transfers sharing links (module docstring).

    Parameters
    ----------
    paths : ndarray of int, shape (K, H)
        Link ids of every transfer's route, -1 padded (:func:`route_links`).
    link_inv : ndarray, shape (L,)
        Seconds per byte of every link.
    sender : ndarray of int, shape (K,)
        Who sends each transfer (a device id): a sender's own transfers do not slow each
        other.
    nbytes : ndarray, shape (K,)
    group : ndarray of int, shape (K,), optional
        Independent sets of transfers (e.g. the mappings of a batch): only transfers of one
        group share links. Default: one group.

    Returns
    -------
    ndarray, shape (K,)
        ``max over the route's links l of (nbytes + bytes other senders of the group route
        over l) * link_inv[l]`` (0 for a transfer without links). O(K H log(K H)).
    """
    k_count, h_count = paths.shape
    out = np.zeros(k_count)
    if k_count == 0 or h_count == 0:
        return out
    kk, hh = np.nonzero(paths >= 0)
    if kk.size == 0:
        return out
    lk = paths[kk, hh]
    num_links = int(link_inv.size)
    g = np.zeros(kk.size, dtype=np.int64) if group is None else \
        np.asarray(group, dtype=np.int64)[kk]
    w = np.asarray(nbytes, dtype=np.float64)[kk]
    key = g * num_links + lk
    _, at_link = np.unique(key, return_inverse=True)
    total = np.bincount(at_link, weights=w)
    s = np.asarray(sender, dtype=np.int64)[kk]
    _, at_own = np.unique((key * (int(s.max()) + 1)) + s, return_inverse=True)
    own = np.bincount(at_own, weights=w)
    # One sender alone on a link: the same entries summed in the same order, so exactly 0.
    other = np.maximum(total[at_link] - own[at_own], 0.0)
    t = np.zeros((k_count, h_count))
    t[kk, hh] = (w + other) * link_inv[lk]
    return t.max(axis=1)
