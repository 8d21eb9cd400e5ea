"""Layered random DAGs, the synthetic graphs of paper 000's experiments (sections 2.4-2.5)."""

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

__all__ = ["layered"]


def _distinct_columns(rng: np.random.Generator, counts: np.ndarray, pool: np.ndarray,
                      max_k: int) -> np.ndarray:
    """Per row ``r``, ``counts[r]`` distinct integers uniform on ``[0, pool[r])``.

    Returns an ``(rows, max_k)`` array whose columns past ``counts[r]`` are ``-1``. Column by
    column, redrawing the rows whose draw repeats an earlier column (``counts <= pool``, so it
    ends; the expected number of redraws is below ``max_k / 2`` per row). O(rows * max_k^2).
    """
    rows = counts.shape[0]
    out = np.full((rows, max_k), -1, dtype=np.int64)
    for j in range(max_k):
        active = np.flatnonzero(counts > j)
        while active.size:
            draw = (rng.random(active.size) * pool[active]).astype(np.int64)
            out[active, j] = draw
            if j == 0:
                break
            clash = (out[active, :j] == draw[:, None]).any(axis=1)
            active = active[clash]
    return out


def layered(
    num_nodes: int = 1001,
    *,
    width: int = 100,
    first_width: int = 1,
    max_fanin: int = 3,
    skip_probability: float = 0.0,
    dangling: bool = False,
    weight_low: int = 1,
    weight_high: int = 10,
    params_per_weight: float = 1e6,
    batch_size: int = 32,
    seed: int | np.random.Generator | None = 0,
    name: str | None = None,
) -> Graph:
    """A random layered DAG like those of paper 000's experiments.

    Node ids are assigned layer by layer, so they are a topological order. Layer 0 holds
    ``first_width`` nodes, every later layer ``width`` nodes (the last one whatever is left).
    Each node past layer 0 draws ``k`` uniform on ``1..min(max_fanin, size of the previous
    layer)`` and takes ``k`` distinct predecessors uniformly from the previous layer; with
    probability ``skip_probability`` a node of layer 2 or later also gets one skip edge from a
    uniform node of any layer before the previous one (a residual connection). Unless
    ``dangling``, every node outside the last layer whose output no one reads gets one edge to
    a uniform node of the next layer, so that, as in a network, only the last layer has sinks.

    Weights are integers uniform on ``[weight_low, weight_high]``; the other attributes follow
    from them (see :func:`shardplan.generate._attrs.graph_from_weights`: a dense layer of
    ``weight * params_per_weight`` fp32 parameters at ``batch_size``).

    Parameters
    ----------
    num_nodes : int, default 1001
        Total nodes (>= 1).
    width, first_width : int
        Nodes per layer, and in layer 0 (>= 1).
    max_fanin : int
        Most predecessors drawn from the previous layer (>= 1).
    skip_probability : float
        Probability of one extra skip edge per node of layer >= 2 (in ``[0, 1]``).
    dangling : bool
        Keep nodes without successors outside the last layer.
    weight_low, weight_high : int
        Inclusive range of the integer weights (``0 <= low <= high``).
    params_per_weight : float
        Parameters per unit of weight (>= 0).
    batch_size : int
        Batch size the FLOPs and activation bytes are computed for (>= 1).
    seed : int, Generator or None
        Same seed, same graph (see :func:`shardplan._rng.make_rng`).
    name : str, optional
        Graph name (default ``"layered-N"``).

    Returns
    -------
    Graph

    Raises
    ------
    ShardplanError
        An option out of range.

    Notes
    -----
    Paper 000 runs its brute-force and heuristic partitioners on "a simple computation graph
    consisting of 1001 nodes" (section 2.4) and the hierarchical one on 201 nodes (section
    2.5) without describing the graphs further. We read 1001 = 1 + 10 x 100 and 201 =
    1 + 2 x 100: one input node followed by layers of 100, the defaults here
    (``layered(201)`` gives the second). Integer weights 1..10 are our choice.

    Complexity: O(n * max_fanin^2) time and O(n * max_fanin) memory, all vectorised (no
    per-node Python loop).

    Examples
    --------
    >>> g = layered(1001, seed=0)
    >>> g.num_nodes, int(g.levels.max()) + 1
    (1001, 11)
    >>> bool((g.src < g.dst).all())
    True
    """
    n = check_int("num_nodes", num_nodes, low=1)
    check_size("layered", n)
    width = check_int("width", width, low=1)
    first_width = check_int("first_width", first_width, low=1)
    max_fanin = check_int("max_fanin", max_fanin, low=1)
    skip_p = check_probability("skip_probability", skip_probability)
    if not isinstance(dangling, (bool, np.bool_)):
        raise ShardplanError(f"dangling must be true or false, got {dangling!r}")
    lo, hi = check_weight_range(weight_low, weight_high)
    ppw = check_real("params_per_weight", params_per_weight, low=0.0)
    batch = check_int("batch_size", batch_size, low=1)
    rng = rng_for(seed)

    # Layer of every node and start/size of every layer.
    first = min(first_width, n)
    ids = np.arange(n, dtype=np.int64)
    layer = np.where(ids < first, 0, 1 + (ids - first) // width)
    num_layers = int(layer[-1]) + 1
    starts = np.concatenate(([0], first + width * np.arange(num_layers - 1, dtype=np.int64)))
    sizes = np.diff(np.concatenate((starts, [n])))

    weight = draw_weights(rng, n, lo, hi)

    # Predecessors from the previous layer.
    rows = ids[first:]
    prev = layer[rows] - 1
    pool = sizes[prev]
    k = rng.integers(1, np.minimum(pool, max_fanin), endpoint=True) if rows.size else pool
    cols = _distinct_columns(rng, k, pool, max_fanin)
    r_idx, c_idx = np.nonzero(cols >= 0)
    src = [starts[prev[r_idx]] + cols[r_idx, c_idx]]
    dst = [rows[r_idx]]

    # Skip edges from any layer before the previous one.
    if skip_p > 0.0:
        deep = rows[layer[rows] >= 2]
        hit = deep[rng.random(deep.size) < skip_p]
        lim = starts[layer[hit] - 1]
        src.append((rng.random(hit.size) * lim).astype(np.int64))
        dst.append(hit)

    src_a, dst_a = np.concatenate(src), np.concatenate(dst)
    if not dangling and num_layers > 1:
        out_deg = np.bincount(src_a, minlength=n)
        orphan = np.flatnonzero((out_deg == 0) & (layer < num_layers - 1))
        nxt = layer[orphan] + 1
        tgt = starts[nxt] + (rng.random(orphan.size) * sizes[nxt]).astype(np.int64)
        src_a, dst_a = np.concatenate((src_a, orphan)), np.concatenate((dst_a, tgt))

    order = np.lexsort((src_a, dst_a))
    return graph_from_weights(
        name=name or f"layered-{n}", weight=weight, src=src_a[order], dst=dst_a[order],
        params_per_weight=ppw, batch_size=batch,
        modules=tuple(f"layer{v}" for v in layer.tolist()),
        meta={"generator": {"kind": "layered", "num_nodes": n, "width": width,
                            "first_width": first_width, "max_fanin": max_fanin,
                            "skip_probability": skip_p, "dangling": bool(dangling),
                            "weight_low": lo, "weight_high": hi,
                            "params_per_weight": ppw, "batch_size": batch,
                            "seed": seed_value(seed)}},
    )
