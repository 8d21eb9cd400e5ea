"""Uniform random DAGs (Erdos-Renyi on the pairs ``i < j``)."""

from __future__ import annotations

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.generate._attrs import (
    check_int,
    check_probability,
    check_real,
    check_size,
    check_weight_range,
    draw_weights,
    graph_from_weights,
    rng_for,
    seed_value,
)
from shardplan.ir import Graph

__all__ = ["random_dag"]


def _pair_from_index(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Invert ``t = j (j - 1) / 2 + i`` (pairs ``i < j`` listed by ``j``, then ``i``)."""
    j = np.floor((1.0 + np.sqrt(1.0 + 8.0 * t.astype(np.float64))) / 2.0).astype(np.int64)
    # Correct the float rounding by at most one either way.
    j -= (j * (j - 1) // 2 > t).astype(np.int64)
    j += ((j + 1) * j // 2 <= t).astype(np.int64)
    return t - j * (j - 1) // 2, j


def _distinct_sample(rng: np.random.Generator, total: int, m: int) -> np.ndarray:
    """``m`` distinct integers uniform on ``[0, total)``, sorted.

    Dense case (``4 m >= total``, so ``total`` is small next to the output): a uniform choice
    without replacement. Sparse case: draw with replacement until ``m`` distinct values are
    seen, then keep a uniform ``m`` of them (the set of distinct draws is exchangeable, so the
    result is uniform). Expected O(m log m).
    """
    if m == 0:
        return np.empty(0, dtype=np.int64)
    if 4 * m >= total:
        return np.sort(rng.choice(total, size=m, replace=False)).astype(np.int64)
    got = np.empty(0, dtype=np.int64)
    while got.size < m:
        more = rng.integers(0, total, size=(m - got.size) + (m - got.size) // 8 + 8)
        got = np.unique(np.concatenate((got, more)))
    if got.size > m:
        got = np.sort(got[rng.choice(got.size, size=m, replace=False)])
    return got


def random_dag(
    num_nodes: int = 100,
    *,
    edge_probability: float | None = None,
    avg_degree: float | None = None,
    weight_low: int = 1,
    weight_high: int = 10,
    params_per_weight: float = 1e6,
    batch_size: int = 32,
    seed: int | np.random.Generator | None = 0,
    name: str | None = None,
) -> Graph:
    """A DAG with each edge ``i -> j`` (``i < j``) present independently with probability p.

    The ids stay in topological order (no relabelling). Give ``edge_probability`` or
    ``avg_degree`` (the mean number of edges touching a node, ``2 m / n``; then
    ``p = avg_degree / (n - 1)``); neither means ``avg_degree = 4``.

    Parameters
    ----------
    num_nodes : int, default 100
        Nodes (>= 1).
    edge_probability : float, optional
        p, in ``[0, 1]``.
    avg_degree : float, optional
        Expected in + out degree of a node, in ``[0, n - 1]``.
    weight_low, weight_high, params_per_weight, batch_size, seed, name
        As in :func:`shardplan.generate.layered`.

    Returns
    -------
    Graph

    Raises
    ------
    ShardplanError
        An option out of range, or both ``edge_probability`` and ``avg_degree``.

    Notes
    -----
    The edge count is drawn from Binomial(n (n - 1) / 2, p), then that many distinct pairs
    uniformly, which is the same distribution as one coin per pair but costs
    O(m log m + n) instead of O(n^2). Graphs may be disconnected.

    Examples
    --------
    >>> g = random_dag(50, edge_probability=0.1, seed=3)
    >>> bool((g.src < g.dst).all())
    True
    """
    n = check_int("num_nodes", num_nodes, low=1)
    if edge_probability is not None and avg_degree is not None:
        raise ShardplanError("give edge_probability or avg_degree, not both")
    if edge_probability is not None:
        p = check_probability("edge_probability", edge_probability)
    else:
        deg = check_real("avg_degree", 4.0 if avg_degree is None else avg_degree, low=0.0)
        if avg_degree is not None and deg > n - 1:
            raise ShardplanError(f"avg_degree must be at most num_nodes - 1 = {n - 1}, got "
                                 f"{avg_degree!r}")
        p = min(deg / (n - 1), 1.0) if n > 1 else 0.0
    check_size("random-dag", n, p * (n * (n - 1) / 2))
    lo, hi = check_weight_range(weight_low, weight_high)
    ppw = check_real("params_per_weight", params_per_weight, low=0.0)
    batch = check_int("batch_size", batch_size, low=1)
    rng = rng_for(seed)
    weight = draw_weights(rng, n, lo, hi)
    total = n * (n - 1) // 2
    m = int(rng.binomial(total, p)) if total else 0
    src, dst = _pair_from_index(_distinct_sample(rng, total, m))
    order = np.lexsort((src, dst))
    return graph_from_weights(
        name=name or f"random-dag-{n}", weight=weight, src=src[order], dst=dst[order],
        params_per_weight=ppw, batch_size=batch,
        meta={"generator": {"kind": "random-dag", "num_nodes": n, "edge_probability": p,
                            "weight_low": lo, "weight_high": hi, "params_per_weight": ppw,
                            "batch_size": batch, "seed": seed_value(seed)}},
    )

