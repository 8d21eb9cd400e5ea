"""Compute time of nodes and stages: Parmesan's c_u (section 4, equations 1 and 3)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from shardplan.cost._checks import check_assignment, check_nodes, check_positive, check_rate_array
from shardplan.cost._formulas import work_seconds
from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Topology

__all__ = ["MATMUL_OPS", "is_matmul", "loss_charge", "matmul_peak_flops", "node_seconds",
           "partition_compute_seconds", "roofline_seconds", "split_work",
           "stage_compute_seconds"]

#: Operators whose FLOPs are matrix products (tensor-core work): convolutions, linear layers,
#: matrix multiplies, einsums, attention. Matched on a node's ``op`` (aten or module name).
MATMUL_OPS = re.compile(r"(^|[._])(conv|convolution|linear|mm|bmm|addmm|baddbmm|matmul|"
                        r"einsum|scaled_dot_product|flash_attention|efficient_attention|"
                        r"lstm|gru|rnn|embedding)")


def is_matmul(op: str) -> bool:
    """Whether an operator's FLOPs are matrix products (see :data:`MATMUL_OPS`)."""
    return MATMUL_OPS.search(op.lower()) is not None


def matmul_peak_flops(topology: Topology, precision: str) -> np.ndarray:
    """Every device's peak rate for matrix products at a training precision, FLOP/s (D,).

    ``fp32``: :attr:`Topology.device_fp32_flops` (CUDA cores; a device that declares no
    fp32 rate, its ``flops``). ``bf16`` / ``fp16``: :attr:`Topology.device_flops` (the
    dense tensor-core rate every device preset gives as ``flops``). ``fp8``:
    :attr:`Topology.device_fp8_flops` (the optional per-device field ``fp8_flops``; H100
    SXM: 1,979 TFLOP/s dense).

    Raises
    ------
    ShardplanError
        ``fp8`` on a topology with a device that declares no fp8 rate (A100 and V100 have
        no fp8 tensor cores): one line naming the device. We refuse rather than fall back
        to bf16, so that a plan never claims fp8 speed it cannot have.

    Examples
    --------
    >>> from shardplan.topology import flat
    >>> float(matmul_peak_flops(flat(2, device="h100"), "fp8")[0]) / 1e12  # TFLOP/s
    1979.0
    """
    if precision == "fp32":
        return topology.device_fp32_flops
    if precision in ("bf16", "fp16"):
        return topology.device_flops
    if precision != "fp8":
        raise ShardplanError(f"unknown precision {precision!r} (choose from fp32, bf16, "
                             f"fp16, fp8)")
    fp8 = topology.device_fp8_flops
    if fp8.size and not np.all(fp8 > 0):
        d = topology.devices[int(np.argmin(fp8 > 0))]
        kind = d.extra.get("type")
        raise ShardplanError(f"precision fp8 needs devices with fp8 tensor cores (H100); "
                             f"device {d.name!r}{f' ({kind})' if kind else ''} declares no "
                             f"fp8_flops: use bf16")
    return fp8


def roofline_seconds(graph: Graph, flops: float, fp32_flops: float, bandwidth: float, *,
                     mixed_precision: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of every node on one device by a roofline.

    ``t = max(FLOPs / peak, bytes / bandwidth)``: an operator runs at its compute roof or
    at the rate device memory feeds it, whichever is lower (Williams et al., "Roofline",
    CACM 2009); ``FLOPs / bytes`` is its arithmetic intensity. The roof depends on the
    operator's class: matrix products (:func:`is_matmul`) reach the tensor-core peak
    ``flops`` under mixed precision and ``fp32_flops`` otherwise; every other operator
    (elementwise, normalisation, pooling, reshapes) computes on the fp32 units. Bytes
    moved: forward, the node's inputs (its in-edges' bytes), output and parameters;
    backward, the output gradient read, the inputs and parameters read again, and input
    and parameter gradients written (``output + 2 inputs + 2 params``). Measured seconds
    are not used here (:func:`split_work` keeps them apart).

    Notes
    -----
    Ours (the papers take compute times as given): the vendors' peaks and bandwidths are
    upper bounds, so the model is optimistic for small operators, whose launch overheads it
    leaves out; ``capture --profile`` replaces it by measurements, and an execution
    setting's ``efficiency`` by the plain ``FLOPs / (peak x efficiency)``. O(n + m).

    Examples
    --------
    >>> g = Graph.from_arrays(name="g", fwd_flops=[8e9, 1e6], src=[0], dst=[1],
    ...                       output_bytes=[4e6, 4e6], ops=["linear", "relu"])
    >>> f, b = roofline_seconds(g, 1e12, 1e11, 1e10)
    >>> f.round(6).tolist()  # 8e9 / 1e11 compute-bound; (4e6 + 4e6) / 1e10 memory-bound
    [0.08, 0.0008]
    """
    mm = np.fromiter((is_matmul(o) for o in graph.ops), dtype=bool, count=graph.num_nodes)
    peak = np.where(mm & bool(mixed_precision), float(flops), float(fp32_flops))
    n = graph.num_nodes
    inputs = np.bincount(graph.dst, weights=graph.edge_bytes.astype(np.float64), minlength=n)
    out = graph.output_bytes.astype(np.float64)
    params = graph.param_bytes.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        fwd = np.maximum(graph.fwd_flops / peak, (inputs + out + params) / bandwidth)
        bwd = np.maximum(graph.bwd_flops / peak, (out + 2 * inputs + 2 * params) / bandwidth)
    return np.nan_to_num(fwd), np.nan_to_num(bwd)


def loss_charge(graph: Graph) -> tuple[int, float, float] | None:
    """``(node, forward seconds, backward seconds)`` of the training loss the graph records
    (``meta["loss"]``, measured by ``capture --profile``: :mod:`shardplan.capture._loss`),
    at the graph's batch size, on the node producing the model's output; None when the
    graph records no loss or does not hold that node (a subgraph without the output).

    The node is the one named ``meta["loss"]["output"]``, or, in a module-level graph, the
    one whose operators (``ops`` of its ``extra``) include it. The seconds are scaled from
    the loss's ``batch_size`` to the graph's linearly, as :meth:`Graph.at_batch_size` scales
    measured seconds. O(n) (O(operators) for a module-level graph).

    Examples
    --------
    >>> g = Graph.from_arrays(name="g", batch_size=4, fwd_flops=[1.0, 1.0], src=[0], dst=[1],
    ...                       names=["fc", "head"])
    >>> g = g.replace(meta={"loss": {"output": "head", "batch_size": 2,
    ...                              "fwd_seconds": 1e-3, "bwd_seconds": 2e-3}})
    >>> loss_charge(g)
    (1, 0.002, 0.004)
    """
    info = (graph.meta or {}).get("loss")
    if not isinstance(info, Mapping):
        return None
    try:
        name = str(info["output"])
        f, b = float(info["fwd_seconds"]), float(info["bwd_seconds"])
        scale = graph.batch_size / float(info.get("batch_size") or graph.batch_size)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    if not (np.isfinite(f) and np.isfinite(b) and np.isfinite(scale)) or min(f, b) < 0:
        return None
    node = next((v for v, nm in enumerate(graph.names) if nm == name), None)
    if node is None and graph.node_extra is not None:
        node = next((v for v, extra in enumerate(graph.node_extra)
                     if any(isinstance(op, (list, tuple)) and len(op) > 1 and op[1] == name
                            for op in extra.get("ops", ()) or ())), None)
    if node is None:
        return None
    return node, f * scale, b * scale


def split_work(graph: Graph) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each node's forward and backward work, split into measured seconds and FLOPs.

    Returns ``(fwd_measured, fwd_flops, bwd_measured, bwd_flops)``, arrays of shape (n,). A
    node with a measured ``fwd_seconds`` (not NaN) has that in ``fwd_measured`` and 0 in
    ``fwd_flops``; one without has 0 and its ``fwd_flops``. Likewise backward. The training
    loss a profiled graph records (:func:`loss_charge`) is added to the measured seconds of
    the node producing the model's output: the stage holding that node computes it every
    micro-batch. The time of the work on a device of peak ``F`` at ``efficiency`` and
    measured-time ``speed`` is then ``measured / speed + flops / (F * efficiency)``, linear
    in each part, so sums over stages can be taken before the device is known. O(n).
    """

    def part(seconds: np.ndarray | None, flops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if seconds is None:
            return np.zeros_like(flops), flops
        has = ~np.isnan(seconds)
        return np.where(has, seconds, 0.0), np.where(has, 0.0, flops)

    fm, ff = part(graph.fwd_seconds, graph.fwd_flops)
    bm, bf = part(graph.bwd_seconds, graph.bwd_flops)
    loss = loss_charge(graph)
    if loss is not None:
        v, lf, lb = loss
        fm, bm = fm.astype(np.float64, copy=True), bm.astype(np.float64, copy=True)
        fm[v] += lf
        bm[v] += lb
    return fm, ff, bm, bf


def node_seconds(graph: Graph, flops_per_second: float, efficiency: float = 1.0, *,
                 speed: float = 1.0, recompute: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of every node on one device.

    ``fwd[v] = fwd_seconds[v] / speed`` when the node was measured (``fwd_seconds`` present and
    not NaN), else ``fwd_flops[v] / (flops_per_second * efficiency)``; the same for backward.
    With ``recompute`` (activation checkpointing, as in Parmesan's experiments, section 7),
    the backward pass first re-runs the forward: ``bwd += fwd``.

    Parameters
    ----------
    graph : Graph
    flops_per_second : float
        The device's peak FLOP/s (``Device.flops``).
    efficiency : float, default 1.0
        Fraction of the peak that FLOP-derived times achieve, in (0, 1].
    speed : float, default 1.0
        How much faster the device is than the machine the measured seconds come from.
        Measured seconds are used as they are by default (``speed = 1``): a profile is taken
        on the machine the plan is for. Pass ``device_flops / profiling_flops`` to rescale.
    recompute : bool, default False

    Returns
    -------
    fwd, bwd : ndarray of float64, shape (n,)

    Notes
    -----
    Parmesan (section 4, equation 1) defines c_u(v) as the forward plus backward execution
    time of operator v without saying where it comes from; it profiles. We use the profile
    when the graph has one and the FLOP count at a fraction of peak otherwise. O(n).

    Examples
    --------
    >>> from shardplan.ir import Graph
    >>> g = Graph.from_arrays(name="g", fwd_flops=[2e12, 4e12], src=[0], dst=[1])
    >>> node_seconds(g, 1e12, 0.5)
    (array([4., 8.]), array([ 8., 16.]))
    """
    rate = check_positive("flops_per_second", flops_per_second) * check_positive(
        "efficiency", efficiency, at_most=1.0)
    speed = check_positive("speed", speed)
    fm, ff, bm, bf = split_work(graph)
    fwd = work_seconds(fm, ff, speed, rate)
    bwd = work_seconds(bm, bf, speed, rate)
    if recompute:
        bwd = bwd + fwd
    return fwd, bwd


def stage_compute_seconds(graph: Graph, nodes: Sequence[int] | np.ndarray,
                          flops_per_second: float, efficiency: float = 1.0, *,
                          speed: float = 1.0, recompute: bool = False) -> tuple[float, float]:
    """Forward and backward seconds of one node set (a stage) on one device.

    The sum of :func:`node_seconds` over the set: a stage runs its operators one after the
    other (Parmesan section 4.1, equation 3, numerator's c_u term). Duplicate ids count once.
    O(n).

    Examples
    --------
    >>> from shardplan.ir import Graph
    >>> g = Graph.from_arrays(name="g", fwd_flops=[1.0, 2.0, 3.0], src=[0, 1], dst=[1, 2])
    >>> stage_compute_seconds(g, [0, 2], 1.0)
    (4.0, 8.0)
    """
    mask = check_nodes(graph, nodes)
    fwd, bwd = node_seconds(graph, flops_per_second, efficiency, speed=speed,
                            recompute=recompute)
    return float(fwd[mask].sum()), float(bwd[mask].sum())


def partition_compute_seconds(
    graph: Graph, assignment: Sequence[int] | np.ndarray, flops_per_second: Any,
    efficiency: float = 1.0, *, num_stages: int | None = None, speed: Any = 1.0,
    recompute: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of every stage of a partition.

    Parameters
    ----------
    graph : Graph
    assignment : array of int, shape (n,)
        Stage id of every node, in ``[0, num_stages)``.
    flops_per_second : float or array of shape (k,)
        Peak FLOP/s of the device each stage runs on (one number: the same for all).
    efficiency : float
    num_stages : int, optional
        ``k`` (default ``max(assignment) + 1``); stages without nodes take 0 s.
    speed : float or array of shape (k,)
        Measured-time speed ratio per stage (see :func:`node_seconds`).
    recompute : bool

    Returns
    -------
    fwd, bwd : ndarray of float64, shape (k,)

    Notes
    -----
    Four ``np.bincount`` over the assignment (measured and FLOP parts of forward and
    backward), then one division per stage: O(n + k).

    Examples
    --------
    >>> from shardplan.ir import Graph
    >>> g = Graph.from_arrays(name="g", fwd_flops=[1.0, 2.0, 3.0], src=[0, 1], dst=[1, 2])
    >>> partition_compute_seconds(g, [0, 0, 1], [1.0, 3.0])
    (array([3., 1.]), array([6., 2.]))
    """
    a, k = check_assignment(graph, assignment, num_stages)
    rate = check_rate_array("flops_per_second", flops_per_second, k) * check_positive(
        "efficiency", efficiency, at_most=1.0)
    spd = check_rate_array("speed", speed, k)
    fm, ff, bm, bf = (np.bincount(a, weights=w, minlength=k) for w in split_work(graph))
    fwd = work_seconds(fm, ff, spd, rate)
    bwd = work_seconds(bm, bf, spd, rate)
    if recompute:
        bwd = bwd + fwd
    return fwd, bwd
