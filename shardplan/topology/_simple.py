"""Flat and hierarchical topologies: one bandwidth per level of a tree of groups."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.ir._pairs import LevelPairs
from shardplan.ir.topology import Level, Topology
from shardplan.topology._devices import (
    check_count,
    check_device_count,
    check_list,
    check_nonnegative,
    check_positive,
    check_shape,
    generator_meta,
    make_devices,
)

__all__ = ["DEFAULT_TIERS", "flat", "hierarchical"]

#: Default per-level (name, bandwidth B/s, latency s), outermost first, for hierarchies of up
#: to four levels; a shallower hierarchy takes the innermost entries. A pair's values are those
#: of the outermost level where the two devices differ:
#: different regions: 10 Gb/s of a shared wide-area link, 1 ms;
#: same region, different racks: 100 Gb/s Ethernet through the spine, 20 us;
#: same rack, different boxes: 200 Gb/s InfiniBand HDR, 5 us;
#: same box: NVLink/NVSwitch class, 150 GB/s per direction, 2 us.
DEFAULT_TIERS: tuple[tuple[str, float, float], ...] = (
    ("region", 1.25e9, 1e-3),
    ("rack", 1.25e10, 2e-5),
    ("box", 2.5e10, 5e-6),
    ("gpu", 1.5e11, 2e-6),
)


def flat(num_devices: int, *, bandwidth: float = 1.25e10, latency: float = 1e-5,
         device: str = "v100", memory_bytes: float | None = None, flops: float | None = None,
         name: str | None = None) -> Topology:
    """A flat topology: every pair of devices has the same bandwidth and latency.

    Parameters
    ----------
    num_devices : int
        D >= 1.
    bandwidth : float
        Bytes/s between any two devices (default 1.25e10, 100 Gb/s).
    latency : float
        Seconds (default 1e-5).
    device : {"v100", "a100", "h100"}
        Device preset (see ``DEVICE_PRESETS``); ``memory_bytes`` and ``flops`` override it.
    name : str, optional
        Topology name (default ``flat-D``).

    Returns
    -------
    Topology
        Devices ``gpu0..gpu{D-1}``, constant matrices (a one-level pair model, computed on
        demand), no levels or links.

    Notes
    -----
    The "flattened device topology of constant bandwidth" that Parmesan (paper 002, section 2)
    says RaNNC assumes; the baseline of the mapping experiments. O(D).
    """
    n = check_count("num_devices", num_devices)
    check_device_count("flat", n)
    bw = check_positive("bandwidth", bandwidth)
    lat = check_nonnegative("latency", latency)
    model = LevelPairs((n,), (bw,), (lat,))
    return Topology(
        name=name or f"flat-{n}",
        devices=make_devices([f"gpu{i}" for i in range(n)], device, memory_bytes, flops),
        bandwidth=model.matrix("bandwidth"), latency=model.matrix("latency"),
        meta=generator_meta("flat", num_devices=n, bandwidth=bw, latency=lat),
    )


def hierarchical(shape: Sequence[int], *, level_names: Sequence[str] | None = None,
                 bandwidth: Sequence[float] | None = None,
                 latency: Sequence[float] | None = None, device: str = "v100",
                 memory_bytes: float | None = None, flops: float | None = None,
                 name: str | None = None) -> Topology:
    """A tree of groups (region > rack > box > GPU, ...), each level with its own link class.

    Parameters
    ----------
    shape : sequence of int
        Group sizes from the outermost level to the devices: ``(2, 4, 3, 4)`` is 2 regions of
        4 racks of 3 boxes of 4 GPUs, 96 devices, numbered row-major (the last index varies
        fastest, so the devices of a box are consecutive).
    level_names : sequence of str, optional
        One name per entry of ``shape``; default the innermost of ``region, rack, box, gpu``
        (``level0, level1, ...`` beyond four levels).
    bandwidth, latency : sequence of float, optional
        One value per entry of ``shape``, outermost first: ``bandwidth[k]`` is used between
        two devices whose outermost differing level is k (``bandwidth[-1]`` inside the
        innermost group). Defaults from ``DEFAULT_TIERS`` for up to four levels.
    device, memory_bytes, flops, name
        As in :func:`flat`.

    Returns
    -------
    Topology
        Devices named ``region0/rack1/box2/gpu3``; ``levels`` holds one :class:`Level` per
        grouping level, outermost first (the last, singleton device level is left out). The
        matrices are a pair model of the levels (:class:`~shardplan.ir._pairs.LevelPairs`),
        computed on demand: 10^5 devices take megabytes, not the 75 GiB of dense matrices.

    Raises
    ------
    ShardplanError
        Bad shape, lists whose length does not match the shape, or repeated level names.

    Notes
    -----
    The hierarchical topology of paper 000 section 2.4 (its 96-GPU example) and of the
    PipeDream/Piper assumptions discussed in paper 002 section 2. The papers do not say
    whether a faster level may be slower than an outer one; we allow it (it is the user's
    machine) but the defaults grow faster inwards. O(L D) for L levels.
    """
    dims = check_shape("hierarchical", shape, example="2x4x3x4")
    depth = len(dims)
    if level_names is None:
        if depth <= len(DEFAULT_TIERS):
            names = tuple(t[0] for t in DEFAULT_TIERS[len(DEFAULT_TIERS) - depth:])
        else:
            names = tuple(f"level{k}" for k in range(depth))
    else:
        names = tuple(str(s).strip() for s in level_names)
        if len(names) != depth:
            raise ShardplanError(f"hierarchical shape {'x'.join(map(str, dims))} has {depth} "
                                 f"levels but {len(names)} level names were given")
        if any(not s or "/" in s for s in names) or len(set(names)) != depth:
            raise ShardplanError("level names must be distinct, non-empty and without '/'")
    if (bandwidth is None or latency is None) and depth > len(DEFAULT_TIERS):
        raise ShardplanError(f"a hierarchy of {depth} levels has no default bandwidths: give "
                             f"bandwidth and latency ({depth} values each, outermost first)")
    tiers = DEFAULT_TIERS[len(DEFAULT_TIERS) - depth:] if depth <= len(DEFAULT_TIERS) else ()
    what = "outermost level first, one per level of the shape"
    bws = (tuple(t[1] for t in tiers) if bandwidth is None
           else check_list("bandwidth", bandwidth, depth, what=what))
    lats = (tuple(t[2] for t in tiers) if latency is None
            else check_list("latency", latency, depth, what=what, positive=False))

    n = math.prod(dims)
    check_device_count("hierarchical", n)
    # devices i, j are in the same level-k group iff i // stride[k] == j // stride[k],
    # stride[k] = prod(dims[k+1:]); the pair model finds a pair's level that way on demand.
    strides = [math.prod(dims[k + 1:]) for k in range(depth)]
    ids = np.arange(n)
    model = LevelPairs(dims, bws, lats)

    coords = np.stack(np.unravel_index(ids, dims), axis=1)
    dev_names = ["/".join(f"{nm}{c}" for nm, c in zip(names, row, strict=True))
                 for row in coords.tolist()]
    levels = tuple(
        Level(name=names[k], groups=tuple(tuple(range(g * strides[k], (g + 1) * strides[k]))
                                          for g in range(n // strides[k])))
        for k in range(depth - 1)
    )
    return Topology(
        name=name or f"hierarchical-{'x'.join(map(str, dims))}",
        devices=make_devices(dev_names, device, memory_bytes, flops),
        bandwidth=model.matrix("bandwidth"), latency=model.matrix("latency"), levels=levels,
        meta=generator_meta("hierarchical", shape=dims, level_names=names, bandwidth=bws,
                            latency=lats),
    )
