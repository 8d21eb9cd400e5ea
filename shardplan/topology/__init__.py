"""Device topologies: builders for the papers' machines, routing, and measurement.

Every builder returns a validated :class:`~shardplan.ir.Topology` (``shardplan.topology/1``)
whose ``bandwidth``/``latency`` matrices are end-to-end values for every reachable pair;
multi-hop networks (meshes, tori) also carry their physical ``links``.

=================  ===========================================================================
kind               builder
=================  ===========================================================================
``flat``           :func:`flat`: one bandwidth and latency for every pair
``hierarchical``   :func:`hierarchical`: region > rack > box > GPU, one link class per level
``dgx1``           :func:`dgx1`: DGX-1 V100 boxes (NV2, NV1, PCIe inside; Ethernet between)
``mesh2d`` ...     :func:`mesh2d`, :func:`torus2d`, :func:`mesh3d`, :func:`torus3d`
``random-blk-1``   :func:`random_blk_1`, :func:`random_blk_2`, :func:`uniform_dist`: paper 002's
                   random heterogeneous topologies (definitions in their docstrings)
``measure``        :func:`measure`: ping-pong between N local torch.distributed processes
=================  ===========================================================================

Builders are NumPy/SciPy only and fast; only :func:`measure` imports torch (in its ranks).

Examples
--------
>>> from shardplan.topology import build
>>> topo = build("dgx1", boxes=2)
>>> topo.num_devices, [lv.name for lv in topo.levels]
(16, ['box'])
>>> float(build("mesh2d", shape=(3, 3)).latency[0, 8])  # 4 hops of 1 us
4e-06
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.ir.topology import Topology
from shardplan.topology._devices import DEVICE_PRESETS, DevicePreset, make_devices
from shardplan.topology._dgx import DGX1_NVLINKS, dgx1, dgx1_link_counts
from shardplan.topology._grid import grid_links, mesh2d, mesh3d, torus2d, torus3d
from shardplan.topology._measure import fit_link, measure
from shardplan.topology._random import random_blk_1, random_blk_2, uniform_dist
from shardplan.topology._routing import Routes, path, route, routes_of
from shardplan.topology._simple import flat, hierarchical

__all__ = [
    "BUILDERS", "DEVICE_PRESETS", "DGX1_NVLINKS", "DevicePreset", "Routes", "build", "dgx1",
    "dgx1_link_counts", "fit_link", "flat", "grid_links", "hierarchical", "kinds",
    "make_devices", "measure", "mesh2d", "mesh3d", "path", "random_blk_1", "random_blk_2",
    "route", "routes_of", "torus2d", "torus3d", "uniform_dist",
]

#: Topology builders by kind (the names of ``shardplan topology KIND``).
BUILDERS: dict[str, Callable[..., Topology]] = {
    "flat": flat,
    "hierarchical": hierarchical,
    "dgx1": dgx1,
    "mesh2d": mesh2d,
    "torus2d": torus2d,
    "mesh3d": mesh3d,
    "torus3d": torus3d,
    "random-blk-1": random_blk_1,
    "random-blk-2": random_blk_2,
    "uniform-dist": uniform_dist,
    "measure": measure,
}


def kinds() -> list[str]:
    """The registered topology kinds, in registry order."""
    return list(BUILDERS)


def build(kind: str, **options: Any) -> Topology:
    """Build a topology of a registered kind.

    Parameters
    ----------
    kind : str
        A key of :data:`BUILDERS`; underscores are accepted for hyphens (``random_blk_1``).
    **options
        The builder's arguments by name (its first positional argument too, e.g.
        ``num_devices=8`` or ``shape=(4, 4)``).

    Raises
    ------
    ShardplanError
        Unknown kind, an option the builder does not take, a missing required option, or an
        invalid value.
    """
    key = str(kind).replace("_", "-")
    fn = BUILDERS.get(key)
    if fn is None:
        raise ShardplanError(f"unknown topology kind {kind!r} (choose from "
                             f"{', '.join(BUILDERS)})")
    sig = inspect.signature(fn)
    public = [p for p in sig.parameters if not p.startswith("_")]
    unknown = [k for k in options if k not in public]
    if unknown:
        raise ShardplanError(f"topology {key} does not take option{'s' if len(unknown) > 1 else ''}"
                             f" {', '.join(unknown)} (it takes {', '.join(public)})")
    try:
        sig.bind(**options)
    except TypeError:
        missing = [p.name for p in sig.parameters.values()
                   if p.default is inspect.Parameter.empty and p.name not in options]
        raise ShardplanError(f"topology {key} needs {', '.join(missing)}") from None
    return fn(**options)
