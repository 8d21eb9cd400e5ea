"""Collectives among a stage's replicas: all-reduce, all-gather, reduce-scatter, all-to-all.

One place prices them for the stage-time model and the simulator: the topology's measured
curve for the group size when it has one (``topology measure`` writes them: real libraries'
collectives are slower than their point-to-point bandwidth suggests, gloo's by about 2x on
this machine), on a GPU cluster preset NCCL's time (:mod:`shardplan.cost._gpu`, as LLM plans
price theirs), else the ring algorithm over the group's slowest ring link.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardplan.cost._formulas import ring_allreduce_seconds
from shardplan.cost._links import inverse_bandwidth
from shardplan.ir import Topology

__all__ = ["COLLECTIVES", "collective_seconds", "curve_seconds", "measured_seconds",
           "ring_collectives", "ring_steps"]

COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall")


def ring_steps(kind: str, replicas: int) -> int:
    """Synchronised steps of the ring algorithm, each moving ``bytes / R`` per device:
    ``2 (R - 1)`` for an all-reduce (reduce-scatter then all-gather), ``R - 1`` for the
    others. An all-to-all of a ``bytes`` buffer per device sends ``(R - 1) / R`` of it, the
    traffic of an all-gather of a ``bytes`` tensor, and is priced as one."""
    if kind not in COLLECTIVES:
        raise ValueError(f"unknown collective {kind!r}")
    return (2 if kind == "allreduce" else 1) * (int(replicas) - 1)


def measured_seconds(topology: Topology, kind: str, group_size: int,
                     nbytes: Any) -> Any:
    """A group size's collective time in closed form, for ``nbytes`` (a number or an
    array), or None (then the ring over the group's links prices it): the measured curve's
    time (linear between the measured sizes, the smallest size's time below them, and
    beyond the largest the last segment's slope, its bandwidth, carried on); without a
    curve, on a GPU cluster preset, NCCL's
    (:func:`~shardplan.cost._gpu.cluster_collective_seconds`, the group packed onto whole
    nodes). 0 for no bytes. O(log points) per value."""
    curve = topology.collective_curve(kind, group_size)
    if curve is None and kind in ("reducescatter", "alltoall"):
        curve = topology.collective_curve("allgather", group_size)  # the same traffic
    if curve is None:
        from shardplan.cost._gpu import cluster_collective_seconds

        return cluster_collective_seconds(topology, kind, group_size, nbytes)
    return curve_seconds(curve, nbytes)


def curve_seconds(curve: tuple[np.ndarray, np.ndarray], nbytes: Any) -> Any:
    """A measured ``(bytes, seconds)`` curve's time for ``nbytes`` (see
    :func:`measured_seconds`). A point above the time of a larger size is taken down to it
    (a collective of more bytes never finishes sooner: on a shared machine such a point is
    interference; here a 1 MiB all-reduce once measured 3.7 ms against 3.1 ms for 4 MiB).
    O(points + log points) per value."""
    b, t = curve
    t = np.minimum.accumulate(np.asarray(t, dtype=np.float64)[::-1])[::-1]
    x = np.asarray(nbytes, dtype=np.float64)
    slope = (t[-1] - t[-2]) / (b[-1] - b[-2]) if b.size > 1 else t[-1] / b[-1]
    out = np.where(x <= b[-1], np.interp(x, b, t), t[-1] + max(slope, 0.0) * (x - b[-1]))
    out = np.where(x > 0, out, 0.0)
    return float(out) if out.ndim == 0 else out


def collective_seconds(topology: Topology, kind: str, devices: Any, nbytes: float,
                       inv_bandwidth: np.ndarray | None = None) -> float:
    """Seconds of collective ``kind`` of ``nbytes`` (the whole tensor) over ``devices`` (in
    ring order): 0 for one device or no bytes; the measured curve for that group size when
    the topology has one; else ``steps x max over ring links (latency + bytes / (R B))``
    (:func:`ring_steps`; the all-reduce is :func:`ring_allreduce_seconds`). ``inf`` when a
    ring link has no route. O(R)."""
    dev = np.asarray(devices, dtype=np.int64).reshape(-1)
    r = dev.size
    if r <= 1 or nbytes <= 0:
        return 0.0
    measured = measured_seconds(topology, kind, r, float(nbytes))
    if measured is not None:
        return measured
    if inv_bandwidth is None:
        inv_bandwidth = inverse_bandwidth(topology)
    nxt = np.roll(dev, -1)
    lat, ib = topology.latency[dev, nxt], inv_bandwidth[dev, nxt]
    full = ring_allreduce_seconds(r, float(nbytes), lat, ib).max()  # 2 (R - 1) steps
    return float(full * ring_steps(kind, r) / (2 * (r - 1)))


def ring_collectives(topology: Topology, kind: str, devices: np.ndarray, nbytes: np.ndarray,
                     inv_bandwidth: np.ndarray) -> np.ndarray:
    """:func:`collective_seconds` of every row of ``devices`` (S, R: one ring per stage, the
    same R) for ``nbytes`` (S,), vectorised. O(S R)."""
    dev = np.asarray(devices, dtype=np.int64)
    s_count, r = dev.shape
    b = np.asarray(nbytes, dtype=np.float64)
    if r <= 1:
        return np.zeros(s_count)
    measured = measured_seconds(topology, kind, r, b)
    if measured is not None:
        return np.asarray(measured, dtype=np.float64)
    nxt = np.roll(dev, -1, axis=1)
    full = ring_allreduce_seconds(r, b[:, None], topology.latency[dev, nxt],
                                  inv_bandwidth[dev, nxt]).max(axis=1)
    return full * ring_steps(kind, r) / (2 * (r - 1))
