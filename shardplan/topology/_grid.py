"""Meshes and tori of accelerators (2-D and 3-D), routed over shortest paths."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.ir._pairs import GridPairs
from shardplan.ir.topology import Link, Topology, model_links
from shardplan.topology._devices import (
    check_device_count,
    check_nonnegative,
    check_positive,
    check_shape,
    generator_meta,
    make_devices,
)

__all__ = ["grid", "grid_links", "mesh2d", "mesh3d", "torus2d", "torus3d"]

#: Default link rate and per-hop latency of the accelerator grids: 100 GB/s per direction per
#: link (the order of a TPU v4 ICI link or an NVLink3/4 bundle) and 1 us per hop.
DEFAULT_LINK_BANDWIDTH = 1e11
DEFAULT_HOP_LATENCY = 1e-6
MIN_TORUS_SIZE = 3


def grid_links(shape: Sequence[int], *, wrap: bool, bandwidth: float, latency: float
               ) -> tuple[Link, ...]:
    """Both directions of the links between grid neighbours (row-major device ids).

    With ``wrap`` the last device of every line is also linked to the first (a torus); every
    torus dimension must then be at least 3, or the wraparound would duplicate a mesh link.
    """
    dims = tuple(int(d) for d in shape)
    if wrap:
        assert min(dims) >= MIN_TORUS_SIZE
    model = GridPairs(dims, bool(wrap), bandwidth, latency)
    return model_links(model, "torus" if wrap else "mesh")


def grid(kind: str, shape: Sequence[int], ndim: int, wrap: bool, *,
         link_bandwidth: float = DEFAULT_LINK_BANDWIDTH,
         hop_latency: float = DEFAULT_HOP_LATENCY, device: str = "v100",
         memory_bytes: float | None = None, flops: float | None = None,
         name: str | None = None) -> Topology:
    """A mesh or torus of ``ndim`` dimensions (the four public builders call this)."""
    example = "x".join(["4"] * ndim)
    dims = check_shape(kind, shape, ndim, example=example)
    if wrap and min(dims) < MIN_TORUS_SIZE:
        raise ShardplanError(f"{kind} sizes must be >= {MIN_TORUS_SIZE} in every dimension (a "
                             f"ring of 2 or 1 is a mesh line; use mesh{ndim}d), got "
                             f"{'x'.join(map(str, dims))}")
    bw = check_positive("link_bandwidth", link_bandwidth)
    lat = check_nonnegative("hop_latency", hop_latency)
    n = math.prod(dims)
    check_device_count(kind, n)
    model = GridPairs(dims, wrap, bw, lat)
    links = model_links(model, "torus" if wrap else "mesh")
    coords = np.stack(np.unravel_index(np.arange(n), dims), axis=1)
    names = ["chip" + "_".join(map(str, c)) for c in coords.tolist()]
    return Topology(
        name=name or f"{kind}-{'x'.join(map(str, dims))}",
        devices=make_devices(names, device, memory_bytes, flops),
        bandwidth=model.matrix("bandwidth"), latency=model.matrix("latency"), links=links,
        meta=generator_meta(kind, shape=dims, link_bandwidth=bw, hop_latency=lat),
    )


_DOC = """A {d}-D {what} of accelerators{extra}, routed over shortest paths.

    Parameters
    ----------
    shape : sequence of int
        Sizes of the {d} dimensions, e.g. ``{ex}``{minsize}. Devices are numbered row-major
        (the last coordinate varies fastest) and named ``chip{names}``.
    link_bandwidth : float
        Bytes/s per direction of every link (default 1e11).
    hop_latency : float
        Seconds per link crossed (default 1e-6).
    device, memory_bytes, flops, name
        As in :func:`flat`.

    Returns
    -------
    Topology
        ``bandwidth``/``latency`` are routed end to end: latency = hops x ``hop_latency``
        over a minimum-hop path, bandwidth = the bottleneck link bandwidth (all links are
        equal, so ``link_bandwidth``), computed on demand from the grid
        (:class:`~shardplan.ir._pairs.GridPairs`). ``links`` holds both directions of every
        physical link (kind ``"{what}"``) so that a simulator can model contention; the path
        a transfer takes is ``routes_of(topology).path(i, j)``: dimension-ordered (axis 0
        first, the shorter way round a ring).

    Notes
    -----
    The "2d/3d mesh/torus" of paper 002 section 7, table 2 (e.g. 8x8 and 16x16, 4x4x4 and
    8x8x8); the paper's appendix I with its link parameters is not in our text, so the
    defaults are ours: links of 100 GB/s, 1 us per hop. Among the several minimum-hop paths
    of a pair the dimension-ordered one is used (single-path routing, no load balancing, as
    the routers of real meshes and tori do). O(E) with E = {e} D links.
    """


def mesh2d(shape: Sequence[int], *, link_bandwidth: float = DEFAULT_LINK_BANDWIDTH,
           hop_latency: float = DEFAULT_HOP_LATENCY, device: str = "v100",
           memory_bytes: float | None = None, flops: float | None = None,
           name: str | None = None) -> Topology:
    return grid("mesh2d", shape, 2, False, link_bandwidth=link_bandwidth,
                hop_latency=hop_latency, device=device, memory_bytes=memory_bytes, flops=flops,
                name=name)


def torus2d(shape: Sequence[int], *, link_bandwidth: float = DEFAULT_LINK_BANDWIDTH,
            hop_latency: float = DEFAULT_HOP_LATENCY, device: str = "v100",
            memory_bytes: float | None = None, flops: float | None = None,
            name: str | None = None) -> Topology:
    return grid("torus2d", shape, 2, True, link_bandwidth=link_bandwidth,
                hop_latency=hop_latency, device=device, memory_bytes=memory_bytes, flops=flops,
                name=name)


def mesh3d(shape: Sequence[int], *, link_bandwidth: float = DEFAULT_LINK_BANDWIDTH,
           hop_latency: float = DEFAULT_HOP_LATENCY, device: str = "v100",
           memory_bytes: float | None = None, flops: float | None = None,
           name: str | None = None) -> Topology:
    return grid("mesh3d", shape, 3, False, link_bandwidth=link_bandwidth,
                hop_latency=hop_latency, device=device, memory_bytes=memory_bytes, flops=flops,
                name=name)


def torus3d(shape: Sequence[int], *, link_bandwidth: float = DEFAULT_LINK_BANDWIDTH,
            hop_latency: float = DEFAULT_HOP_LATENCY, device: str = "v100",
            memory_bytes: float | None = None, flops: float | None = None,
            name: str | None = None) -> Topology:
    return grid("torus3d", shape, 3, True, link_bandwidth=link_bandwidth,
                hop_latency=hop_latency, device=device, memory_bytes=memory_bytes, flops=flops,
                name=name)


_TORUS_MIN = ", every size >= 3 (smaller rings are mesh lines)"
mesh2d.__doc__ = _DOC.format(d=2, what="mesh", extra="", ex="(4, 4)", minsize="", names="0_1",
                             e="~4")
torus2d.__doc__ = _DOC.format(d=2, what="torus", extra=" (a mesh with wraparound links)",
                              ex="(8, 8)", minsize=_TORUS_MIN, names="0_1", e="4")
mesh3d.__doc__ = _DOC.format(d=3, what="mesh", extra="", ex="(4, 4, 4)", minsize="",
                             names="0_1_2", e="~6")
torus3d.__doc__ = _DOC.format(d=3, what="torus", extra=" (a mesh with wraparound links)",
                              ex="(4, 4, 4)", minsize=_TORUS_MIN, names="0_1_2", e="6")
