"""Boundary checks shared by the cost functions (one-line :class:`ShardplanError`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.ir import Graph

__all__ = ["check_assignment", "check_nodes", "check_positive", "check_rate_array"]


def check_positive(name: str, value: Any, *, at_most: float | None = None) -> float:
    """A finite float > 0 (and <= ``at_most``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ShardplanError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not (math.isfinite(v) and v > 0) or (at_most is not None and v > at_most):
        where = "> 0" if at_most is None else f"in (0, {at_most:g}]"
        raise ShardplanError(f"{name} must be {where}, got {value!r}")
    return v


def check_rate_array(name: str, value: Any, k: int) -> np.ndarray:
    """A scalar or a length-``k`` array of finite positive floats, as a float64 array."""
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim == 0:
        check_positive(name, float(arr))
        return np.full(k, float(arr))
    if arr.shape != (k,):
        raise ShardplanError(f"{name} must be a number or one number per stage ({k}), got "
                             f"shape {arr.shape}")
    if not np.all(np.isfinite(arr) & (arr > 0)):
        raise ShardplanError(f"{name} must hold finite positive numbers")
    return arr


def check_assignment(graph: Graph, assignment: Sequence[int] | np.ndarray,
                     num_stages: int | None) -> tuple[np.ndarray, int]:
    """The assignment as an int64 array of stage ids in ``[0, k)``, and ``k``.

    ``k`` is ``num_stages`` or, when omitted, ``max(assignment) + 1``. O(n).
    """
    a = np.asarray(assignment)
    if a.shape != (graph.num_nodes,):
        raise ShardplanError(f"an assignment needs one stage id per node ({graph.num_nodes}), "
                             f"got shape {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise ShardplanError("an assignment must hold integer stage ids")
    a = a.astype(np.int64, copy=False)
    top = int(a.max()) + 1 if a.size else 0
    k = top if num_stages is None else int(num_stages)
    if a.size and (int(a.min()) < 0 or top > k):
        raise ShardplanError(f"assignment stage ids must lie in [0, {k}), got "
                             f"[{int(a.min())}, {top - 1}]")
    return a, k


def check_nodes(graph: Graph, nodes: Sequence[int] | np.ndarray) -> np.ndarray:
    """A node set as a boolean mask over the graph's nodes (duplicates are harmless)."""
    idx = np.asarray(nodes, dtype=np.int64).reshape(-1)
    n = graph.num_nodes
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
        raise ShardplanError(f"node ids must lie in [0, {n}), got [{int(idx.min())}, "
                             f"{int(idx.max())}]")
    mask = np.zeros(n, dtype=bool)
    mask[idx] = True
    return mask
