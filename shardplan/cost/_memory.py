"""Memory of a stage: parameters, gradients, optimizer state, activations in flight.

Parmesan requires every stage to fit in its device's memory (section 4, constraint (c), and the
``+inf`` stage time of section 4.1) but formulates that memory in its appendix F, which our copy
of the paper lacks. The model below is ours; each term says where it comes from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from shardplan.cost._checks import check_assignment, check_nodes
from shardplan.cost._formulas import OPTIMIZER_STATE, stage_memory
from shardplan.cost._transfer import cut_tensors
from shardplan.errors import ShardplanError
from shardplan.ir import Graph

__all__ = ["OPTIMIZER_STATE", "SCHEDULES", "in_flight_microbatches", "optimizer_state_factor",
           "partition_memory_breakdown", "partition_memory_bytes", "stage_memory_bytes"]

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")


def optimizer_state_factor(optimizer: str) -> float:
    """Optimizer state as a multiple of the parameters (sgd 0, sgd-momentum 1, adam 2)."""
    try:
        return OPTIMIZER_STATE[optimizer]
    except (KeyError, TypeError):
        raise ShardplanError(f"unknown optimizer {optimizer!r} (choose from "
                             f"{', '.join(OPTIMIZER_STATE)})") from None


def in_flight_microbatches(num_stages: int, num_microbatches: int,
                           schedule: str = "1f1b", *, virtual_stages: int = 2) -> np.ndarray:
    """Micro-batches whose activations stage s holds at its peak, for every stage.

    GPipe runs all M forwards before any backward, so every stage holds ``M`` (Huang et al.
    2019, section 2.3). 1F1B (PipeDream-Flush, Narayanan et al. 2021; DAPPLE) starts the
    backward of a micro-batch as soon as it can, so stage s (0-based, of S) holds
    ``min(S - s, M)``. Interleaved 1F1B: the peak along the schedule's action lists
    (:meth:`shardplan.ir.schedule.Schedule.in_flight`), ``virtual_stages`` stages per rank.

    Examples
    --------
    >>> in_flight_microbatches(4, 8, "1f1b").tolist()
    [4, 3, 2, 1]
    >>> in_flight_microbatches(4, 2, "1f1b").tolist()
    [2, 2, 2, 1]
    >>> in_flight_microbatches(3, 5, "gpipe").tolist()
    [5, 5, 5]
    """
    for name, v in (("num_stages", num_stages), ("num_microbatches", num_microbatches)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ShardplanError(f"{name} must be a positive integer, got {v!r}")
    if schedule not in SCHEDULES:
        raise ShardplanError(f"unknown schedule {schedule!r} (choose from "
                             f"{', '.join(SCHEDULES)})")
    if schedule == "gpipe":
        return np.full(num_stages, num_microbatches, dtype=np.int64)
    if schedule == "interleaved-1f1b":
        from shardplan.ir.schedule import make_schedule

        sch = make_schedule(schedule, num_stages, num_microbatches,
                            virtual_stages=virtual_stages)
        return np.asarray(sch.in_flight(), dtype=np.int64)
    return np.minimum(num_stages - np.arange(num_stages), num_microbatches).astype(np.int64)


def _check_scale(name: str, value: Any, k: int, *, low: float) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim == 0:
        arr = np.full(k, float(arr))
    if arr.shape != (k,) or not np.all(np.isfinite(arr)) or np.any(arr < low):
        raise ShardplanError(f"{name} must be a number >= {low:g} or one per stage ({k})")
    return arr


def partition_memory_breakdown(
    graph: Graph, assignment: Sequence[int] | np.ndarray, num_stages: int | None = None, *,
    optimizer: str = "adam", in_flight: Any = 1, recompute: bool = False,
    mixed_precision: bool = False, param_dtype_bytes: int = 2, replicas: Any = 1,
    sharded: bool = False, unit_bytes: float = 0.0, optimizer_sharded: bool = False,
) -> dict[str, np.ndarray]:
    """Every term of every stage's memory, in bytes per device of the stage.

    With ``P`` the stage's ``param_bytes``:

    - ``params = P``, ``gradients = P`` (one gradient per parameter, same dtype);
    - ``optimizer = f P`` with ``f`` from :data:`OPTIMIZER_STATE`; under
      ``mixed_precision`` the parameters are stored in ``param_dtype_bytes`` bytes and the
      optimizer keeps fp32 master weights, ``master = 4 P / param_dtype_bytes``, and fp32
      state, ``optimizer = 4 f P / param_dtype_bytes`` (Micikevicius et al. 2018; for Adam
      with fp16 this is the 16 bytes per parameter of ZeRO, Rajbhandari et al. 2020,
      section 3.1);
    - ``activations``: the graph is captured at the micro-batch size, so one micro-batch's
      activations are the stage's ``output_bytes`` plus the tensors it receives from other
      stages (each counted once, see :func:`~shardplan.cost.cut_tensors`). Without
      recomputation a stage keeps them for every micro-batch in flight:
      ``in_flight * (outputs + received)``. With ``recompute`` (GPipe section 2.3) it keeps
      only its inputs (``received`` plus the outputs of graph inputs, nodes without
      predecessors, in the stage) per micro-batch in flight, and re-creates one micro-batch's
      other outputs during its backward: ``in_flight * inputs + (outputs - graph inputs)``.
      With ``replicas`` each replica runs ``1/r`` of the micro-batch, so activations are
      divided by r (parameters and optimizer state are replicated in full);
    - ``extra``: the nodes' ``memory_bytes`` (other working memory), once;
    - ``step_temporary``: what the optimizer step allocates for a moment (Adam on CPU: two
      copies of the stage's largest parameter tensor, here its node with the most parameter
      bytes), after the backward freed the activations.

    ``total`` is their sum, with the larger of ``activations`` and ``step_temporary`` in
    place of both (the compute phase or the optimizer step is the peak).

    Parameters
    ----------
    graph : Graph
    assignment : array of int, shape (n,)
    num_stages : int, optional
    optimizer : {"sgd", "sgd-momentum", "momentum", "adam", "adamw"}
    in_flight : int or array of shape (k,)
        Micro-batches in flight per stage (see :func:`in_flight_microbatches`).
    recompute : bool
    mixed_precision : bool
    param_dtype_bytes : int
        Bytes per stored parameter under mixed precision (2 for fp16/bf16).
    replicas : int or array of shape (k,)
        Data-parallel replicas per stage.
    sharded : bool
        FSDP: parameters, gradients and optimizer state split over the replicas, with two
        units of ``unit_bytes`` of parameters (the running and the prefetched one, at most
        the stage's parameters) held whole.
    unit_bytes : float
    optimizer_sharded : bool
        The distributed optimizer (ZeRO-1): master weights, optimizer state and the step's
        temporaries split over the replicas; parameters and gradients whole.

    Returns
    -------
    dict of str to ndarray of float64, shape (k,)
        Keys ``params, gradients, master, optimizer, activations, step_temporary, extra,
        gathered, total``.

    Notes
    -----
    Parmesan (section 4.1) rejects a stage on r replicas whose memory exceeds ``r`` times
    the device memory, as if everything were split across replicas; we divide only the
    activations, since data-parallel replicas each hold all parameters. O(m log m + n + k).
    """
    a, k = check_assignment(graph, assignment, num_stages)
    optimizer_state_factor(optimizer)  # validates the name
    bad_width = isinstance(param_dtype_bytes, bool) or not isinstance(
        param_dtype_bytes, (int, np.integer)) or param_dtype_bytes < 1
    if mixed_precision and bad_width:
        raise ShardplanError(f"param_dtype_bytes must be a positive integer, got "
                             f"{param_dtype_bytes!r}")
    flight = _check_scale("in_flight", in_flight, k, low=0.0)
    reps = _check_scale("replicas", replicas, k, low=1.0)

    params = np.bincount(a, weights=graph.param_bytes.astype(np.float64), minlength=k)
    outputs = np.bincount(a, weights=graph.output_bytes.astype(np.float64), minlength=k)
    _, to_stage, nbytes, _ = cut_tensors(graph, a, k, dedupe=True)
    received = np.bincount(to_stage, weights=nbytes, minlength=k)
    is_input = graph.in_degree == 0
    inputs = np.bincount(a[is_input], weights=graph.output_bytes[is_input].astype(
        np.float64), minlength=k)
    largest = np.zeros(k)
    np.maximum.at(largest, a, graph.param_bytes.astype(np.float64))
    extra = np.zeros(k) if graph.memory_bytes is None else np.bincount(
        a, weights=np.nan_to_num(graph.memory_bytes, nan=0.0), minlength=k)
    return stage_memory(params=params, outputs=outputs, received=received, inputs=inputs,
                        extra=extra, in_flight=flight, replicas=reps, optimizer=optimizer,
                        recompute=recompute, mixed_precision=mixed_precision,
                        param_dtype_bytes=param_dtype_bytes,
                        shards=reps if sharded else 1,
                        gathered=np.minimum(2.0 * unit_bytes, params) if sharded else 0.0,
                        largest_param=largest,
                        state_shards=reps if optimizer_sharded and not sharded else 1)


def partition_memory_bytes(
    graph: Graph, assignment: Sequence[int] | np.ndarray, num_stages: int | None = None, *,
    optimizer: str = "adam", in_flight: Any = 1, recompute: bool = False,
    mixed_precision: bool = False, param_dtype_bytes: int = 2, replicas: Any = 1,
) -> np.ndarray:
    """Memory of every stage of a partition, bytes per device, shape (k,).

    The ``total`` of :func:`partition_memory_breakdown` (see there for every term).

    Examples
    --------
    >>> from shardplan.ir import Graph
    >>> g = Graph.from_arrays(name="g", fwd_flops=[0, 0], src=[0], dst=[1],
    ...                       param_bytes=[100, 10], output_bytes=[8, 4])
    >>> partition_memory_bytes(g, [0, 1], optimizer="sgd", in_flight=[2, 1]).tolist()
    [216.0, 32.0]
    """
    return partition_memory_breakdown(
        graph, assignment, num_stages, optimizer=optimizer, in_flight=in_flight,
        recompute=recompute, mixed_precision=mixed_precision,
        param_dtype_bytes=param_dtype_bytes, replicas=replicas)["total"]


def stage_memory_bytes(
    graph: Graph, nodes: Sequence[int] | np.ndarray, *, optimizer: str = "adam",
    in_flight: float = 1, recompute: bool = False, mixed_precision: bool = False,
    param_dtype_bytes: int = 2, replicas: int = 1,
) -> float:
    """Memory of one node set run as a stage, in bytes per device.

    The stage's total of :func:`partition_memory_breakdown`, the rest of the graph being
    elsewhere (the tensors it reads from outside the set are received). O(m log m + n).

    Examples
    --------
    >>> from shardplan.ir import Graph
    >>> g = Graph.from_arrays(name="g", fwd_flops=[0, 0], src=[0], dst=[1],
    ...                       param_bytes=[100, 10], output_bytes=[8, 4])
    >>> stage_memory_bytes(g, [1], optimizer="adam", in_flight=3)
    76.0
    """
    mask = check_nodes(graph, nodes)
    return float(partition_memory_bytes(
        graph, np.where(mask, 0, 1), 2, optimizer=optimizer, in_flight=in_flight,
        recompute=recompute, mixed_precision=mixed_precision,
        param_dtype_bytes=param_dtype_bytes, replicas=replicas)[0])
