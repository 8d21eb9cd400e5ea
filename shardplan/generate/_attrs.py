"""Shared pieces of the generators: option checks and the node attributes derived from weights."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from shardplan._rng import make_rng
from shardplan.errors import ShardplanError
from shardplan.ir import Graph

__all__ = ["MAX_EDGES", "MAX_NODES", "check_int", "check_probability", "check_real",
           "check_size", "check_weight_range", "draw_weights", "graph_from_weights", "rng_for",
           "seed_value"]

MAX_NODES = 10_000_000
"""Most nodes a generator makes (a graph file of that size is a few GB of JSON)."""
MAX_EDGES = 50_000_000
"""Most edges (expected, for random-dag) a generator makes."""

_BYTES_PER_PARAM = 4  # fp32 parameters and activations


def check_int(name: str, value: Any, *, low: int, high: int | None = None) -> int:
    """``value`` as an int in ``[low, high]``, or a one-line :class:`ShardplanError`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ShardplanError(f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        where = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ShardplanError(f"{name} must be {where}, got {value}")
    return int(value)


def check_size(kind: str, num_nodes: int, num_edges: float = 0.0) -> None:
    """Refuse up front a graph larger than :data:`MAX_NODES` nodes or :data:`MAX_EDGES`
    edges, saying what it would take (about 200 bytes of JSON per node and 60 per edge)."""
    if num_nodes > MAX_NODES or num_edges > MAX_EDGES:
        gib = (200.0 * num_nodes + 60.0 * num_edges) / 2**30
        edges = f" and ~{num_edges:.3g} edges" if num_edges else ""
        raise ShardplanError(f"a {kind} graph of {num_nodes} nodes{edges} would take "
                             f"~{gib:.3g} GiB as a file; at most {MAX_NODES} nodes and "
                             f"{MAX_EDGES} edges are generated")


def check_real(name: str, value: Any, *, low: float, high: float | None = None) -> float:
    """``value`` as a finite float in ``[low, high]``, or a one-line :class:`ShardplanError`."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ShardplanError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < low or (high is not None and v > high):
        where = f">= {low:g}" if high is None else f"in [{low:g}, {high:g}]"
        raise ShardplanError(f"{name} must be {where}, got {value!r}")
    return v


def check_probability(name: str, value: Any) -> float:
    return check_real(name, value, low=0.0, high=1.0)


def rng_for(seed: Any) -> np.random.Generator:
    """:func:`shardplan._rng.make_rng` with its complaint as a :class:`ShardplanError`."""
    try:
        return make_rng(seed)
    except ValueError as exc:
        raise ShardplanError(str(exc)) from None


def seed_value(seed: Any) -> int | None:
    """The integer a seed stands for, to record in the graph (``None`` for a Generator)."""
    if seed is None:
        return 0
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return int(seed)
    return None


def draw_weights(rng: np.random.Generator, n: int, low: int, high: int) -> np.ndarray:
    """``n`` integer weights uniform on ``[low, high]`` (as float64)."""
    return rng.integers(low, high, size=n, endpoint=True).astype(np.float64)


def check_weight_range(weight_low: Any, weight_high: Any) -> tuple[int, int]:
    lo = check_int("weight_low", weight_low, low=0)
    hi = check_int("weight_high", weight_high, low=0)
    if hi < lo:
        raise ShardplanError(f"weight_high ({hi}) must be >= weight_low ({lo})")
    return lo, hi


def graph_from_weights(
    *, name: str, weight: np.ndarray, src: np.ndarray, dst: np.ndarray,
    params_per_weight: float, batch_size: int, ops: tuple[str, ...] | None = None,
    modules: tuple[str, ...] | None = None, meta: dict[str, Any] | None = None,
) -> Graph:
    """A :class:`Graph` whose every attribute follows from the node weights.

    Each node is modelled as a dense layer (a square ``h x h`` weight matrix):

    - parameters ``P = weight * params_per_weight``, ``param_bytes = 4 P`` (fp32);
    - ``fwd_flops = 2 * batch_size * P`` (one multiply-add per parameter per sample),
      ``bwd_flops = 2 * fwd_flops`` (gradients of the input and of the weights);
    - ``output_bytes = 4 * batch_size * h`` with ``h = round(sqrt(P))`` (the layer's width);
    - every edge carries its source's output (``edge_bytes = output_bytes[src]``).

    ``weight`` is kept as given: it is the node weight of paper 000's sharding-cost objective,
    the parameter count in units of ``params_per_weight``. O(n + m).
    """
    n = weight.shape[0]
    params = weight * float(params_per_weight)
    param_bytes = np.rint(params * _BYTES_PER_PARAM).astype(np.int64)
    fwd = 2.0 * batch_size * params
    width = np.rint(np.sqrt(params))
    output_bytes = (_BYTES_PER_PARAM * batch_size * width).astype(np.int64)
    src = np.asarray(src, dtype=np.int64)
    return Graph.from_arrays(
        name=name, batch_size=batch_size, fwd_flops=fwd, bwd_flops=2.0 * fwd, src=src,
        dst=np.asarray(dst, dtype=np.int64), edge_bytes=output_bytes[src],
        param_bytes=param_bytes, output_bytes=output_bytes, weight=weight,
        names=[f"n{i}" for i in range(n)], ops=ops if ops is not None else ("linear",) * n,
        modules=modules, meta=meta or {},
    )
