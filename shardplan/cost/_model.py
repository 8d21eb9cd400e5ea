"""The cost model object: one graph, one topology, the options, precomputed arrays."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass
from functools import cached_property
from typing import Any

import numpy as np

from shardplan.cost._checks import check_assignment, check_nodes, check_positive
from shardplan.cost._compute import matmul_peak_flops, roofline_seconds, split_work
from shardplan.cost._formulas import work_seconds
from shardplan.cost._gpu import gpu_model
from shardplan.cost._memory import (
    optimizer_state_factor,
    partition_memory_breakdown,
)
from shardplan.cost._overheads import op_overhead
from shardplan.cost._transfer import (
    allreduce_seconds,
    inverse_bandwidth,
    stage_devices_array,
    stage_traffic,
    stage_transfer_seconds,
)
from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, Plan, Topology
from shardplan.ir.settings import PRECISIONS

__all__ = ["CostModel", "lower_bound_seconds", "plan_arrays"]


def _device_speed(topology: Topology, profile_flops: float | None) -> np.ndarray:
    if profile_flops is None:
        return np.ones(topology.num_devices)
    return topology.device_flops / profile_flops


def lower_bound_seconds(graph: Graph, topology: Topology, num_devices: int | None = None, *,
                        efficiency: float = 1.0, recompute: bool = False,
                        profile_flops: float | None = None, replicas: int = 1) -> float:
    """A lower bound on the largest stage time of any partition onto ``num_devices`` devices.

    ``max(W / D, w_max / R)`` where ``w_v`` is node v's forward + backward seconds on the
    topology's fastest device (:func:`~shardplan.cost.node_seconds` at its peak), ``W`` their
    sum, ``D = num_devices`` (default: all of the topology's) and ``R = replicas`` the most
    replicas a stage has. A stage's replicas split its micro-batches, so a replica computes
    ``1/R`` of its stage's work: some replica does at least a ``1/D`` share of all the work,
    and the one holding the largest node at least ``w_max / R``. Every stage-time view
    (:mod:`shardplan.cost._pipeline`) is at least the replica's compute, so this bounds them
    all; communication, at least 0, is left out.

    Notes
    -----
    Not from the papers: the two classic makespan bounds (average load, largest job), the
    same as :meth:`Graph.lower_bounds` but in seconds. Parmesan's own lower bounds (section
    5.2, equations 8-9) seed its mapping search and need a partition; this one does not, so
    a partitioner can report it (the plan's ``objective.lower_bound``) before it starts. With
    heterogeneous devices, pricing all work at the fastest device keeps the bound valid but
    loose. O(n + D).

    Examples
    --------
    >>> from shardplan.ir import Device, Graph, Topology
    >>> g = Graph.from_arrays(name="g", fwd_flops=[1e12, 1e12, 4e12], src=[0, 1], dst=[1, 2])
    >>> t = Topology(name="t", devices=(Device("a", 1e9, 1e12), Device("b", 1e9, 2e12)),
    ...              bandwidth=[[0, 1e9], [1e9, 0]], latency=[[0, 0], [0, 0]])
    >>> lower_bound_seconds(g, t)  # work 1.5, 1.5, 6 s at 2e12 FLOP/s
    6.0
    >>> lower_bound_seconds(g, t, 2, replicas=2)  # max(9 / 2, 6 / 2)
    4.5
    """
    if num_devices is None:
        num_devices = topology.num_devices
    if isinstance(num_devices, bool) or not isinstance(num_devices, (int, np.integer)) \
            or num_devices < 1:
        raise ShardplanError(f"num_devices must be a positive integer, got {num_devices!r}")
    model = CostModel(graph, topology, efficiency=efficiency, recompute=recompute,
                      profile_flops=profile_flops)
    return model.lower_bound_seconds(int(num_devices), replicas=replicas)


def _unmeasured(seconds: np.ndarray | None, n: int) -> np.ndarray:
    """Which nodes have no measured time (the column absent, or NaN)."""
    if seconds is None:
        return np.ones(n, dtype=bool)
    return np.isnan(seconds)


def plan_arrays(plan: Plan, graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """A plan as ``(assignment, stage_devices)``: stage id per node, shape (n,), and the
    devices of every stage, shape (k, r). Stages must have the same number of replicas."""
    plan.validate(graph)
    counts = {len(st.devices) for st in plan.stages}
    if len(counts) > 1:
        raise ShardplanError("the cost model needs the same number of replicas in every stage, "
                             f"got {sorted(counts)}")
    devices = np.array([list(st.devices) for st in plan.stages], dtype=np.int64)
    return plan.assignment(graph.num_nodes), devices.reshape(plan.num_stages, -1)


@dataclass(frozen=True, eq=False)
class CostModel:
    """Time and memory of stages of ``graph`` on the devices of ``topology``.

    The one cost model every planner and the simulator share. It precomputes per-node arrays
    once so that stage queries are a few ``np.bincount`` (whole partitions) or masked sums
    (one node set). The formulas are those of :func:`~shardplan.cost.node_seconds`,
    :func:`~shardplan.cost.stage_transfer_seconds` and
    :func:`~shardplan.cost.partition_memory_breakdown`.

    Parameters
    ----------
    graph : Graph
    topology : Topology, optional
        Needed for everything that names a device.
    optimizer : str, default "adam"
        ``sgd``, ``sgd-momentum`` (``momentum``), ``adam`` (``adamw``).
    mixed_precision : bool, default False
        fp32 master weights and optimizer state beside ``param_dtype_bytes`` parameters.
    param_dtype_bytes : int, default 2
    precision : {"", "fp32", "bf16", "fp16", "fp8"}, default ""
        The training precision (:attr:`ExecutionSettings.precision`): the rate of matrix
        products (:func:`~shardplan.cost.matmul_peak_flops`). ``""``: ``fp16`` under
        ``mixed_precision``, else ``fp32`` (what the two keywords meant before it).
    efficiency : float, default 1.0
        Fraction of a device's peak FLOP/s that FLOP-derived times achieve.
    roofline : bool, default False
        Price unmeasured nodes by the roofline of :func:`~shardplan.cost.roofline_seconds`
        (what execution settings without an ``efficiency`` ask for) on devices that declare
        an fp32 rate or a memory bandwidth, instead of ``FLOPs / (peak x efficiency)``.
    recompute : bool, default False
        Activation recomputation: backward re-runs forward; only stage inputs are stashed.
    profile_flops : float, optional
        Peak FLOP/s of the machine the graph's measured seconds come from. When given,
        measured seconds on device d are scaled by ``profile_flops / flops[d]``; when absent
        they are used as they are, on every device.

    Examples
    --------
    >>> from shardplan.ir import Device, Graph, Topology
    >>> g = Graph.from_arrays(name="g", fwd_flops=[1e12, 2e12], src=[0], dst=[1],
    ...                       output_bytes=[1e6, 0], param_bytes=[4e6, 0])
    >>> t = Topology(name="t", devices=(Device("a", 1e9, 1e12), Device("b", 1e9, 1e12)),
    ...              bandwidth=[[0, 1e9], [1e9, 0]], latency=[[0, 1e-3], [1e-3, 0]])
    >>> cm = CostModel(g, t, optimizer="sgd")
    >>> cm.stage_seconds([0, 1], [0, 1]).round(9).tolist()  # 3 s + 2 x (1 ms + 1 ms) comm
    [3.004, 6.004]
    >>> cm.partition_memory_bytes([0, 1], in_flight=[2, 1]).tolist()
    [10000000.0, 1000000.0]
    """

    graph: Graph
    topology: Topology | None = None
    _: KW_ONLY
    optimizer: str = "adam"
    mixed_precision: bool = False
    param_dtype_bytes: int = 2
    precision: str = ""
    efficiency: float = 1.0
    recompute: bool = False
    profile_flops: float | None = None
    execution: ExecutionSettings | None = None
    roofline: bool = False

    @classmethod
    def from_settings(cls, graph: Graph, topology: Topology | None,
                      settings: ExecutionSettings) -> CostModel:
        """The cost model of ``graph`` run as ``settings`` say: the graph taken to the
        settings' micro-batch size (:meth:`Graph.at_batch_size`), their optimizer,
        precision, efficiency, recomputation and profile speed. O(n + m)."""
        resolved = settings.resolve(graph)
        return cls(resolved.graph_for(graph), topology, optimizer=resolved.optimizer,
                   mixed_precision=resolved.mixed_precision,
                   param_dtype_bytes=resolved.param_dtype_bytes,
                   precision=resolved.precision,
                   efficiency=resolved.efficiency_or_peak, recompute=resolved.recompute_full,
                   profile_flops=resolved.profile_flops, execution=resolved,
                   roofline=resolved.efficiency is None)

    @property
    def settings(self) -> ExecutionSettings:
        """The execution settings this model prices (built from its keywords when it was
        not made by :meth:`from_settings`)."""
        if self.execution is not None:
            return self.execution
        return ExecutionSettings(
            microbatch_size=int(self.graph.batch_size), optimizer=self.optimizer,
            precision=self.compute_precision, efficiency=self.efficiency,
            recompute="full" if self.recompute else "none",
            profile_flops=self.profile_flops)

    @property
    def compute_precision(self) -> str:
        """``precision``, or what ``mixed_precision`` means when it is unset (``fp16`` or
        ``fp32``)."""
        if self.precision:
            return self.precision
        return "fp16" if self.mixed_precision else "fp32"

    def __post_init__(self) -> None:
        if not isinstance(self.graph, Graph):
            raise ShardplanError("CostModel needs a Graph")
        if self.topology is not None and not isinstance(self.topology, Topology):
            raise ShardplanError("CostModel's topology must be a Topology")
        optimizer_state_factor(self.optimizer)
        check_positive("efficiency", self.efficiency, at_most=1.0)
        if self.profile_flops is not None:
            check_positive("profile_flops", self.profile_flops)
        if isinstance(self.param_dtype_bytes, bool) or not isinstance(
                self.param_dtype_bytes, (int, np.integer)) or self.param_dtype_bytes < 1:
            raise ShardplanError(f"param_dtype_bytes must be a positive integer, got "
                                 f"{self.param_dtype_bytes!r}")
        if self.precision and self.precision not in PRECISIONS:
            raise ShardplanError(f"unknown precision {self.precision!r} (choose from "
                                 f"{', '.join(PRECISIONS)})")
        if self.topology is not None and self.compute_precision == "fp8":
            matmul_peak_flops(self.topology, "fp8")  # refuses devices without fp8

    # ------------------------------------------------------------------ precomputed
    @cached_property
    def _work(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(fwd measured s, fwd FLOPs, bwd measured s, bwd FLOPs)`` per node. Under the
        roofline the FLOP parts are the roofline seconds on the topology's fastest device
        times its peak (FLOPs that run at that peak for as long as the roofline says), so
        every formula below stays ``measured / speed + FLOPs / rate``; on a device with a
        different peak the roofline time scales with the peak ratio. Nodes without a
        measured time also carry the topology's per-operator overhead (dispatch and
        autograd, :func:`~shardplan.cost._overheads.op_overhead`) in their measured part."""
        fm, ff, bm, bf = split_work(self.graph)
        topo = self.topology
        # Dispatch and autograd bookkeeping of every node whose time is not measured (a
        # profiled time already has its own): the topology's measured per-operator overhead
        # (shardplan.cost._overheads), 0 where it has none.
        of, ob = op_overhead(topo)
        if of > 0 or ob > 0:
            g = self.graph
            fm = fm + np.where(_unmeasured(g.fwd_seconds, g.num_nodes), of, 0.0)
            bm = bm + np.where(_unmeasured(g.bwd_seconds, g.num_nodes), ob, 0.0)
        if not self.roofline or topo is None or topo.num_devices == 0:
            return fm, ff, bm, bf
        bw = topo.device_memory_bandwidth
        fp32 = topo.device_fp32_flops
        peak = topo.device_flops
        if not (np.isfinite(bw).any() or np.any(fp32 != peak)):
            return fm, ff, bm, bf  # devices that declare nothing but a FLOP rate
        ref = int(np.argmax(peak))
        mm = matmul_peak_flops(topo, self.compute_precision)
        rate, feed = float(mm[ref]), float(bw[ref])
        hw = gpu_model(topo)
        if hw is not None:  # what kernels reach of a known GPU's datasheet: the GPU model
            # the LLM plan kind prices with (shardplan.cost._gpu; MAMF is a tensor-core
            # figure, so fp32 products keep their peak there too)
            if self.compute_precision != "fp32":
                rate *= hw.matmul_fraction(self.compute_precision)
            feed *= hw.memory_efficiency
        tf, tb = roofline_seconds(self.graph, rate, fp32[ref], feed,
                                  mixed_precision=self.compute_precision != "fp32")
        return fm, np.where(ff > 0, tf * peak[ref], 0.0), bm, \
            np.where(bf > 0, tb * peak[ref], 0.0)

    @cached_property
    def param_tensors(self) -> np.ndarray:
        """Per node, the parameter tensors an optimizer steps for it, shape (n,): the graph's
        ``param_tensors`` where captured, else one per node holding parameters (a lower
        bound: a layer with a bias holds two). O(n).

        Examples
        --------
        >>> from shardplan.ir import Graph
        >>> g = Graph.from_arrays(name="g", fwd_flops=[1, 1, 1], src=[0, 1], dst=[1, 2],
        ...                       param_bytes=[8, 0, 4])
        >>> CostModel(g).param_tensors.tolist()
        [1.0, 0.0, 1.0]
        >>> g = g.replace(param_tensors=np.array([2.0, 0.0, np.nan]))
        >>> CostModel(g).param_tensors.tolist()
        [2.0, 0.0, 1.0]
        """
        g = self.graph
        guess = (g.param_bytes > 0).astype(np.float64)
        if g.param_tensors is None:
            return guess
        return np.where(np.isnan(g.param_tensors), guess, g.param_tensors)

    @cached_property
    def accumulation_seconds(self) -> np.ndarray:
        """Per node, the seconds a backward spends adding its parameters' gradients into
        those of the iteration's earlier micro-batches, averaged over the settings'
        micro-batches, shape (n,): every backward but a device's first of an iteration adds
        in place (autograd accumulates into ``.grad``; the first one's result is kept as it
        is), reading both and writing one, ``3 P / memory_bandwidth`` for ``P`` parameter
        bytes at the slowest device's bandwidth, so ``3 P (m - 1) / (m bandwidth)`` per
        micro-batch. Paper 000's MLP on one CPU core: a backward of 64 samples takes 2.6 ms
        into fresh gradients and 3.1 ms accumulating (7.4 MB of them, 15 GB/s). Zeros without
        a memory bandwidth or with one micro-batch. Not part of the node's work (the
        planners' own models, PipeDream's, leave it out): :func:`shardplan.cost.stage_times`,
        the mapping and Parmesan's refinement add it to every replica's backward in full
        (each replica accumulates all its gradients). O(n)."""
        n = self.graph.num_nodes
        topo = self.topology
        m = int(self.settings.microbatches)
        if topo is None or topo.num_devices == 0 or m <= 1:
            return np.zeros(n)
        membw = topo.device_memory_bandwidth
        known = np.isfinite(membw) & (membw > 0)
        if not known.any():
            return np.zeros(n)
        return 3.0 * self.graph.param_bytes * (m - 1) / (m * float(membw[known].min()))

    def _topo(self) -> Topology:
        if self.topology is None:
            raise ShardplanError("this cost needs a topology")
        return self.topology

    @cached_property
    def device_rate(self) -> np.ndarray:
        """Effective FLOP/s of every device: ``flops * efficiency``, shape (D,). Without
        the roofline (an ``efficiency`` given) every FLOP runs at that one rate, and under
        ``fp8`` the rate is the device's fp8 peak times the efficiency (the roofline prices
        fp8 matrix products itself, see :attr:`_work`)."""
        topo = self._topo()
        if not self.roofline and self.compute_precision == "fp8":
            return matmul_peak_flops(topo, "fp8") * self.efficiency
        return topo.device_flops * self.efficiency

    @cached_property
    def device_speed(self) -> np.ndarray:
        """Measured-time speed ratio of every device (ones without ``profile_flops``)."""
        return _device_speed(self._topo(), self.profile_flops)

    @cached_property
    def inverse_bandwidth(self) -> np.ndarray:
        """Seconds per byte between devices, (D, D); see :func:`inverse_bandwidth`."""
        return inverse_bandwidth(self._topo())

    def _device(self, device: Any) -> int:
        num = self._topo().num_devices
        if isinstance(device, bool) or not isinstance(device, (int, np.integer)) \
                or not 0 <= device < num:
            raise ShardplanError(f"device must be an integer in [0, {num}), got {device!r}")
        return int(device)

    # ------------------------------------------------------------------ compute
    def node_seconds(self, device: int) -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward seconds of every node on ``device``, shape (n,) each. O(n)."""
        d = self._device(device)
        fm, ff, bm, bf = self._work
        rate, speed = self.device_rate[d], self.device_speed[d]
        fwd = work_seconds(fm, ff, speed, rate)
        bwd = work_seconds(bm, bf, speed, rate)
        return fwd, (bwd + fwd if self.recompute else bwd)

    @cached_property
    def replica_fixed(self) -> tuple[np.ndarray, np.ndarray]:
        """Per node, the forward and backward seconds that do not shrink when a stage's R
        replicas split the micro-batch, shape (n,) each: a replica computes its share
        ``1 / R`` of the rest and all of these (``shardplan.cost.stage_times``, the mapping
        and Parmesan's refinement read them here): :meth:`unshared_seconds` on the whole
        topology. O(n)."""
        return self.unshared_seconds()

    def unshared_seconds(self, weight_split: np.ndarray | float = 1.0,
                         devices: Sequence[int] | None = None
                         ) -> tuple[np.ndarray, np.ndarray]:
        """Per node, the forward and backward seconds a device pays in full when it runs a
        share of the node's batch, shape (n,) each, at most the node's time:

        - the measured per-operator overhead (:func:`op_overhead`: dispatch and autograd,
          paid once per operator whatever the batch);
        - reading the parameters it holds (its node's bytes over ``weight_split``, the
          devices a split of the weight spreads it over: 1 for replicas) at the memory
          bandwidth (``memory_bandwidth``, the slowest device's), once in the forward and
          twice in the backward (the input gradient reads them, the weight gradient writes
          as many bytes): a share of the batch still reads every weight it holds. Paper
          000's MLP on one CPU core: 1.85 ms forward at 64 samples and 1.23 ms at 32,
          against 0.93 if all of it shrank with the share.

        ``devices``: the devices that run the nodes (default: every device, the node's time
        on the fastest, the roofline's reference; else on the first of them). The backward
        part leaves out a recomputed forward (the forward's part counts twice then). Zeros
        without either measurement. O(n).
        """
        nf, nb, of, ob, read = self.unshared_parts(devices)
        read = read / weight_split
        return np.minimum(nf, of + read), np.minimum(nb, ob + 2.0 * read)

    def unshared_parts(self, devices: Sequence[int] | None = None
                       ) -> tuple[np.ndarray, np.ndarray, float, float, np.ndarray]:
        """The pieces of :meth:`unshared_seconds`: per node the forward and backward seconds
        it is capped at (the backward without a recomputed forward), the per-operator
        forward and backward overheads, and the seconds of reading the node's whole
        parameters once; a weight split over ``f`` devices reads ``1 / f`` of them. O(n)."""
        n = self.graph.num_nodes
        topo = self.topology
        zero = np.zeros(n)
        if topo is None or topo.num_devices == 0:
            return zero, zero, 0.0, 0.0, zero
        devs = np.arange(topo.num_devices) if devices is None else np.asarray(devices)
        of, ob = op_overhead(topo, None if devices is None else devs.tolist())
        membw = topo.device_memory_bandwidth[devs]
        known = np.isfinite(membw) & (membw > 0)
        if of <= 0 and ob <= 0 and not known.any():
            return zero, zero, 0.0, 0.0, zero
        ref = int(np.argmax(topo.device_flops)) if devices is None else int(devs[0])
        nf, nb = self.node_seconds(ref)
        if self.recompute:
            nb = nb - nf
        read = self.graph.param_bytes / float(membw[known].min()) if known.any() else zero
        return nf, nb, float(of), float(ob), np.asarray(read, dtype=np.float64)

    def replica_fixed_total(self) -> np.ndarray:
        """Per node, :attr:`replica_fixed`'s forward plus backward seconds (the forward
        twice under recomputation), shape (n,). O(n)."""
        ff, fb = self.replica_fixed
        return ff * (2.0 if self.recompute else 1.0) + fb

    def replica_extra_seconds(self, replicas: int) -> np.ndarray:
        """Per node, what one of ``replicas`` replicas computes beyond its ``1 / R`` share
        of the node's forward + backward seconds, shape (n,): :attr:`replica_fixed` (paid
        in full, so ``1 - 1 / R`` of it on top of the share) and the gradient accumulation
        (:attr:`accumulation_seconds`, in no node's work). The mapping and Parmesan's
        refinement, whose stages all have R replicas, add it as ``stage_times`` does. O(n).
        """
        return self.replica_fixed_total() * (1.0 - 1.0 / replicas) + self.accumulation_seconds

    def stage_compute_seconds(self, nodes: Sequence[int] | np.ndarray,
                              device: int) -> tuple[float, float]:
        """Forward and backward seconds of one node set on ``device``. O(n)."""
        d = self._device(device)
        mask = check_nodes(self.graph, nodes)
        fm, ff, bm, bf = (float(w[mask].sum()) for w in self._work)
        fwd = float(work_seconds(fm, ff, self.device_speed[d], self.device_rate[d]))
        bwd = float(work_seconds(bm, bf, self.device_speed[d], self.device_rate[d]))
        return fwd, (bwd + fwd if self.recompute else bwd)

    def stage_work(self, assignment: Sequence[int] | np.ndarray,
                   num_stages: int | None = None) -> np.ndarray:
        """Per stage, the sums ``(fwd measured s, fwd FLOPs, bwd measured s, bwd FLOPs)``.

        Shape (4, k); device-independent, so a mapping search computes it once. O(n + k).
        """
        a, k = check_assignment(self.graph, assignment, num_stages)
        return np.stack([np.bincount(a, weights=w, minlength=k) for w in self._work])

    def compute_matrix(self, assignment: Sequence[int] | np.ndarray,
                       num_stages: int | None = None) -> np.ndarray:
        """Forward + backward seconds of every stage on every device, shape (k, D).

        ``C[s, d] = (fm_s + bm_s) / speed_d + (ff_s + bf_s) / rate_d`` (recompute adds the
        forward again). O(n + k D).
        """
        fm, ff, bm, bf = self.stage_work(assignment, num_stages)
        mult = 2.0 if self.recompute else 1.0
        return work_seconds((fm * mult + bm)[:, None], (ff * mult + bf)[:, None],
                            self.device_speed[None, :], self.device_rate[None, :])

    def partition_compute_seconds(self, assignment: Sequence[int] | np.ndarray,
                                  stage_devices: Any, num_stages: int | None = None
                                  ) -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward seconds of every stage on its (first) device, (k,) each."""
        fm, ff, bm, bf = self.stage_work(assignment, num_stages)
        dev = stage_devices_array(self._topo(), stage_devices, fm.shape[0])[:, 0]
        speed, rate = self.device_speed[dev], self.device_rate[dev]
        fwd = work_seconds(fm, ff, speed, rate)
        bwd = work_seconds(bm, bf, speed, rate)
        return fwd, (bwd + fwd if self.recompute else bwd)

    # ------------------------------------------------------------------ communication
    def traffic(self, assignment: Sequence[int] | np.ndarray,
                num_stages: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Bytes and tensors between stages, (k, k) each; see :func:`stage_traffic`."""
        return stage_traffic(self.graph, assignment, num_stages)

    def stage_transfer_seconds(self, assignment: Sequence[int] | np.ndarray,
                               stage_devices: Any, num_stages: int | None = None, *,
                               gradients: bool = True) -> np.ndarray:
        """Communication seconds of every stage; see :func:`stage_transfer_seconds`."""
        b, t = self.traffic(assignment, num_stages)
        return stage_transfer_seconds(self._topo(), b, t, stage_devices, gradients=gradients)

    def stage_seconds(self, assignment: Sequence[int] | np.ndarray, stage_devices: Any,
                      num_stages: int | None = None) -> np.ndarray:
        """Time of every stage for one micro-batch: Parmesan's equation 3.

        The ``eq3`` view of :func:`~shardplan.cost.stage_times` (memory not checked):
        ``t(s) = max over replicas i of [ C[s, p_i(s)] / r + c_m_i(s) ]``, compute on the
        replica's device divided by the r replicas that share the micro-batch (equation 3's
        ``/(d - d')``), plus every message it sends and receives in both passes. The
        pipeline's steady-state time per micro-batch is the largest ``t(s)`` (equation 1);
        gradient all-reduce is once per iteration and left to :meth:`allreduce_seconds`.
        O(n + m log m + r k^2).
        """
        from shardplan.cost._pipeline import stage_times

        st = stage_times(self, assignment, stage_devices, num_stages=num_stages,
                         order=range(check_assignment(self.graph, assignment, num_stages)[1]))
        return st.stage_seconds("eq3", memory=False)

    def allreduce_seconds(self, assignment: Sequence[int] | np.ndarray, stage_devices: Any,
                          num_stages: int | None = None) -> np.ndarray:
        """Ring all-reduce seconds of every stage's gradients over its replicas, (k,)."""
        a, k = check_assignment(self.graph, assignment, num_stages)
        dev = stage_devices_array(self._topo(), stage_devices, k)
        grads = np.bincount(a, weights=self.graph.param_bytes.astype(np.float64), minlength=k)
        return np.array([allreduce_seconds(self._topo(), dev[s], grads[s]) for s in range(k)])

    # ------------------------------------------------------------------ memory
    def memory_breakdown(self, assignment: Sequence[int] | np.ndarray,
                         num_stages: int | None = None, *, in_flight: Any = 1,
                         replicas: Any = 1) -> dict[str, np.ndarray]:
        """Every memory term of every stage; see :func:`partition_memory_breakdown` (with
        the settings' sharded data parallelism or distributed optimizer when they ask for
        it)."""
        s = self.settings
        return partition_memory_breakdown(
            self.graph, assignment, num_stages, optimizer=self.optimizer, in_flight=in_flight,
            recompute=self.recompute, mixed_precision=self.mixed_precision,
            param_dtype_bytes=self.param_dtype_bytes, replicas=replicas,
            sharded=s.gradient_sync == "sharded", unit_bytes=float(s.bucket_bytes),
            optimizer_sharded=s.gradient_sync == "zero1")

    def partition_memory_bytes(self, assignment: Sequence[int] | np.ndarray,
                               num_stages: int | None = None, *, in_flight: Any = 1,
                               replicas: Any = 1) -> np.ndarray:
        """Memory of every stage, bytes per device, shape (k,)."""
        return self.memory_breakdown(assignment, num_stages, in_flight=in_flight,
                                     replicas=replicas)["total"]

    def stage_memory_bytes(self, nodes: Sequence[int] | np.ndarray, *, in_flight: float = 1,
                           replicas: int = 1) -> float:
        """Memory of one node set run as a stage, bytes per device."""
        mask = check_nodes(self.graph, nodes)
        return float(self.partition_memory_bytes(np.where(mask, 0, 1), 2, in_flight=in_flight,
                                                 replicas=replicas)[0])

    def fits_memory(self, assignment: Sequence[int] | np.ndarray, stage_devices: Any,
                    num_stages: int | None = None, *, in_flight: Any = 1) -> np.ndarray:
        """Whether every stage fits in the memory of each of its devices, bool (k,)."""
        a, k = check_assignment(self.graph, assignment, num_stages)
        dev = stage_devices_array(self._topo(), stage_devices, k)
        need = self.partition_memory_bytes(a, k, in_flight=in_flight, replicas=dev.shape[1])
        have = self._topo().device_memory[dev].min(axis=1)
        return need <= have

    # ------------------------------------------------------------------ bounds
    def lower_bound_seconds(self, num_devices: int | None = None, *,
                            replicas: int = 1) -> float:
        """See :func:`lower_bound_seconds`. O(n + D)."""
        topo = self._topo()
        d = topo.num_devices if num_devices is None else int(num_devices)
        if d < 1:
            raise ShardplanError(f"num_devices must be a positive integer, got {num_devices!r}")
        fastest = int(np.argmax(topo.device_flops))
        fwd, bwd = self.node_seconds(fastest)
        work = fwd + bwd
        if work.size == 0:
            return 0.0
        r = int(replicas)
        if r < 1:
            raise ShardplanError(f"replicas must be a positive integer, got {replicas!r}")
        return float(max(work.sum() / d, work.max() / r))
