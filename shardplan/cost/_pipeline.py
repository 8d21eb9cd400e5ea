"""The one stage-time model: what one micro-batch costs every replica of every placed stage.

:func:`stage_times` turns a partition (stage of every node), its placement (the device of
every replica of every stage) and the plan's :class:`~shardplan.ir.ExecutionSettings` into
a :class:`StageTimes`: per replica, the forward and backward seconds of one micro-batch, the
seconds of the messages it sends and receives, and per stage the gradient all-reduce of an
iteration and the memory per device. The simulator runs exactly these numbers; the
objectives the planners optimise are named *views* of them (:data:`VIEWS`), so partition,
mapping, ``shardplan cost`` and the simulator cannot disagree about a stage's time:

``p2p`` -- Parmesan's equation 6 (section 5.2), per replica
    ``compute + send + recv``: a replica is busy for everything it computes, sends and
    receives (no overlap).
``eq3`` -- Parmesan's equation 3 (section 4.1), per stage
    the slowest replica's ``p2p`` time. Equation 6 is equation 3 with the devices named, so
    the two are one function: a partition's ``eq3`` value is the ``p2p`` value of its
    placement (tested).
``allreduce`` -- Parmesan's equation 7, per replica
    ``compute + all-reduce``. The paper charges the stage's whole compute; we charge the
    replica's share (``1/R`` of the micro-batch), as equation 3 does, so the views agree on
    compute. With one replica it equals ``compute``.
``overlap`` -- ours, the simulator's model, per replica
    ``max(compute, send) + all-reduce / (M + P - 1)``: a device computes while it sends
    (a separate communication stream; receiving costs the receiver nothing), so in the
    steady state of a pipeline the busier of its two resources sets the pace; and the
    gradient all-reduce, once per iteration, is spread over the ``M + P - 1`` pipeline steps
    of an iteration (M micro-batches, P pipeline ranks). ``(M + P - 1)`` times the largest
    ``overlap`` time is the classic iteration estimate ``(M + S - 1) t`` plus the exposed
    all-reduce; the simulator's own figure is :func:`shardplan.simulate.simulate`.

Where the paper's assumptions hold -- one replica, no latency, free transfers -- every view
is the stage's compute (tested). A plan records which view its objective used
(:data:`OBJECTIVE_NAMES`).

Link contention (``stage_times(..., contention=True)``, on topologies with physical
``links``): the views above give every message its route's bottleneck bandwidth alone. With
contention, the messages of one micro-batch (activations and gradients, every stage pair,
every replica) are taken to stream at once, as they do in a pipeline's steady state. A
*transfer* is everything one device sends another per micro-batch; a device sends its
transfers one after another (the simulator's send queue), so they do not slow each other,
but they share every link of their routes with the other devices' transfers:
``bandwidth seconds = max over the route's links l of (bytes + bytes of the other devices'
transfers over l) / bandwidth(l)`` (at least ``bytes / bottleneck bandwidth``, the value
without contention, which it equals when no other device uses its links). Each message of a
transfer takes its share (by bytes) of that time, plus its latency. Loads only grow as
transfers are added, so a partial placement's times are lower bounds of every completion's
(what the mapping search relies on). Objectives priced this way carry
:data:`CONTENTION_SUFFIX` (``max_stage_seconds_overlap_contention``). All-reduce rings and
sharded all-gathers stay uncontended.

Replicas: the R_s replicas of stage s split every micro-batch, replica i running the share
``[i / R_s, (i + 1) / R_s)`` of its samples. Replica i of stage a sends to replica j of stage
b the part of a's output for the samples both hold (the overlap of their shares: all of it
to replica i when both stages have R replicas, Parmesan's copies of the stage graph), so
stages may have different replica counts (PipeDream's per-stage replication).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from shardplan.cost._checks import check_assignment
from shardplan.cost._collectives import ring_collectives
from shardplan.cost._contention import link_contention, link_table, route_links
from shardplan.cost._formulas import message_seconds, optimizer_seconds, work_seconds
from shardplan.cost._memory import in_flight_microbatches
from shardplan.cost._overheads import optimizer_seconds_per_byte, optimizer_seconds_per_tensor
from shardplan.cost._transfer import stage_traffic
from shardplan.errors import ShardplanError

__all__ = ["CONTENTION_SUFFIX", "OBJECTIVE_NAMES", "VIEWS", "StageTimes",
           "contention_of_objective", "objective_name", "pipeline_factor",
           "pipeline_positions", "replica_pairs",
           "stage_devices_padded", "stage_times", "uniform_comm", "view_of_objective",
           "view_seconds"]

VIEWS = ("overlap", "eq3", "p2p", "allreduce")
OBJECTIVE_NAMES = {"eq3": "max_stage_seconds", "p2p": "max_stage_seconds_p2p",
                   "allreduce": "max_stage_seconds_allreduce",
                   "overlap": "max_stage_seconds_overlap"}
_VIEW_OF = {v: k for k, v in OBJECTIVE_NAMES.items()}
#: Ends the objective name of a view priced with link contention (module docstring).
CONTENTION_SUFFIX = "_contention"


def objective_name(view: str, contention: bool = False) -> str:
    """The objective name plans record for ``view``, with or without link contention."""
    return OBJECTIVE_NAMES[view] + (CONTENTION_SUFFIX if contention else "")


def _split_name(name: str) -> tuple[str, bool]:
    if name.endswith(CONTENTION_SUFFIX) and name[:-len(CONTENTION_SUFFIX)] in _VIEW_OF:
        return name[:-len(CONTENTION_SUFFIX)], True
    return name, False


def view_of_objective(name: str) -> str:
    """The view an objective name (as plans record it) stands for."""
    base, _ = _split_name(name)
    try:
        return _VIEW_OF[base]
    except KeyError:
        raise ShardplanError(f"{name!r} is not a stage-time objective (known: "
                             f"{', '.join(sorted(_VIEW_OF))}, each optionally with "
                             f"{CONTENTION_SUFFIX!r})") from None


def contention_of_objective(name: str) -> bool:
    """Whether an objective name says its view was priced with link contention."""
    return _split_name(name)[1]


def pipeline_factor(num_microbatches: int, num_ranks: int) -> int:
    """``M + P - 1``: pipeline steps of one iteration with M micro-batches on P ranks."""
    return int(num_microbatches) + int(num_ranks) - 1


def view_seconds(view: str, compute: Any, send: Any, recv: Any, allreduce: Any,
                 factor: float) -> Any:
    """The per-replica time of ``view`` (see the module docstring) from its terms.

    ``compute``, ``send`` and ``recv`` are one micro-batch's seconds per replica,
    ``allreduce`` the stage's all-reduce seconds per iteration (broadcast against them) and
    ``factor`` the pipeline steps of an iteration (:func:`pipeline_factor`). Every search
    surrogate (the DP's, refinement's, the mapping search's) and the simulator-side
    evaluation call this one function. Broadcasts. O(size)."""
    if view in ("p2p", "eq3"):
        return compute + send + recv
    if view == "overlap":
        return np.maximum(compute, send) + np.asarray(allreduce) / float(factor)
    if view == "allreduce":
        return compute + allreduce
    raise ShardplanError(f"unknown stage-time view {view!r} (choose from "
                         f"{', '.join(VIEWS)})")


@lru_cache(maxsize=256)
def replica_pairs(ra: int, rb: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which replica of a stage with ``ra`` replicas sends to which of one with ``rb``, and
    the fraction of the micro-batch each message carries: ``(i, j, frac)``, the pairs whose
    sample shares ``[i/ra, (i+1)/ra)`` and ``[j/rb, (j+1)/rb)`` overlap. ``ra == rb``:
    ``i == j`` and ``1 / r`` each. O(ra rb)."""
    i, j = np.meshgrid(np.arange(ra), np.arange(rb), indexing="ij")
    lo = np.maximum(i / ra, j / rb)
    hi = np.minimum((i + 1) / ra, (j + 1) / rb)
    frac = hi - lo
    keep = frac > 1e-12
    out = (i[keep].astype(np.int64), j[keep].astype(np.int64), frac[keep])
    for arr in out:
        arr.setflags(write=False)
    return out


def stage_devices_padded(num_devices: int, stage_devices: Any, k: int
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Stage devices as ``(devices, replicas)``: a (k, Rmax) int array padded with -1 and
    the replica count of every stage. Accepts a (k,) or (k, R) array or k sequences."""
    try:
        arr = np.asarray(stage_devices, dtype=np.int64)
        if arr.ndim == 1:
            arr = arr[:, None]
        rows = [arr[s] for s in range(arr.shape[0])] if arr.ndim == 2 else None
    except (TypeError, ValueError):
        rows = None
    if rows is None:
        try:
            rows = [np.asarray(list(d), dtype=np.int64).reshape(-1) for d in stage_devices]
        except (TypeError, ValueError):
            raise ShardplanError("stage devices must be one device per stage, or a list of "
                                 "replica devices per stage") from None
    if len(rows) != k or any(r.size < 1 for r in rows):
        raise ShardplanError(f"stage devices must give {k} stages at least one device each")
    reps = np.array([r.size for r in rows], dtype=np.int64)
    dev = np.full((k, int(reps.max()) if k else 1), -1, dtype=np.int64)
    for s, r in enumerate(rows):
        dev[s, :r.size] = r
    used = dev[dev >= 0]
    if used.size and (int(used.min()) < 0 or int(used.max()) >= num_devices):
        raise ShardplanError(f"stage devices must lie in [0, {num_devices})")
    return dev, reps


def uniform_comm(traffic_bytes: np.ndarray, traffic_tensors: np.ndarray,
                 latency: Sequence[np.ndarray], inv_bandwidth: Sequence[np.ndarray],
                 replicas: int) -> tuple[np.ndarray, np.ndarray]:
    """Send and receive seconds per replica, shape (R, S), when every stage has ``replicas``
    replicas: ``latency[i]``, ``inv_bandwidth[i]`` are the (S, S) link matrices between the
    stages' replica-i devices (latency 0 between stages on one device). Replica i of a
    stage sends its forward activations ``F = T lat + (B / R) ib`` and the gradients of what
    it received, ``G[a, s] = T[a, s] lat[s, a] + (B[a, s] / R) ib[s, a]``. O(R S^2)."""
    r = int(replicas)
    send = np.zeros((r, traffic_bytes.shape[0]))
    recv = np.zeros_like(send)
    b = traffic_bytes / r
    for i in range(r):
        f = message_seconds(traffic_tensors, latency[i], b, inv_bandwidth[i])
        g = message_seconds(traffic_tensors, latency[i].T, b, inv_bandwidth[i].T)
        send[i] = f.sum(axis=1) + g.sum(axis=0)
        recv[i] = f.sum(axis=0) + g.sum(axis=1)
    return send, recv


@dataclass(frozen=True, eq=False)
class Messages:
    """Every message of one micro-batch between stage replicas (arrays of one length):
    stages and replicas of sender and receiver, bytes, tensors, and the seconds of the
    forward message (activations, src -> dst) and of its backward twin (gradients, dst ->
    src) alone on their links."""

    src_stage: np.ndarray
    dst_stage: np.ndarray
    src_replica: np.ndarray
    dst_replica: np.ndarray
    nbytes: np.ndarray
    tensors: np.ndarray
    forward_seconds: np.ndarray
    backward_seconds: np.ndarray


@dataclass(frozen=True, eq=False)
class StageTimes:
    """One micro-batch of a placed partition under one execution model (module docstring).

    Attributes
    ----------
    devices : ndarray of int64, shape (S, Rmax)
        Device of every replica, -1 past a stage's replica count.
    replicas : ndarray of int64, shape (S,)
    forward, backward : ndarray, shape (S, Rmax)
        Seconds of one micro-batch per replica (the replica's share), 0 past the replicas.
        ``backward`` includes the recomputed forward under recomputation.
    send, recv : ndarray, shape (S, Rmax)
        Seconds of the messages a replica sends (its activations forward, the gradients of
        its inputs backward) and receives, each alone on its links.
    allreduce : ndarray, shape (S,)
        The stage's gradient synchronisation over its replicas, once per iteration: the
        all-reduce of its gradients (``gradient_sync`` ``end`` or ``bucketed``), or their
        reduce-scatter (``sharded``; the two all-gathers of every micro-batch are then in
        ``send`` and ``recv``). Measured collective curves of the topology when it has
        them, else the ring over the slowest link (:mod:`shardplan.cost._collectives`).
    optimizer : ndarray, shape (S, Rmax)
        Optimizer step of the stage's parameters on every replica's device.
    memory, capacity : ndarray, shape (S,)
        Bytes per device the stage needs (activations of its micro-batches in flight), and
        the smallest memory among its devices.
    in_flight : ndarray, shape (S,)
    traffic_bytes, traffic_tensors : ndarray, shape (S, S)
        Bytes and distinct tensors stage a sends stage b per micro-batch (whole micro-batch).
    param_bytes : ndarray, shape (S,)
    messages : Messages
    microbatches, num_ranks : int
        M, and P, the pipeline ranks (S, or S / v under interleaved 1F1B).
    """

    devices: np.ndarray
    replicas: np.ndarray
    forward: np.ndarray
    backward: np.ndarray
    send: np.ndarray
    recv: np.ndarray
    allreduce: np.ndarray
    optimizer: np.ndarray
    memory: np.ndarray
    capacity: np.ndarray
    in_flight: np.ndarray
    traffic_bytes: np.ndarray
    traffic_tensors: np.ndarray
    param_bytes: np.ndarray
    messages: Messages
    microbatches: int
    num_ranks: int

    @property
    def num_stages(self) -> int:
        return int(self.replicas.size)

    @property
    def mask(self) -> np.ndarray:
        """(S, Rmax) True where a replica exists."""
        return self.devices >= 0

    @property
    def compute(self) -> np.ndarray:
        return self.forward + self.backward

    @property
    def fits(self) -> np.ndarray:
        return self.memory <= self.capacity

    @property
    def factor(self) -> int:
        return pipeline_factor(self.microbatches, self.num_ranks)

    def replica_seconds(self, view: str) -> np.ndarray:
        """``view``'s time of every replica, (S, Rmax) (0 past a stage's replicas)."""
        t = view_seconds(view, self.compute, self.send, self.recv, self.allreduce[:, None],
                         self.factor)
        return np.where(self.mask, t, 0.0)

    def stage_seconds(self, view: str, *, memory: bool = True) -> np.ndarray:
        """``view``'s time of every stage (its slowest replica), (S,); ``inf`` for a stage
        that does not fit in memory unless ``memory=False``."""
        t = self.replica_seconds(view).max(axis=1) if self.num_stages else np.zeros(0)
        return np.where(self.fits, t, np.inf) if memory else t

    def value(self, view: str, *, memory: bool = True) -> float:
        """The objective: the largest stage time of ``view`` (0 without stages)."""
        t = self.stage_seconds(view, memory=memory)
        return float(t.max()) if t.size else 0.0

    def iteration_estimate(self, order: Sequence[int] | None = None, *,
                           overlap: bool = True) -> float:
        """A closed-form estimate of one iteration's seconds (the simulator's model without
        link contention or schedule details): the first micro-batch's round trip through
        every stage, ``M - 1`` more steps of the bottleneck resource, the all-reduce not
        hidden behind later stages' backward drain, and the slowest optimizer step.

        ``order``: the stages in pipeline order (default 0..S-1). With ``overlap`` the
        bottleneck is ``max(compute, send)`` per replica (view ``overlap`` without its
        all-reduce term), else ``compute + send + recv`` (``p2p``). O(S R).
        """
        if self.num_stages == 0:
            return 0.0
        order = list(range(self.num_stages)) if order is None else list(order)
        c = self.compute
        if overlap:
            step = np.where(self.mask, np.maximum(c, self.send), 0.0).max(axis=1)
        else:
            step = np.where(self.mask, c + self.send + self.recv, 0.0).max(axis=1)
        trip = np.where(self.mask, c + self.send, 0.0).max(axis=1)
        bwd = np.where(self.mask, self.backward + self.send, 0.0).max(axis=1)
        drain = np.zeros(self.num_stages)
        acc = 0.0
        for s in order:  # stage order[0] finishes its backward last
            drain[s] = acc
            acc += float(bwd[s])
        exposed = float(np.maximum(self.allreduce - drain, 0.0).max())
        opt = float(self.optimizer.max()) if self.optimizer.size else 0.0
        return float(trip.sum() + (self.microbatches - 1) * step.max() + exposed + opt)


def stage_times(model: Any, assignment: Sequence[int] | np.ndarray, stage_devices: Any, *,
                num_stages: int | None = None, in_flight: Any = None,
                order: Sequence[int] | None = None, contention: bool = False) -> StageTimes:
    """The :class:`StageTimes` of a partition placed on devices.

    Parameters
    ----------
    model : CostModel
        Graph (at the micro-batch size), topology and execution settings
        (:meth:`CostModel.from_settings`).
    assignment : array of int, shape (n,)
        Stage of every node.
    stage_devices : array (S,) or (S, R), or S sequences
        Device of every replica of every stage (stages may differ in replica count).
    num_stages : int, optional
    in_flight : array of shape (S,), optional
        Micro-batches whose activations each stage keeps at its peak; default: from the
        settings' schedule at each stage's pipeline position.
    order : sequence of int, optional
        Stages in pipeline order (default: :meth:`Graph.stage_order`); sets the positions
        for ``in_flight``.
    contention : bool
        Price the messages with link contention (module docstring) on a topology with
        physical ``links`` (no effect without). Default False: every message alone on its
        route, as the simulator's input (the simulator shares links itself).

    Complexity: O(n + m log m + S^2 + messages + S R).
    """
    graph, topology, settings = model.graph, model._topo(), model.settings
    a, k = check_assignment(graph, assignment, num_stages)
    dev, reps = stage_devices_padded(topology.num_devices, stage_devices, k)
    mask = dev >= 0
    d0 = np.where(mask, dev, 0)
    # compute, per replica's share of the micro-batch
    fm, ff, bm, bf = model.stage_work(a, k)
    speed, rate = model.device_speed[d0], model.device_rate[d0]
    share = 1.0 / reps[:, None]
    fwd = work_seconds(fm[:, None], ff[:, None], speed, rate) * share
    bwd = work_seconds(bm[:, None], bf[:, None], speed, rate) * share
    fixed_f, fixed_b = (np.bincount(a, weights=w, minlength=k) for w in model.replica_fixed)
    fwd = fwd + fixed_f[:, None] * (1.0 - share)  # dispatch, weight reads: not shared
    bwd = bwd + fixed_b[:, None] * (1.0 - share)
    # every replica accumulates all its gradients over the micro-batches
    bwd = bwd + np.bincount(a, weights=model.accumulation_seconds, minlength=k)[:, None]
    if model.recompute:
        bwd = bwd + fwd
    fwd, bwd = np.where(mask, fwd, 0.0), np.where(mask, bwd, 0.0)
    # messages
    tb, tt = stage_traffic(graph, a, k)
    msgs = _messages(tb, tt, dev, reps, topology.latency, model.inverse_bandwidth)
    if contention:
        msgs = _contended(msgs, dev, topology, model.inverse_bandwidth)
    width = dev.shape[1]
    send = np.zeros(k * width)
    recv = np.zeros(k * width)
    src = msgs.src_stage * width + msgs.src_replica
    dst = msgs.dst_stage * width + msgs.dst_replica
    np.add.at(send, src, msgs.forward_seconds)
    np.add.at(recv, dst, msgs.forward_seconds)
    np.add.at(send, dst, msgs.backward_seconds)
    np.add.at(recv, src, msgs.backward_seconds)
    # all-reduce over each stage's ring (replicas in plan order)
    params = np.bincount(a, weights=graph.param_bytes.astype(np.float64), minlength=k)
    # gradient synchronisation over each stage's replicas (the ring in plan order)
    sharded = settings.gradient_sync == "sharded"
    ar = np.zeros(k)
    gather = np.zeros(k)
    inv = model.inverse_bandwidth
    for r in np.unique(reps[(reps > 1) & (params > 0)]):  # stages with r replicas at once
        rows = np.flatnonzero((reps == r) & (params > 0))
        ring = dev[rows, :r]
        if sharded:  # reduce-scatter once; all-gather before every forward and backward
            ar[rows] = ring_collectives(topology, "reducescatter", ring, params[rows], inv)
            gather[rows] = ring_collectives(topology, "allgather", ring, params[rows], inv)
        elif settings.gradient_sync == "zero1":  # reduce-scatter, step the shard, all-gather
            ar[rows] = ring_collectives(topology, "reducescatter", ring, params[rows], inv) \
                + ring_collectives(topology, "allgather", ring, params[rows], inv)
        else:
            ar[rows] = ring_collectives(topology, "allreduce", ring, params[rows], inv)
    if sharded:  # the gathers stream on the replicas' communication, every micro-batch
        send += np.where(mask, 2.0 * gather[:, None], 0.0).reshape(-1)
        recv += np.where(mask, 2.0 * gather[:, None], 0.0).reshape(-1)
    # memory, with the micro-batches each pipeline position keeps in flight
    if order is None:
        order = pipeline_positions(graph, a, k)
    num_ranks = -(-k // settings.stages_per_rank) if k else 0
    if in_flight is None:
        pos_flight = in_flight_microbatches(
            max(k, 1), settings.microbatches, settings.schedule,
            virtual_stages=settings.virtual_stages) if k else np.zeros(0)
        flight = np.zeros(k)
        flight[list(order)] = pos_flight[:k]
    else:
        flight = np.asarray(in_flight, dtype=np.float64)
    mem = model.memory_breakdown(a, k, in_flight=flight, replicas=reps)["total"]
    cap = np.where(mask, topology.device_memory[d0], np.inf).min(axis=1)
    # each replica steps its shard (FSDP, and the distributed optimizer)
    shard = reps[:, None] if sharded or settings.gradient_sync == "zero1" else 1
    membw = topology.device_memory_bandwidth[d0]
    opt = optimizer_seconds(params[:, None] / shard, model.optimizer, rate, membw,
                            model.compute_precision)
    measured = optimizer_seconds_per_byte(topology, model.optimizer)  # topology measure's
    if measured.any():  # every replica steps each of its stage's tensors (or their shards)
        per_byte = measured[d0]
        per_tensor = optimizer_seconds_per_tensor(topology, model.optimizer)[d0]
        tensors = np.bincount(a, weights=model.param_tensors, minlength=k)
        opt = np.where(per_byte > 0, params[:, None] / shard * per_byte
                       + tensors[:, None] * per_tensor, opt)
    opt = np.where(mask, opt, 0.0)
    return StageTimes(
        devices=dev, replicas=reps, forward=fwd, backward=bwd,
        send=send.reshape(k, width), recv=recv.reshape(k, width), allreduce=ar,
        optimizer=opt, memory=mem, capacity=cap, in_flight=flight, traffic_bytes=tb,
        traffic_tensors=tt, param_bytes=params, messages=msgs,
        microbatches=int(settings.microbatches), num_ranks=int(num_ranks))


def pipeline_positions(graph: Any, assignment: np.ndarray, k: int) -> tuple[int, ...]:
    """The stages in pipeline order (:meth:`Graph.stage_order`), or in plan order when the
    stage graph has a cycle (a sharding plan, which no pipeline runs: its memory is then
    priced as if its stages ran in plan order)."""
    try:
        return graph.stage_order(assignment, k)
    except ShardplanError:
        return tuple(range(k))


def _messages(tb: np.ndarray, tt: np.ndarray, dev: np.ndarray, reps: np.ndarray,
              latency: np.ndarray, inv: np.ndarray) -> Messages:
    a_idx, b_idx = np.nonzero(tb > 0)
    parts: list[tuple[np.ndarray, ...]] = []
    for a, b in zip(a_idx.tolist(), b_idx.tolist(), strict=True):
        i, j, frac = replica_pairs(int(reps[a]), int(reps[b]))
        n = i.size
        parts.append((np.full(n, a), np.full(n, b), i, j, tb[a, b] * frac,
                      np.full(n, tt[a, b])))
    if not parts:
        e = np.zeros(0, dtype=np.int64)
        z = np.zeros(0)
        return Messages(e, e, e, e, z, z, z, z)
    sa, sb, ri, rj, nb, tn = (np.concatenate(c) for c in zip(*parts, strict=True))
    x, y = dev[sa, ri], dev[sb, rj]
    lat_xy = np.where(x != y, latency[x, y], 0.0)
    lat_yx = np.where(x != y, latency[y, x], 0.0)
    fwd = message_seconds(tn, lat_xy, nb, inv[x, y])
    bwd = message_seconds(tn, lat_yx, nb, inv[y, x])
    return Messages(sa.astype(np.int64), sb.astype(np.int64), ri, rj, nb, tn, fwd, bwd)


def _contended(msgs: Messages, dev: np.ndarray, topology: Any, inv: np.ndarray) -> Messages:
    """``msgs`` with the seconds of link contention (module docstring): every forward and
    backward message of the micro-batch streams at once; messages between one pair of
    devices form one transfer. O(messages H log(messages H))."""
    table = link_table(topology)
    if table is None or msgs.nbytes.size == 0:
        return msgs
    x = dev[msgs.src_stage, msgs.src_replica]
    y = dev[msgs.dst_stage, msgs.dst_replica]
    n = topology.num_devices
    src = np.concatenate([x, y])  # forward messages x -> y, then their gradients y -> x
    dst = np.concatenate([y, x])
    nb = np.concatenate([msgs.nbytes, msgs.nbytes])
    real = (src != dst) & (nb > 0)
    pair, at = np.unique(np.where(real, src * n + dst, -1), return_inverse=True)
    total = np.bincount(at, weights=np.where(real, nb, 0.0))
    ps, pd = pair // n, pair % n
    keep = pair >= 0
    tau = np.zeros(pair.size)
    base = np.zeros(pair.size)
    with np.errstate(invalid="ignore"):
        base[keep] = total[keep] * inv[ps[keep], pd[keep]]
    paths = route_links(table, ps[keep], pd[keep])
    tau[keep] = np.maximum(base[keep], link_contention(paths, table.inv_bandwidth, ps[keep],
                                                       total[keep]))
    with np.errstate(invalid="ignore", divide="ignore"):
        extra = np.where(keep & (total > 0), (tau - base) / np.where(total > 0, total, 1.0),
                         0.0)
    extra = np.where(np.isnan(extra), 0.0, extra)  # no route: already infinite
    add = np.where(real, nb * extra[at], 0.0)
    m = msgs.nbytes.size
    return Messages(msgs.src_stage, msgs.dst_stage, msgs.src_replica, msgs.dst_replica,
                    msgs.nbytes, msgs.tensors, msgs.forward_seconds + add[:m],
                    msgs.backward_seconds + add[m:])
