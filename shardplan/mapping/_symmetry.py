"""Automorphisms of grid topologies (meshes and tori), for symmetry breaking in the mapping
search.

A device permutation g is an automorphism when it preserves peak FLOP/s, latency and
bandwidth: ``M[g[i], g[j]] == M[i, j]`` for both matrices and every pair. Every mapping
composed with g has the same stage times, so the search needs only the lexicographically
smallest mapping of each orbit (see :mod:`shardplan.mapping._search`).

Finding the automorphism group of an arbitrary matrix is graph-isomorphism hard; we only
propose the natural candidates of the grid builders of :mod:`shardplan.topology` (read from
the topology's ``generator`` record: kind and shape, devices in row-major order): unit
translations along each axis (tori), reflections of each axis, and swaps of two axes of the
same length. Each candidate is *verified* against the matrices and dropped if it is not an
automorphism, so a wrong guess costs nothing but time. The verified generators are closed
into the whole group (at most ``max_size`` elements, else no group is used). Twin devices
(:func:`~shardplan.mapping._search.twin_classes`) cover the other topologies' symmetries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

__all__ = ["grid_automorphisms"]

_GRIDS = {"mesh2d": False, "torus2d": True, "mesh3d": False, "torus3d": True}


def _is_automorphism(g: np.ndarray, mats: tuple[np.ndarray, ...], flops: np.ndarray) -> bool:
    if not np.array_equal(flops[g], flops):
        return False
    return all(np.array_equal(m[np.ix_(g, g)], m) for m in mats)


def grid_automorphisms(meta: Mapping[str, Any], latency: np.ndarray, inv_bandwidth: np.ndarray,
                       flops: np.ndarray, *, max_size: int = 4096,
                       routes: Callable[[np.ndarray], bool] | None = None
                       ) -> np.ndarray | None:
    """The automorphism group of a grid topology as an array (|G|, D) (row 0 the identity),
    or None when the topology is not a recognised grid or the group is trivial or too big.
    ``routes``, when given, must also accept every generator (with link contention, a
    permutation must map every route onto the route of the mapped pair,
    :func:`~shardplan.mapping._stage_time.routes_preserved`; single-path routing breaks
    ties between equal paths one way, which a reflection need not respect). The group the
    accepted generators close into keeps that property (it is closed under composition).
    O(k D^2) to verify k candidate generators (O(k D^2 H) with ``routes``), O(|G| D k) to
    close them."""
    gen = meta.get("generator") if isinstance(meta, Mapping) else None
    if not isinstance(gen, Mapping) or gen.get("kind") not in _GRIDS:
        return None
    try:
        shape = tuple(int(x) for x in gen.get("options", {}).get("shape", ()))
    except (TypeError, ValueError):
        return None
    d_count = flops.size
    if not shape or int(np.prod(shape)) != d_count:
        return None
    wrap = _GRIDS[str(gen["kind"])]
    idx = np.arange(d_count).reshape(shape)
    cands = []
    for ax in range(len(shape)):
        cands.append(np.flip(idx, axis=ax))
        if wrap:
            cands.append(np.roll(idx, 1, axis=ax))
        for bx in range(ax + 1, len(shape)):
            if shape[ax] == shape[bx]:
                cands.append(np.swapaxes(idx, ax, bx))
    mats = (latency, inv_bandwidth)
    gens = []
    for c in cands:
        g = np.empty(d_count, dtype=np.int64)
        g[idx.reshape(-1)] = c.reshape(-1)  # device idx[p] goes to c[p]
        if not np.array_equal(g, np.arange(d_count)) and _is_automorphism(g, mats, flops) \
                and (routes is None or routes(g)):
            gens.append(g)
    if not gens:
        return None
    ident = np.arange(d_count, dtype=np.int64)
    seen = {ident.tobytes(): ident}
    frontier = [ident]
    while frontier:
        nxt = []
        for h in frontier:
            for g in gens:
                comp = g[h]
                key = comp.tobytes()
                if key not in seen:
                    seen[key] = comp
                    nxt.append(comp)
                    if len(seen) > max_size:
                        return None
        frontier = nxt
    group = np.stack(list(seen.values()))
    return group
