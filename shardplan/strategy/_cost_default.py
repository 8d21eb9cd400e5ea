"""The communication prices of a device group for PaSE's strategies: the ``pase`` formulas'
collectives and re-shards in seconds over the group's links, which the simulator's price of a
strategy (:mod:`shardplan.strategy._price`, the ``default`` cost model) charges.

Differences from :mod:`shardplan.strategy._cost_pase` (paper 004 equation 1 as restated):

* bytes by dtype (``space.dtype_bytes``) instead of fixed 8-byte words;
* bandwidth and latency from the topology: a collective over P devices runs at the slowest
  link among devices 0..P-1 (the contiguous block a P-way split would use first) and pays
  2 (P - 1) latencies; a re-shard pays the slowest link of all N devices plus one latency;
* an all-reduce over P devices takes the measured curve's time for its bytes when the
  topology has one for P (``topology measure``), instead of the ring formula;
* on a measured topology every collective (an all-reduce, each direction of a re-shard)
  also pays the devices' ``dtensor_collective_overhead_seconds``: what a redistribution of
  the runtime's DTensor program costs between computations beyond the bytes over the link
  and a latency (measured at about 1.4 ms on two CPU processes, where the bytes take
  0.1 ms: the search splits a layer only where that pays);
* every edge is counted: an edge whose consumer does not describe the tensor falls back to a
  ``(batch, rest)`` tensor split by each side's batch dimension, the producer's ``rest``
  by its output's other splits (the consumer reads it whole but for the batch: a split of
  the heads feeding an opaque attention is gathered; without this the search split them
  for free).

Compute, memory and the per-byte DTensor rate are the simulator's
(:class:`~shardplan.strategy._price.StagePricer`); this class prices only what moves.
"""

from __future__ import annotations

import numpy as np

from shardplan.cost._collectives import curve_seconds
from shardplan.cost._overheads import dtensor_collective_overhead, dtensor_op_seconds_per_byte
from shardplan.ir import Topology
from shardplan.strategy._cost_pase import Units, edge_cost
from shardplan.strategy.spaces import Space

__all__ = ["DefaultCostModel"]


def _block_min_bandwidth(topology: Topology) -> tuple[np.ndarray, np.ndarray]:
    """``bw[P]``, ``lat[P]``: slowest bandwidth and largest latency among devices 0..P-1."""
    n = topology.num_devices
    bw = np.asarray(topology.bandwidth, dtype=np.float64)
    lat = np.asarray(topology.latency, dtype=np.float64)
    out_bw = np.full(n + 1, np.inf)
    out_lat = np.zeros(n + 1)
    for p in range(2, n + 1):
        row = np.concatenate([bw[p - 1, :p - 1], bw[:p - 1, p - 1]])
        row = row[row > 0]
        lrow = np.concatenate([lat[p - 1, :p - 1], lat[:p - 1, p - 1]])
        out_bw[p] = min(out_bw[p - 1], row.min() if row.size else np.inf)
        out_lat[p] = max(out_lat[p - 1], lrow.max() if lrow.size else 0.0)
    return out_bw, out_lat


class DefaultCostModel:
    """Collective and re-shard seconds over the first ``devices`` devices of ``topology``.

    Parameters
    ----------
    topology : Topology
        Links (bandwidth, latency), measured collective curves and DTensor overheads.
    devices : int
        Devices the strategy uses (the first ``devices`` of the topology).

    Attributes
    ----------
    units : Units
        The ``pase`` formulas' units in seconds (``mac`` is the slowest device's seconds
        per multiply-add at its peak, kept for the formulas' sake; the simulator's price
        reads compute from the shared cost model instead).
    collective_overhead : float
        Measured DTensor collective overhead each collective pays.
    dtensor_per_byte : float
        Measured DTensor seconds per output byte (forward plus backward).
    """

    def __init__(self, topology: Topology, devices: int) -> None:
        n = min(devices, topology.num_devices)
        flops = float(np.min(topology.device_flops[:n]))
        bw, lat = _block_min_bandwidth(topology)
        # P may exceed the topology's device count only through bad input; clamp.
        self._bw = np.concatenate([bw, np.full(max(0, devices - n), bw[-1])])
        self._lat = np.concatenate([lat, np.full(max(0, devices - n), lat[-1])])
        self.link_bw = float(self._bw[min(devices, len(self._bw) - 1)])
        self.link_lat = float(self._lat[min(devices, len(self._lat) - 1)])
        if not np.isfinite(self.link_bw):
            self.link_bw = float("inf")
        self.collective_overhead = dtensor_collective_overhead(topology, range(n))
        extra = self.collective_overhead
        self.dtensor_per_byte = float(sum(dtensor_op_seconds_per_byte(topology, range(n))))

        # all-reduce curves `topology measure` recorded, by group size: they replace the ring
        # formula for their group sizes (a CPU's gloo all-reduce costs far more per call
        # than 2 (P - 1) point-to-point latencies)
        curves = {q: c for q in range(2, devices + 1)
                  if (c := topology.collective_curve("allreduce", q)) is not None}

        def ar(w: np.ndarray, p: np.ndarray, space: Space) -> np.ndarray:
            p = np.asarray(p, dtype=np.float64)
            pi = np.clip(p.astype(np.int64), 1, len(self._bw) - 1)
            bwp = self._bw[pi]
            t = 2.0 * (p - 1.0) / p * np.asarray(w, dtype=np.float64) * space.dtype_bytes
            with np.errstate(invalid="ignore", divide="ignore"):
                out = np.where(p > 1, t / bwp + 2.0 * (p - 1.0) * self._lat[pi], 0.0)
            if curves:
                out = np.array(out, dtype=np.float64)
                whole = np.broadcast_to(np.asarray(w, dtype=np.float64) * space.dtype_bytes,
                                        out.shape)
                pp = np.broadcast_to(p, out.shape)
                for q, curve in curves.items():
                    mask = pp == q
                    if np.any(mask):
                        out[mask] = curve_seconds(curve, whole[mask])
            return np.where(p > 1, out + extra, out) if extra > 0 else out

        self.units = Units(mac=2.0 / flops,
                           word=lambda space: space.dtype_bytes / self.link_bw,
                           allreduce=ar)

    def edge_cost(self, src: Space, dst: Space, src_id: int, fs: np.ndarray,
                  ft: np.ndarray, edge_bytes: float) -> np.ndarray:
        word = src.dtype_bytes / self.link_bw
        m = edge_cost(src, dst, src_id, fs, ft, word)
        if m is None:
            # (batch, rest) fallback: the tensor as the edge's bytes say.
            words = float(edge_bytes) / src.dtype_bytes
            b = float(src.sizes[src.index(src.batch_dim)]) if src.batch_dim else 1.0
            t = np.array([b, max(words / b, 1.0)])
            a = np.ones((fs.shape[0], 2))
            c = np.ones((ft.shape[0], 2))
            if src.batch_dim:
                a[:, 0] = fs[:, src.index(src.batch_dim)]
            # the producer's other splits of its output: the consumer, which does not
            # describe the tensor, reads it whole but for the batch (a split that is not
            # the batch's is gathered: the runtime's attention gathers split heads' dims)
            in_out = any(src.batch_dim in g for g in src.output)
            a[:, 1] = np.maximum(src.output_parts(fs) / (a[:, 0] if in_out else 1.0), 1.0)
            if dst.batch_dim:
                c[:, 0] = ft[:, dst.index(dst.batch_dim)]
            s = t / a[:, None, :]
            q = t / c[None, :, :]
            overlap = np.prod(np.minimum(q, s), axis=-1)
            cond = np.prod(c, axis=-1)[None, :] <= np.prod(a, axis=-1)[:, None]
            m = 2.0 * word * np.maximum(0.0, np.prod(q, axis=-1) - cond * overlap)
        return np.where(m > 0, m + 2.0 * (self.link_lat + self.collective_overhead), 0.0)
