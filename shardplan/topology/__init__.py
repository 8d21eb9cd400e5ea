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
``dgx-a100``       :func:`dgx_a100`, :func:`dgx_h100`, :func:`dgx_h200`, :func:`dgx_b200`,
                   :func:`dgx2_v100`, :func:`pcie_h100` (``dgx-h100``, ``dgx-h200``,
                   ``dgx-b200``, ``dgx2-v100``, ``pcie-h100``): GPU cluster presets,
                   ``nodes`` nodes joined by InfiniBand, every figure from a datasheet
                   (:data:`CLUSTER_PRESETS`)
``gb200-nvl72``    :func:`gb200_nvl72`: ``racks`` NVL72 racks, 72 GPUs per NVLink domain
``custom``         :func:`custom_cluster`: nodes of a GPU of one's own (options or
                   ``gpu=@FILE.json``)
``mesh2d`` ...     :func:`mesh2d`, :func:`torus2d`, :func:`mesh3d`, :func:`torus3d`
``random-blk-1``   :func:`random_blk_1`, :func:`random_blk_2`, :func:`uniform_dist`: paper 002's
                   random heterogeneous topologies (definitions in their docstrings)
``measure``        :func:`shardplan.measure.measure`: ping-pong between N local
                   torch.distributed processes; registered by importing :mod:`shardplan.measure`
=================  ===========================================================================

Builders are NumPy/SciPy only and fast. Measuring a machine runs the runtime, so it lives
above it, in :mod:`shardplan.measure`, which registers its builder here
(:func:`register_builder`): this package imports neither torch, the runtime, the strategy nor
the capture package (``docs/architecture.md``). Kinds may also be given as one string
``KIND,key=value,...`` (``dgx-a100,nodes=4,gpu_memory=40GiB``): :func:`parse_spec`,
:func:`build_spec`.

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
from shardplan.topology._clusters import (
    CLUSTER_KINDS,
    CLUSTER_PRESETS,
    ClusterPreset,
    custom_cluster,
    dgx2_v100,
    dgx_a100,
    dgx_b200,
    dgx_cluster,
    dgx_h100,
    dgx_h200,
    gb200_nvl72,
    pcie_h100,
)
from shardplan.topology._custom import ARCH_REFERENCE, CustomGPU
from shardplan.topology._devices import DEVICE_PRESETS, DevicePreset, make_devices
from shardplan.topology._dgx import DGX1_NVLINKS, dgx1, dgx1_link_counts
from shardplan.topology._grid import grid_links, mesh2d, mesh3d, torus2d, torus3d
from shardplan.topology._random import random_blk_1, random_blk_2, uniform_dist
from shardplan.topology._routing import Routes, path, route, routes_of
from shardplan.topology._simple import flat, hierarchical

__all__ = [
    "ARCH_REFERENCE", "BUILDERS", "CLUSTER_KINDS", "CLUSTER_PRESETS", "DEVICE_PRESETS",
    "DGX1_NVLINKS", "ClusterPreset", "CustomGPU", "DevicePreset", "Routes", "build",
    "build_spec", "custom_cluster", "dgx1", "dgx1_link_counts", "dgx2_v100", "dgx_a100",
    "dgx_b200", "dgx_cluster", "dgx_h100", "dgx_h200", "flat", "gb200_nvl72", "grid_links",
    "hierarchical", "kinds", "make_devices", "mesh2d", "mesh3d", "parse_spec", "path",
    "pcie_h100", "random_blk_1", "random_blk_2", "register_builder", "route", "routes_of",
    "torus2d", "torus3d", "uniform_dist",
]

#: Topology builders by kind (the names of ``shardplan topology KIND``).
BUILDERS: dict[str, Callable[..., Topology]] = {
    "flat": flat,
    "hierarchical": hierarchical,
    "dgx1": dgx1,
    "dgx-a100": dgx_a100,
    "dgx-h100": dgx_h100,
    "dgx2-v100": dgx2_v100,
    "dgx-h200": dgx_h200,
    "dgx-b200": dgx_b200,
    "pcie-h100": pcie_h100,
    "gb200-nvl72": gb200_nvl72,
    "custom": custom_cluster,
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


def parse_spec(text: str) -> tuple[str, dict[str, Any]]:
    """``"KIND,key=value,..."`` -> ``(kind, options)``, as ``plan --cluster`` and
    ``shardplan topology`` read it.

    Keys take ``-`` or ``_`` (``devices`` is ``num_devices``, the name of ``topology
    --devices``); a value ``AxB`` becomes a tuple of ints, a number an int or a float, and
    anything else stays a string for the builder to read (``gpu_memory=40GiB``).

    Examples
    --------
    >>> parse_spec("dgx-a100,nodes=4,gpu_memory=40GiB")
    ('dgx-a100', {'nodes': 4, 'gpu_memory': '40GiB'})

    Raises
    ------
    ShardplanError
        An option that is not ``KEY=VALUE``, or a key given twice.
    """
    kind, *opts = str(text).split(",")
    options: dict[str, Any] = {}
    for o in opts:
        key, sep, value = o.partition("=")
        if not sep or not key.strip():
            raise ShardplanError(f"topology option {o!r} is not KEY=VALUE (in {text!r})")
        given = key.strip()
        key = given.replace("-", "_")
        key = {"devices": "num_devices"}.get(key, key)
        if key in options:
            raise ShardplanError(f"topology option {given!r} is given twice in {text!r}")
        v: Any = value.strip()
        if "x" in v and all(part.isdigit() for part in v.split("x")):
            v = tuple(int(part) for part in v.split("x"))
        else:
            for cast in (int, float):
                try:
                    v = cast(v)
                    break
                except ValueError:
                    continue
        options[key] = v
    return kind.strip(), options


def build_spec(text: str) -> Topology:
    """The topology ``"KIND,key=value,..."`` names (:func:`parse_spec`, then :func:`build`).

    Examples
    --------
    >>> build_spec("dgx-h100,nodes=2").num_devices
    16
    """
    kind, options = parse_spec(text)
    return build(kind, **options)
