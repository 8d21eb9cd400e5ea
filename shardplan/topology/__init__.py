"""Device topologies: builders for the papers' machines, and routing.

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
``measure``        :func:`shardplan.measure.measure`: ping-pong between N local
                   torch.distributed processes; registered by importing :mod:`shardplan.measure`
=================  ===========================================================================

Builders are NumPy/SciPy only and fast. Measuring a machine runs the runtime, so it lives
above it, in :mod:`shardplan.measure`, which registers its builder here
(:func:`register_builder`): this package imports neither torch, the runtime, the strategy nor
the capture package (``docs/architecture.md``). GPU cluster presets (issue 36) belong here,
beside :data:`DEVICE_PRESETS` and :func:`dgx1`.

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
from shardplan.topology._random import random_blk_1, random_blk_2, uniform_dist
from shardplan.topology._routing import Routes, path, route, routes_of
from shardplan.topology._simple import flat, hierarchical

__all__ = [
    "BUILDERS", "DEVICE_PRESETS", "DGX1_NVLINKS", "DevicePreset", "Routes", "build", "dgx1",
    "dgx1_link_counts", "flat", "grid_links", "hierarchical", "kinds", "make_devices",
    "mesh2d", "mesh3d", "path", "random_blk_1", "random_blk_2", "register_builder", "route",
    "routes_of", "torus2d", "torus3d", "uniform_dist",
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
}

#: Kinds whose builder a package above this one registers, and that package: named in the
#: error when the kind is asked for before that package was imported.
_REGISTERED_BY = {"measure": "shardplan.measure"}


def register_builder(kind: str, builder: Callable[..., Topology]) -> None:
    """Add a builder under ``kind`` (how :mod:`shardplan.measure` adds ``measure``, from above
    this package); registering the same function again is a no-op.

    Raises
    ------
    ShardplanError
        ``kind`` already names another builder.
    """
    have = BUILDERS.get(kind)
    if have is not None and have is not builder:
        raise ShardplanError(f"topology kind {kind!r} is already registered")
    BUILDERS[kind] = builder


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
    if fn is None and key in _REGISTERED_BY:
        raise ShardplanError(f"topology kind {key!r} is registered by {_REGISTERED_BY[key]}: "
                             f"import it first")
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
