"""Transfer time between devices and between stages: Parmesan's c_m (sections 4.1 and 5.2)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from shardplan.cost._checks import check_assignment
from shardplan.cost._collectives import collective_seconds
from shardplan.cost._formulas import message_seconds
from shardplan.cost._links import inverse_bandwidth
from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Topology

__all__ = ["allreduce_seconds", "cut_tensors", "inverse_bandwidth", "replica_transfer_seconds",
           "stage_traffic",
           "stage_transfer_seconds", "transfer_seconds", "transfer_seconds_matrix",
           "stage_devices_array", "transfer_seconds_pairs"]


def _check_device(topology: Topology, d: Any, what: str) -> int:
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or \
            not 0 <= d < topology.num_devices:
        raise ShardplanError(f"{what} device must be an integer in [0, {topology.num_devices}),"
                             f" got {d!r}")
    return int(d)


def transfer_seconds(topology: Topology, i: int, j: int, nbytes: float) -> float:
    """Seconds to send ``nbytes`` from device ``i`` to device ``j``.

    ``latency[i, j] + nbytes / bandwidth[i, j]``: the routed end-to-end latency and
    bottleneck bandwidth of the topology file (the contract's matrices are already routed).
    0 when ``i == j`` or ``nbytes <= 0``; ``inf`` when j cannot be reached from i.

    Notes
    -----
    The alpha-beta (latency-bandwidth) model behind Parmesan's c_m(v, v') (section 4.1,
    equation 3) and its device-mapping stage times (section 5.2). O(1).

    Examples
    --------
    >>> from shardplan.ir import Device, Topology
    >>> t = Topology(name="t", devices=(Device("a", 1e9, 1e12), Device("b", 1e9, 1e12)),
    ...              bandwidth=[[0, 1e9], [1e9, 0]], latency=[[0, 1e-5], [1e-5, 0]])
    >>> transfer_seconds(t, 0, 1, 1e6)
    0.00101
    """
    i = _check_device(topology, i, "source")
    j = _check_device(topology, j, "destination")
    return topology.transfer_seconds(i, j, float(nbytes))


def transfer_seconds_matrix(topology: Topology, nbytes: float) -> np.ndarray:
    """:func:`transfer_seconds` of ``nbytes`` for every ordered device pair, shape (D, D)."""
    lat = topology.latency.copy()
    out = lat + float(nbytes) * inverse_bandwidth(topology) if nbytes > 0 else 0.0 * lat
    np.fill_diagonal(out, 0.0)
    return out


def transfer_seconds_pairs(topology: Topology, src_devices: Any, dst_devices: Any,
                           nbytes: Any) -> np.ndarray:
    """Elementwise :func:`transfer_seconds` over arrays of (source, destination, bytes).

    The arrays broadcast together. O(size).
    """
    s = np.asarray(src_devices, dtype=np.int64)
    d = np.asarray(dst_devices, dtype=np.int64)
    b = np.asarray(nbytes, dtype=np.float64)
    num = topology.num_devices
    for arr, what in ((s, "source"), (d, "destination")):
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= num):
            raise ShardplanError(f"{what} devices must lie in [0, {num})")
    bw = topology.bandwidth[s, d]
    with np.errstate(divide="ignore"):
        inv = np.where(bw > 0, 1.0 / np.where(bw > 0, bw, 1.0), np.inf)
    t = message_seconds(1.0, topology.latency[s, d], b, inv)
    return np.where(s == d, 0.0, t)


def cut_tensors(graph: Graph, assignment: np.ndarray, num_stages: int, *,
                dedupe: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The tensors that cross between stages: ``(from_stage, to_stage, bytes, producer)``.

    Every edge whose ends are in different stages and that carries bytes is a tensor sent from
    the producer's stage to the consumer's. With ``dedupe`` (the default) a producer's output
    is sent once to each consuming stage however many of its nodes read it, with the largest
    bytes among those edges: we take all edges leaving a node to carry its one output (true of
    most operators; a multi-output node whose edges carry different tensors is then
    undercounted). ``assignment`` must be valid (see :func:`stage_traffic`).
    O(m log m) with ``dedupe``, O(m) without.
    """
    sa, da = assignment[graph.src], assignment[graph.dst]
    cut = (sa != da) & (graph.edge_bytes > 0)
    s, d = sa[cut], da[cut]
    b = graph.edge_bytes[cut].astype(np.float64)
    u = graph.src[cut]
    if dedupe and u.size:
        key = u * np.int64(num_stages) + d
        order = np.lexsort((-b, key))  # by key, largest bytes first
        ks = key[order]
        first = order[np.concatenate(([True], ks[1:] != ks[:-1]))]
        s, d, b, u = s[first], d[first], b[first], u[first]
    return s, d, b, u


def stage_traffic(graph: Graph, assignment: Sequence[int] | np.ndarray,
                  num_stages: int | None = None, *,
                  dedupe: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Bytes and tensor counts sent between stages in one forward pass of a micro-batch.

    Returns ``(B, T)``, each of shape (k, k) with a zero diagonal: ``B[a, b]`` is the bytes
    stage a sends to stage b, ``T[a, b]`` the number of distinct tensors (messages) among
    them (see :func:`cut_tensors` for ``dedupe``). The backward pass sends gradients of the
    same sizes the other way. Unlike :meth:`Graph.stage_graph`, which sums every edge, a tensor
    read by several nodes of one stage is counted once. O(m log m + k^2).
    """
    a, k = check_assignment(graph, assignment, num_stages)
    s, d, b, _ = cut_tensors(graph, a, k, dedupe=dedupe)
    flat = s * k + d
    bytes_m = np.bincount(flat, weights=b, minlength=k * k).reshape(k, k)
    count_m = np.bincount(flat, minlength=k * k).reshape(k, k).astype(np.float64)
    return bytes_m, count_m


def stage_devices_array(topology: Topology, stage_devices: Any, k: int) -> np.ndarray:
    """Stage devices as a (k, r) int array (one column per replica)."""
    try:
        dev = np.asarray(stage_devices, dtype=np.int64)
    except (TypeError, ValueError):
        raise ShardplanError("stage devices must be one device per stage, or the same number "
                             "of replica devices for every stage") from None
    if dev.ndim == 1:
        dev = dev[:, None]
    if dev.ndim != 2 or dev.shape[0] != k or dev.shape[1] < 1:
        raise ShardplanError(f"stage devices must have shape ({k},) or ({k}, replicas), got "
                             f"{np.shape(stage_devices)}")
    if dev.size and (int(dev.min()) < 0 or int(dev.max()) >= topology.num_devices):
        raise ShardplanError(f"stage devices must lie in [0, {topology.num_devices})")
    return dev


def stage_transfer_seconds(topology: Topology, traffic_bytes: np.ndarray,
                           traffic_tensors: np.ndarray, stage_devices: Any, *,
                           gradients: bool = True) -> np.ndarray:
    """Communication seconds of every stage for one micro-batch: Parmesan's c_m(s).

    For a stage s on device ``p(s)``, the sum over the tensors it sends or receives of
    ``latency + bytes / bandwidth`` between the two stages' devices: activations in the
    forward pass and, with ``gradients``, gradients of the same size in the opposite direction
    in the backward pass. Formally, with ``B, T`` from :func:`stage_traffic`,
    ``L = latency[p][:, p]`` and ``I = 1 / bandwidth[p][:, p]``::

        F = T * L + (B / r) * I          (forward: a -> b)
        G = T * L.T + (B / r) * I.T      (backward: gradient of a's tensor from b to a)
        c_m(s) = sum_b F[s, b] + F[b, s] + G[s, b] + G[b, s]

    Parameters
    ----------
    topology : Topology
    traffic_bytes, traffic_tensors : ndarray, shape (k, k)
        From :func:`stage_traffic`.
    stage_devices : array of int, shape (k,) or (k, r)
        The device of every stage, or of each of its r replicas. Replica i of a stage talks
        to replica i of the others (Parmesan section 5: the stage graph copied r times), and
        each replica carries ``1/r`` of the bytes (it runs ``1/r`` of the micro-batch); the
        stage's time is its slowest replica's.
    gradients : bool, default True

    Returns
    -------
    ndarray of float64, shape (k,)
        ``inf`` for a stage that must talk to an unreachable device.

    Notes
    -----
    Parmesan's equation 3 (section 4.1) adds ``c_m(v, v')`` for every operator v of the
    stage and every neighbour v' outside it; its device-mapping instantiation (section 5.2,
    equation 6) is ``c_m(s, p) = sum over adjacent s' of M(s, s') / B(p(s), p(s'))`` with
    M "the communication size between s and s'". Neither says which passes M covers. Ours is
    equation 6 with M the bytes of both passes (activations forward, gradients backward),
    each direction at its own bandwidth, plus one latency per message (one per distinct
    tensor and pass); on a symmetric topology without latency the two agree exactly. Both
    the sender and the receiver are charged (a stage is busy while it sends or receives: no
    overlap with compute, which makes the estimate conservative). Data-parallel gradient
    all-reduce is :func:`allreduce_seconds`. O(r k^2).
    """
    bytes_m = np.asarray(traffic_bytes, dtype=np.float64)
    k = bytes_m.shape[0]
    count_m = np.asarray(traffic_tensors, dtype=np.float64)
    if bytes_m.shape != (k, k) or count_m.shape != (k, k):
        raise ShardplanError("traffic bytes and tensors must be square matrices of one size")
    dev = stage_devices_array(topology, stage_devices, k)
    per = replica_transfer_seconds(topology, inverse_bandwidth(topology), bytes_m, count_m,
                                   dev, gradients=gradients)
    return per.max(axis=0)


def replica_transfer_seconds(topology: Topology, inv_bandwidth: np.ndarray,
                             traffic_bytes: np.ndarray, traffic_tensors: np.ndarray,
                             devices: np.ndarray, *, gradients: bool = True) -> np.ndarray:
    """:func:`stage_transfer_seconds` of each replica, shape (r, k); inputs trusted."""
    k, r = devices.shape
    out = np.zeros((r, k))
    for i in range(r):
        p = devices[:, i]
        lat = topology.latency[np.ix_(p, p)] * (p[:, None] != p[None, :])
        ib = inv_bandwidth[np.ix_(p, p)]
        fwd = message_seconds(traffic_tensors, lat, traffic_bytes / r, ib)
        per = fwd.sum(axis=1) + fwd.sum(axis=0)
        if gradients:
            bwd = message_seconds(traffic_tensors, lat.T, traffic_bytes / r, ib.T)
            per = per + bwd.sum(axis=1) + bwd.sum(axis=0)
        out[i] = per
    return out


def allreduce_seconds(topology: Topology, devices: Sequence[int] | np.ndarray,
                      nbytes: float) -> float:
    """Seconds of a ring all-reduce of ``nbytes`` over ``devices`` (in ring order).

    The ring all-reduce (Parmesan section 5.2, footnote 1) runs ``2 (r - 1)`` steps
    (reduce-scatter, then all-gather); in each, every device sends ``nbytes / r`` to the next
    one on the ring at once, so a step lasts as long as the slowest ring link::

        t = 2 (r - 1) * max_i (latency[d_i, d_{i+1}] + nbytes / (r * bandwidth[d_i, d_{i+1}]))

    This is Parmesan's c_AR (equation 7, ``max over ring pairs of 2 (R - 1) P(s) /
    (R B)``) plus a latency per step; without latency the two are equal. 0 for one device or
    no bytes, ``inf`` if a ring link has no route. A topology with a measured all-reduce
    curve for r devices uses it instead (:mod:`shardplan.cost._collectives`). O(r).
    """
    dev = np.asarray(devices, dtype=np.int64).reshape(-1)
    r = dev.size
    if r and (int(dev.min()) < 0 or int(dev.max()) >= topology.num_devices):
        raise ShardplanError(f"all-reduce devices must lie in [0, {topology.num_devices})")
    if r <= 1 or nbytes <= 0:
        return 0.0
    return collective_seconds(topology, "allreduce", dev, float(nbytes))
