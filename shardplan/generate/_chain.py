"""Chains: the simplest computation graph, a sequence of layers."""

from __future__ import annotations

import numpy as np

from shardplan.generate._attrs import (
    check_int,
    check_real,
    check_size,
    check_weight_range,
    draw_weights,
    graph_from_weights,
    rng_for,
    seed_value,
)
from shardplan.ir import Graph

__all__ = ["chain"]


def chain(
    num_nodes: int = 100,
    *,
    weight_low: int = 1,
    weight_high: int = 10,
    params_per_weight: float = 1e6,
    batch_size: int = 32,
    seed: int | np.random.Generator | None = 0,
    name: str | None = None,
) -> Graph:
    """A path ``0 -> 1 -> ... -> n-1`` with random integer weights.

    Weights are uniform on ``[weight_low, weight_high]``; FLOPs and bytes follow from them as in
    :func:`shardplan.generate.layered`. A chain has a unique topological order, the case in
    which Parmesan's dynamic program over fronted subgraphs is polynomial (Theorem 4.5).

    Parameters
    ----------
    num_nodes : int, default 100
        Nodes (>= 1).
    weight_low, weight_high, params_per_weight, batch_size, seed, name
        As in :func:`shardplan.generate.layered`.

    Returns
    -------
    Graph

    Raises
    ------
    ShardplanError
        An option out of range.

    Notes
    -----
    O(n) time and memory.

    Examples
    --------
    >>> g = chain(4, seed=1)
    >>> g.src.tolist(), g.dst.tolist()
    ([0, 1, 2], [1, 2, 3])
    """
    n = check_int("num_nodes", num_nodes, low=1)
    check_size("chain", n, n - 1)
    lo, hi = check_weight_range(weight_low, weight_high)
    ppw = check_real("params_per_weight", params_per_weight, low=0.0)
    batch = check_int("batch_size", batch_size, low=1)
    rng = rng_for(seed)
    weight = draw_weights(rng, n, lo, hi)
    ids = np.arange(n - 1, dtype=np.int64)
    return graph_from_weights(
        name=name or f"chain-{n}", weight=weight, src=ids, dst=ids + 1,
        params_per_weight=ppw, batch_size=batch,
        meta={"generator": {"kind": "chain", "num_nodes": n, "weight_low": lo,
                            "weight_high": hi, "params_per_weight": ppw, "batch_size": batch,
                            "seed": seed_value(seed)}},
    )
