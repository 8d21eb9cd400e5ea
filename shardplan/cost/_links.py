"""What a byte costs between every device pair: :func:`inverse_bandwidth`, read by both the
point-to-point transfers (:mod:`shardplan.cost._transfer`) and the ring collectives
(:mod:`shardplan.cost._collectives`)."""

from __future__ import annotations

import numpy as np

from shardplan.ir import Topology

__all__ = ["inverse_bandwidth"]


def inverse_bandwidth(topology: Topology) -> np.ndarray:
    """Seconds per byte between every device pair: ``1 / bandwidth``.

    Zero on the diagonal (a device does not send to itself), ``inf`` where the bandwidth is 0
    (no route). Shape (D, D). O(D^2); for a topology with a pair model (builders' kinds) a
    read-only :class:`~shardplan.ir._pairs.PairMatrix` computing the entries indexed (O(1)).
    """
    model = topology.pair_model
    if model is not None:
        return model.matrix("inverse_bandwidth")
    bw = topology.bandwidth
    with np.errstate(divide="ignore"):
        inv = np.where(bw > 0, 1.0 / np.where(bw > 0, bw, 1.0), np.inf)
    np.fill_diagonal(inv, 0.0)
    return inv
