"""The discrete-event simulator of one training iteration of a plan.

Tasks, messages and the network are modelled as follows (Parmesan section 3 mentions its
task-graph simulator and leaves it to appendix H, which our copy lacks; everything below is
what we decided). Every number comes from the one stage-time model,
:func:`shardplan.cost.stage_times`, with the plan's execution settings, so a plan's
objective, ``shardplan cost`` and the simulator price the same compute and the same messages:

- **Pipeline.** :class:`~shardplan.simulate.PipelineView`: the stages in pipeline order, the
  schedule's per-rank action lists, the devices of every rank.
- **Compute.** Every device runs its rank's schedule actions in order, one at a time (a
  blocked head action blocks the device, as torch's pipelining runtime does). Forward and
  backward seconds are the model's per replica: the replica's share of the micro-batch on
  its device; recomputation adds the forward to the backward. A split backward (the
  zero-bubble schedules' ``I`` and ``W``) divides the backward by one rule, ours (the cost
  model prices a backward as one sum): the weight gradient ``W`` of a stage costs the
  forward FLOPs of its nodes that hold parameters (a layer's weight gradient is one product
  of its forward's size), at most the whole backward; the input gradient ``I`` is the rest,
  recomputation included. The previous stage's gradient leaves after ``I``; the
  activations are held until ``W``. ``OVERLAP_F_B`` runs its forward then its backward.
- **Fixed costs.** What ``topology measure`` recorded per device
  (:mod:`shardplan.cost._overheads`; none on other topologies): per-action overhead of the
  pipeline runtime, per-unit FSDP all-gather overhead and the gradient handling before the
  step are added to the stage times, DTensor per-operator overhead to strategy stages, and
  every compute is multiplied by the slowdown of as many ranks computing at once as the
  plan has devices.
- **Messages.** After the forward of (stage a, replica i, micro-batch m), every message of
  the model from (a, i) leaves (its bytes, one latency per tensor, sent back to back);
  gradients of the same size go back after the backward of the receiver. The forward of a
  replica waits for every message addressed to it, the backward for every gradient. Stages
  joined only by zero-byte edges still wait for each other (free messages). Messages
  between stages on one device are free. A message between pipeline neighbours starts only
  once its receiver has posted the receive, where torch's pipelining runtime posts it
  (:func:`recv_positions`: after the compute actions that precede the receive in the
  lowered schedule); gloo's and NCCL's point-to-point transfers need both ends.
- **Network.** A device sends one message at a time (FIFO). With the settings' ``overlap``
  (default) it computes meanwhile (a separate communication stream), at full speed unless
  its topology entry says what a transfer takes from its compute (``comm_cpu_share``,
  measured by ``topology measure``: gloo's transfers run on the same CPU cores as the
  computation): then of the time a message is in flight while an end computes, that
  share is added to the end's next computation (its next forward, backward segment or
  optimizer step), at both ends of every message, measured collectives and ring steps
  included (the closed-form ring steps, below, run while no worker there computes). Without
  overlap a message starts only when neither end is computing and neither end starts
  computing while one of its messages is in flight or waiting (a device computes or
  communicates, never both). A
  message waits its latency, then streams its bytes over the routed path
  (:func:`shardplan.topology.routes_of`, physical ``links`` when the topology has them, else
  one direct link per pair); concurrent messages share every link on their paths max-min
  fairly (progressive filling). Alone on its path a message takes exactly the model's
  ``latency + bytes / bandwidth``.
- **All-reduce.** When all replicas of a stage have passed its ``REDUCE_GRAD`` action (after
  its last backward), its gradients are ring all-reduced: ``2 (R - 1)`` steps, each every
  replica sending ``P / R`` bytes to the next on the ring (the plan's device order) through
  the same send queues and links, the next step starting when the whole step has arrived.
  Uncontended this is the model's all-reduce. The device keeps computing meanwhile. From a
  step on which nothing else can touch the ring's devices and links (direct links, idle
  queues, every worker there finished), the remaining steps are computed in closed form
  (:mod:`shardplan.simulate._ring`), the same result as stepping them.
- **Optimizer step.** A device steps once its actions are done and the all-reduces of its
  stages are over, for the model's optimizer seconds.
- **Distributed optimizer** (``gradient_sync="zero1"``). The all-reduce is a ring
  reduce-scatter (``R - 1`` steps); each replica steps its ``1/R`` of the master weights
  (the model's optimizer seconds over its shard), then the stage's parameters are ring
  all-gathered (``R - 1`` steps); the device's iteration ends when that gather has.
- **Memory.** A device holds its stages' parameters, gradients, optimizer state and extra
  memory throughout, plus one micro-batch's activations per (stage, micro-batch) from the
  start of its forward to the end of its backward, and during its optimizer step the step's
  temporaries (the largest of its stages'): the terms of
  :func:`~shardplan.cost.partition_memory_breakdown`, so the peak is the model's memory with
  the schedule's micro-batches in flight.

Complexity: O(E log E) for E events while no link carries two messages at once (a message's
finish time is known when it starts), plus O(C I F h) for C changes of the set of streaming
messages while links are shared (rates recomputed once per time step), I progressive-filling
rounds, F concurrent messages and h hops per path.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from shardplan.cost import CostModel, _overheads, stage_times
from shardplan.cost._pipeline import replica_pairs
from shardplan.errors import ShardplanError, TimeLimitError
from shardplan.ir import ExecutionSettings, Graph, Plan, Topology
from shardplan.ir.schedule import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    REDUCE_GRAD,
    Schedule,
)
from shardplan.simulate._collectives import _Collectives, _sync_chunks
from shardplan.simulate._messages import _Worker, recv_positions
from shardplan.simulate._network import _Message, _Network
from shardplan.simulate._pipeline import PipelineView
from shardplan.simulate._strategy_stages import _strategy_engine_inputs, _strategy_stage_times
from shardplan.simulate.result import Interval, SimulationResult
from shardplan.topology import routes_of
from shardplan.topology._routing import GridRoutes

__all__ = ["simulate"]


class _Sim(_Collectives):
    """One simulation: its state, the event loop and the compute of every worker; the
    messages and the collectives are its parts :class:`~shardplan.simulate._messages.
    _Messages` and :class:`~shardplan.simulate._collectives._Collectives`."""

    def __init__(self, view: PipelineView, st: Any, static_mem: np.ndarray,
                 per_mb: np.ndarray, topology: Topology, overlap: bool, sync: str = "end",
                 buckets: Any = None, units: Any = None,
                 weight_share: np.ndarray | None = None,
                 step_memory: np.ndarray | None = None) -> None:
        self.t = 0.0
        self.heap: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = 0
        self.intervals: list[Interval] = []
        self.schedule = sch = view.schedule
        self.overlap = overlap
        k = view.num_stages
        self.dev, self.reps = st.devices, st.replicas
        self.fwd, self.bwd = st.forward, st.backward
        share = np.zeros(k) if weight_share is None else np.asarray(weight_share, float)
        self.wgt = self.bwd * share[:, None]  # the W part of a split backward
        # messages: the model's, plus free ones where stages are joined by zero-byte edges
        self.out_msgs: dict[tuple[int, int], list[tuple[int, int, float, float]]] = {}
        self.in_msgs: dict[tuple[int, int], list[tuple[int, int, float, float]]] = {}
        m = st.messages
        rows = list(zip(m.src_stage.tolist(), m.src_replica.tolist(), m.dst_stage.tolist(),
                        m.dst_replica.tolist(), m.nbytes.tolist(), m.tensors.tolist(),
                        strict=True))
        for a, b in zip(*np.nonzero(view.adjacency & (st.traffic_bytes <= 0)), strict=True):
            ii, jj, _ = replica_pairs(int(self.reps[a]), int(self.reps[b]))
            rows += [(int(a), int(i), int(b), int(j), 0.0, 0.0)
                     for i, j in zip(ii.tolist(), jj.tolist(), strict=True)]
        for a, i, b, j, nb, tn in rows:
            self.out_msgs.setdefault((a, i), []).append((b, j, nb, tn))
            self.in_msgs.setdefault((b, j), []).append((a, i, nb, tn))
        # memory
        self.per_mb = per_mb
        self.devices = tuple(sorted({int(d) for d in self.dev[self.dev >= 0]}))
        self.mem_now = {d: 0.0 for d in self.devices}
        self.opt_seconds = {d: 0.0 for d in self.devices}
        for s in range(k):
            for i in range(int(self.reps[s])):
                d = int(self.dev[s, i])
                self.mem_now[d] += float(static_mem[s])
                self.opt_seconds[d] += float(st.optimizer[s, i])
        self.step_mem = {d: 0.0 for d in self.devices}  # the optimizer step's temporaries
        if step_memory is not None:
            for s in range(k):
                for i in range(int(self.reps[s])):
                    d = int(self.dev[s, i])
                    self.step_mem[d] = max(self.step_mem[d], float(step_memory[s]))
        self.mem_peak = dict(self.mem_now)
        self.mem_line = {d: [(0.0, self.mem_now[d])] for d in self.devices}
        self.grad_bytes = st.param_bytes
        # network
        self.topology = topology
        self.routes = routes_of(topology)
        self._link_ids: dict[tuple[int, int], int] = {}
        best: dict[tuple[int, int], tuple[float, float]] = {}
        for lk in topology.links:
            key = (int(lk.src), int(lk.dst))
            if key not in best or (lk.latency, -lk.bandwidth) < best[key]:
                best[key] = (lk.latency, -lk.bandwidth)
        self._link_bw = {key: -v[1] for key, v in best.items()}
        self.net = _Network([])
        self._paths: dict[tuple[int, int], tuple[int, ...]] = {}
        self._latency: dict[tuple[int, int], float] = {}
        self._ring_disjoint: dict[int, bool] = {}
        self.send_q: dict[int, deque[_Message]] = {d: deque() for d in self.devices}
        self.sending: dict[int, bool] = {d: False for d in self.devices}
        self.computing: dict[int, bool] = {d: False for d in self.devices}
        self.pending: dict[int, int] = {d: 0 for d in self.devices}
        # what messages in flight take from their ends' compute (comm_cpu_share)
        cpu = _overheads.comm_cpu_share(topology)
        self.cpu_share = {d: float(cpu[d]) for d in self.devices}
        self.debt = {d: 0.0 for d in self.devices}
        self.busy_n = {d: 0 for d in self.devices}  # computations running
        self.busy_acc = {d: 0.0 for d in self.devices}  # compute seconds so far
        self.busy_since = {d: 0.0 for d in self.devices}
        # workers and bookkeeping
        self.workers = [
            _Worker(p, i, int(view.rank_devices[p][i]),
                    tuple(leaf for a in sch.ranks[p] for leaf in a.leaves()),
                    stages=tuple(s for s in range(k) if sch.stage_rank[s] == p))
            for p in range(sch.num_ranks) for i in range(len(view.rank_devices[p]))]
        self.worker_of = {(w.rank, w.replica): w for w in self.workers}
        self.recv_at = recv_positions(sch)
        self.held_from: dict[int, int] = {}  # messages per sender waiting for a receive
        self.workers_on: dict[int, list[_Worker]] = {d: [] for d in self.devices}
        for w in self.workers:
            self.workers_on.setdefault(w.device, []).append(w)
        self.arrived: dict[tuple[str, int, int, int], int] = {}
        self.ar_ready = [0] * k
        self.ar_start = [math.nan] * k
        self.ar_done = [math.nan] * k
        self.last_backward = 0.0
        self.finish: dict[int, float] = {}
        # gradient synchronisation: DDP buckets or FSDP units per stage, collectives
        self.sync = sync
        self.buckets = buckets or [[] for _ in range(k)]
        self.units_fwd: list[Any]
        self.units_bwd: list[Any]
        units = units or ([[] for _ in range(k)], [[] for _ in range(k)])
        self.units_fwd, self.units_bwd = units[0], units[1]
        # per stage, the root's parameter bytes FSDP2 reduces when the backward ends
        self.units_root = list(units[2]) if len(units) > 2 else [0.0] * k
        self.grad_left = [len(self.buckets[s]) if sync == "bucketed" else
                          len(self.units_bwd[s]) + (self.units_root[s] > 0)
                          if sync == "sharded" else 0
                          for s in range(k)]
        # devices whose FSDP collectives block their computing (a CPU: host_collectives)
        host = _overheads.host_collectives(topology)
        self.blocking = {d: bool(host[d]) for d in self.devices}
        self.coll_queue: list[deque[Any]] = [deque() for _ in range(k)]
        self.coll_running = [False] * k
        self.coll_issued: dict[tuple[Any, ...], int] = {}
        self.coll_done: set[tuple[Any, ...]] = set()
        self.waiters: dict[tuple[Any, ...], list[Callable[[], None]]] = {}
        # closed-form rings (:mod:`._ring`): links only their sender uses, stages per device
        self.direct_links = not topology.links and not isinstance(self.routes, GridRoutes)
        self.stages_on: dict[int, list[int]] = {d: [] for d in self.devices}
        for s in range(k):
            for d in self.dev[s, :int(self.reps[s])].tolist():
                self.stages_on.setdefault(int(d), []).append(s)
        self.timeline = True  # keep every message's interval (closed-form rings too)

    # ------------------------------------------------------------------ events
    def at(self, time: float, fn: Callable[[], None]) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (time, self.seq, fn))

    def run(self, deadline: float | None = None) -> None:
        """Run every event. ``deadline`` (a ``time.monotonic()`` reading): raise
        :class:`~shardplan.errors.TimeLimitError` once it has passed (checked at the first
        event and every 4096 after it)."""
        for w in self.workers:
            self.advance(w)
        net = self.net
        events = 0
        while self.heap or net.flows:
            events += 1
            if deadline is not None and events & 4095 == 1 and time.monotonic() > deadline:
                raise TimeLimitError("the simulation ran past its deadline")
            net.refresh(self.t)
            t_heap = self.heap[0][0] if self.heap else math.inf
            t_net = net.next_time()
            if net.flows and t_net <= t_heap:
                self.t = max(self.t, t_net)
                for f in net.pop_done(self.t):
                    self.delivered(f)
            else:
                self.t, _, fn = heapq.heappop(self.heap)
                fn()
        stuck = [w for w in self.workers if not w.done]
        if stuck:
            w = stuck[0]
            act = w.actions[w.pos] if w.pos < len(w.actions) else "the optimizer step"
            raise ShardplanError(f"the schedule deadlocks: rank {w.rank} replica {w.replica} "
                                 f"waits forever at {act} ({w.waiting or 'all-reduce'})")

    # ------------------------------------------------------------------ compute
    def ready(self, w: _Worker, act: Any) -> bool:
        key = (act.stage, w.replica)
        if act.op == BACKWARD_WEIGHT:  # after its I on this rank: needs nothing more
            return True
        kind = FORWARD if act.op == FORWARD else BACKWARD
        if act.op == FORWARD:
            need = len(self.in_msgs.get(key, ()))
        else:
            need = len(self.out_msgs.get(key, ()))
        have = self.arrived.get((kind, act.stage, w.replica, act.microbatch), 0)
        w.waiting = f"{have} of {need} messages arrived"
        return have >= need

    def advance(self, w: _Worker) -> None:
        while not w.busy and not w.done:
            if w.pos == len(w.actions):
                if all(not math.isnan(self.ar_done[s]) for s in w.stages):
                    self.optimizer(w)
                return
            act = w.actions[w.pos]
            if act.op == REDUCE_GRAD:
                w.pos += 1
                self.reduce_ready(act.stage)
                continue
            if not self.ready(w, act):
                return
            if not self.overlap and self.pending[w.device]:
                w.waiting = "its messages to go first (no overlap)"
                return
            w.pos += 1
            s, i = act.stage, w.replica
            dur = float(self.fwd[s, i] if act.op == FORWARD else self.bwd[s, i]
                        if act.op == BACKWARD else self.wgt[s, i]
                        if act.op == BACKWARD_WEIGHT else self.bwd[s, i] - self.wgt[s, i])
            w.busy = True
            if act.op == FORWARD:
                self.memory(w.device, float(self.per_mb[s]))
            self.run_action(w, act, dur)

    def run_action(self, w: _Worker, act: Any, dur: float) -> None:
        """Compute ``act`` for ``dur`` seconds: in one piece, or in the segments of the
        stage's gradient synchronisation (DDP buckets launched during the last backward;
        FSDP units, each waiting for its parameters' all-gather, the next unit's gathered
        meanwhile, and reducing its gradients after the last backward, the root's when the
        backward ends; where the device's collectives block its computing
        (:func:`~shardplan.cost._overheads.host_collectives`: a CPU), FSDP's gathers and
        reductions are waited for where they are issued, nothing prefetched)."""
        s, m = act.stage, act.microbatch
        last = m == self.schedule.num_microbatches - 1
        # (end fraction of the action, collective to wait for, collectives to launch after)
        segments: list[tuple[float, Any, tuple[Any, ...]]] = [(1.0, None, ())]
        grads = act.op in (BACKWARD, BACKWARD_WEIGHT)  # the action producing weight grads
        blocking = False
        if self.sync == "bucketed" and grads and last and self.reps[s] > 1:
            segments = [(f, None, (("allreduce", s, "grad", k, b),))
                        for k, (b, f) in enumerate(self.buckets[s])] + [(1.0, None, ())]
        elif self.sync == "sharded" and self.reps[s] > 1 and self.units_fwd[s]:
            blocking = self.blocking[w.device]
            units = self.units_fwd[s] if act.op == FORWARD else self.units_bwd[s]
            phase = "fwd" if act.op == FORWARD else "bwd"
            segments = []
            reduce = act.op == BACKWARD and last
            for u, (b, f_end) in enumerate(units):
                key = ("allgather", s, (phase, m), u, b)
                after = (("reducescatter", s, "grad", u, b),) if reduce else ()
                segments.append((f_end, key, after))
            if reduce and self.units_root[s] > 0:
                f_end, key, after = segments[-1]
                segments[-1] = (f_end, key, after + (
                    ("reducescatter", s, "grad", len(units), float(self.units_root[s])),))
        start = self.t
        issued: set[int] = set()

        def gather(j: int) -> None:  # this replica asks for unit j's parameters, once
            if j < len(segments) and segments[j][1] is not None and j not in issued:
                issued.add(j)
                self.issue(segments[j][1])

        def idle(key: Any, what: str, then: Callable[[], None]) -> None:
            """The worker waits for collective ``key``, computing nothing."""
            self.waiters.setdefault(key[:4], []).append(then)
            w.waiting = what
            self.computing[w.device] = False
            if not self.overlap:  # the device is idle: its held messages may go
                self.retry_sends()

        def segment(j: int, prev: float) -> None:
            if j == len(segments):
                return done()
            f_end, wait, after = segments[j]
            if wait is not None:
                gather(j)
                if not blocking:
                    gather(j + 1)  # prefetch the next unit while this one computes
                if not self.collective_done(wait):
                    idle(wait, f"the parameters of unit {wait[3]} (all-gather)",
                         lambda: segment(j, prev))
                    return
            self.computing[w.device] = True
            self.busy(w.device, 1)

            def end() -> None:
                self.busy(w.device, -1)
                for key in after:
                    self.issue(key)
                reduced(list(after) if blocking else [], lambda: segment(j + 1, f_end))

            def reduced(keys: list[Any], then: Callable[[], None]) -> None:
                while keys and self.collective_done(keys[0]):
                    keys.pop(0)
                if not keys:
                    return then()
                idle(keys[0], f"the gradients of unit {keys[0][3]} (reduce-scatter)",
                     lambda: reduced(keys, then))

            self.at(self.t + dur * max(f_end - prev, 0.0) + self.take_debt(w.device), end)

        def done() -> None:
            w.busy = False
            self.computing[w.device] = False
            self.intervals.append(Interval(w.device, start, self.t, act.op, act.stage,
                                           act.microbatch))
            w.completed += 1
            self.post_receives(w)
            if act.op == FORWARD:
                self.sent_forward(act.stage, w.replica, act.microbatch)
            else:
                if act.op != BACKWARD_INPUT:  # activations are held until the W
                    self.memory(w.device, -float(self.per_mb[act.stage]))
                self.last_backward = max(self.last_backward, self.t)
                if act.op != BACKWARD_WEIGHT:  # the previous stage's gradient leaves
                    self.sent_backward(act.stage, w.replica, act.microbatch)
            if not self.overlap:
                self.retry_sends()
            self.advance(w)

        segment(0, 0.0)

    def optimizer(self, w: _Worker) -> None:
        w.busy = True
        start = self.t
        self.memory(w.device, self.step_mem[w.device])
        self.busy(w.device, 1)

        def finish() -> None:
            self.busy(w.device, -1)
            self.memory(w.device, -self.step_mem[w.device])
            w.busy = False
            self.intervals.append(Interval(w.device, start, self.t, "OPT", min(w.stages)))
            # the distributed optimizer (zero1): the updated parameter shards are
            # all-gathered after the step; the iteration ends on this device when they are
            gathers = [s for s in w.stages if self.sync == "zero1" and self.reps[s] > 1
                       and self.grad_bytes[s] > 0]
            left = [len(gathers)]

            def gathered() -> None:
                left[0] -= 1
                if left[0] <= 0:
                    w.done = True
                    self.finish[w.device] = self.t

            if not gathers:
                gathered()
            for s in gathers:
                key = ("allgather", s, "param", 0, float(self.grad_bytes[s]))
                self.waiters.setdefault(key[:4], []).append(gathered)
                self.issue(key)

        self.at(self.t + self.opt_seconds[w.device] + self.take_debt(w.device), finish)

    def busy(self, device: int, delta: int) -> None:
        """A computation starts (+1) or ends (-1) on ``device``: its compute seconds."""
        if self.busy_n[device] > 0:
            self.busy_acc[device] += self.t - self.busy_since[device]
        self.busy_since[device] = self.t
        self.busy_n[device] += delta

    def busy_seconds(self, device: int) -> float:
        """Seconds ``device`` has computed so far (a running computation counted to now)."""
        run = self.t - self.busy_since[device] if self.busy_n[device] > 0 else 0.0
        return self.busy_acc[device] + run

    def take_debt(self, device: int) -> float:
        """The compute seconds messages took from ``device`` since its last computation
        started, charged to the one starting now (what messages take from a device's last
        computation of the iteration, its optimizer step, is not charged: none follows)."""
        owed, self.debt[device] = self.debt[device], 0.0
        return owed

    def memory(self, device: int, delta: float) -> None:
        self.mem_now[device] += delta
        self.mem_peak[device] = max(self.mem_peak[device], self.mem_now[device])
        self.mem_line[device].append((self.t, self.mem_now[device]))


_LEGACY = {"num_microbatches": "microbatches"}


def weight_share(graph: Graph, assignment: np.ndarray, num_stages: int, *,
                 recompute: bool = False) -> np.ndarray:
    """Per stage, the fraction of its backward seconds its weight-gradient (``W``) action
    takes when a schedule splits the backward: the forward FLOPs of the stage's nodes that
    hold parameters over its backward FLOPs (recomputation's forward added), at most 1.
    0 for a stage without backward work. O(n)."""
    fwd = np.asarray(graph.fwd_flops, dtype=np.float64)
    bwd = np.asarray(graph.bwd_flops, dtype=np.float64)
    has = np.asarray(graph.param_bytes) > 0
    a = np.asarray(assignment, dtype=np.int64)
    w = np.bincount(a, weights=np.where(has, fwd, 0.0), minlength=num_stages)
    b = np.bincount(a, weights=bwd + (fwd if recompute else 0.0), minlength=num_stages)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(b > 0, np.minimum(w / b, 1.0), 0.0)
    return np.nan_to_num(out)


def simulate(plan: Plan, graph: Graph, topology: Topology,
             settings: ExecutionSettings | None = None, *,
             schedule: str | Schedule | None = None, timeline: bool = True,
             deadline: float | None = None, **overrides: Any) -> SimulationResult:
    """Simulate one training iteration of ``plan`` (see the module docstring for the model).

    Parameters
    ----------
    plan, graph, topology
        Stages may have different replica counts.
    settings : ExecutionSettings, optional
        How the iteration runs; default: the plan's own (:attr:`Plan.settings`).
    schedule : str or Schedule, optional
        A schedule name (overrides the settings' ``schedule``), or a schedule of the plan's
        number of stages (pipeline positions in the order of :func:`stage_order`; its
        micro-batch count is used). ``interleaved-1f1b`` runs the S stages on the devices
        of the first ``S / virtual_stages`` pipeline positions, stage s on those of position
        ``s mod (S / v)`` (the looping placement of Narayanan et al. 2021); the other
        stages' devices stay idle.
    timeline : bool
        Keep the intervals and memory timeline in the result.
    deadline : float, optional
        A ``time.monotonic()`` reading: past it the simulation stops with
        :class:`~shardplan.errors.TimeLimitError` (a search's time limit; a run of a
        thousand-replica ring all-reduce over routed links takes minutes).
    **overrides
        Any :class:`~shardplan.ir.ExecutionSettings` field (``microbatches``,
        ``recompute``, ``optimizer``, ``efficiency``, ``overlap``, ...; ``num_microbatches``
        is accepted for ``microbatches``), overriding ``settings``.

    Returns
    -------
    SimulationResult

    Raises
    ------
    ShardplanError
        A cyclic stage graph, a schedule that does not fit the plan or deadlocks, an
        unreachable device pair, a bad setting.

    Examples
    --------
    >>> from shardplan.ir import Device, Graph, Objective, Plan, Stage, Topology
    >>> g = Graph.from_arrays(name="g", fwd_flops=[1e12, 1e12], src=[0], dst=[1])
    >>> t = Topology(name="t", devices=(Device("a", 1e12, 1e12), Device("b", 1e12, 1e12)),
    ...              bandwidth=[[0, 1e9], [1e9, 0]], latency=[[0, 0], [0, 0]])
    >>> p = Plan("g", "t", "hand", (Stage((0,), (0,)), Stage((1,), (1,))), Objective("x", 0))
    >>> r = simulate(p, g, t, schedule="gpipe", microbatches=3, optimizer="sgd")
    >>> round(r.iteration_seconds, 6), round(r.bubble_fraction, 4)  # (3 + 2 - 1) * (1 + 2)
    (12.0, 0.25)
    """
    plan.validate(graph, topology)
    settings = plan.settings if settings is None else settings
    changes = {_LEGACY.get(k, k): v for k, v in overrides.items()}
    given: Schedule | None = None
    if isinstance(schedule, Schedule):
        given = schedule
        changes["microbatches"] = schedule.num_microbatches
    elif schedule is not None:
        changes["schedule"] = schedule
    settings, _ = settings.override(**changes)
    settings = settings.resolve(graph)
    if plan.parallel is not None:  # the LLM plan kind: one simulation per pipeline rank
        from shardplan.simulate._llm import simulate_llm

        return simulate_llm(plan, graph, topology, settings, timeline=timeline)
    used = sorted({int(d) for stg in plan.stages for d in stg.devices})
    strat: dict[str, Any] | None = None
    if plan.strategy is not None:  # stages are device groups running PaSE configurations
        strat = _strategy_engine_inputs(plan, graph, topology, settings)
        plan = dataclasses.replace(plan, strategy=None)
    view = PipelineView.build(plan, graph, settings, schedule=given)
    sch, order = view.schedule, view.order
    k = plan.num_stages
    pos = np.empty(k, dtype=np.int64)
    pos[list(order)] = np.arange(k)
    a_pos = pos[plan.assignment(graph.num_nodes)]
    devices = [view.stage_devices(p) for p in range(k)]
    cm = CostModel.from_settings(graph, topology, settings)
    mem_cm, mem_reps = cm, None
    if strat is not None:  # each device holds its part of the parameters and outputs
        mem_cm = dataclasses.replace(cm, graph=strat["held"])
        cm = CostModel.from_settings(strat["sync"], topology, settings)
    st = stage_times(mem_cm, a_pos, devices, num_stages=k, order=range(k),
                     in_flight=sch.in_flight())
    reps = st.replicas
    if strat is None:
        mem_reps = reps
    else:  # a group's devices run its stage together, each in the group's time
        st = _strategy_stage_times(st, strat, cm, a_pos, k, order, topology)
    # total = base + max(activations, step temporaries): the device holds base + the
    # activations (any recomputation buffer, ``acts0``, plus each micro-batch's) and, during
    # its optimizer step, what the temporaries exceed that buffer by
    mem_kw = {} if mem_reps is None else {"replicas": mem_reps}
    empty = mem_cm.memory_breakdown(a_pos, k, in_flight=0, **mem_kw)
    acts0, temp = empty["activations"], empty["step_temporary"]
    static = empty["total"] - np.maximum(acts0, temp) + acts0
    per_mb = mem_cm.memory_breakdown(a_pos, k, in_flight=1, **mem_kw)["activations"] - acts0
    step_extra = np.maximum(temp - acts0, 0.0)
    buckets, units = _sync_chunks(cm, a_pos, k, settings)
    # measured fixed costs (0 and 1 on topologies without them): busy ranks, FSDP gathers,
    # gradient handling, the pipeline runtime's actions (not under DDP, FSDP, strategies)
    layers = np.bincount(a_pos, weights=(graph.param_bytes > 0).astype(np.float64),
                         minlength=k)
    st = _overheads.charge_run_overheads(st, topology, settings.gradient_sync, used, units,
                                         pipelined=k > 1 or (strat is None and
                                                             settings.gradient_sync == "end"),
                                         dtensor_layers=layers,
                                         dtensor_stages=np.full(k, strat is not None))
    share = None
    if sch.split_backward:
        if settings.gradient_sync == "sharded":
            raise ShardplanError("a schedule with split backwards (I/W) runs with gradient "
                                 "sync 'end' or 'bucketed', not 'sharded'")
        share = weight_share(graph, a_pos, k, recompute=settings.recompute_full)
    sim = _Sim(view, st, static, per_mb, topology, settings.overlap, settings.gradient_sync,
               buckets, units, share, step_memory=step_extra)
    sim.timeline = timeline
    sim.run(deadline)
    m = sch.num_microbatches
    devs = sim.devices
    busy = {d: 0.0 for d in devs}
    for iv in sim.intervals:
        if iv.kind in (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT):
            busy[iv.device] += iv.end - iv.start
    iteration = float(max(sim.finish.values()))
    pipeline = float(sim.last_backward)
    bubble = 1.0 - sum(busy.values()) / (len(devs) * pipeline) if pipeline > 0 else 0.0
    per_device = {d: 0.0 for d in devs}
    for s in range(k):
        for i in range(int(reps[s])):
            per_device[int(st.devices[s, i])] += float(st.forward[s, i] + st.backward[s, i])
    samples = int(settings.global_batch or m * graph.batch_size)
    intervals = tuple(sorted(sim.intervals, key=lambda iv: (iv.start, iv.device, iv.end)))
    peak = {d: float(sim.mem_peak[d]) for d in devs}
    opts = settings.to_dict()
    opts.update(num_microbatches=m, schedule=sch.name,
                virtual_stages=settings.virtual_stages if sch.name == "interleaved-1f1b"
                else 1)
    return SimulationResult(
        schedule=sch, stage_order=order, num_microbatches=m, num_replicas=int(reps.max()),
        samples_per_iteration=samples, iteration_seconds=iteration, pipeline_seconds=pipeline,
        throughput=samples / iteration if iteration > 0 else math.inf,
        bubble_fraction=float(max(0.0, bubble)), devices=devs,
        busy_seconds=tuple(float(busy[d]) for d in devs),
        peak_memory_bytes=tuple(peak[d] for d in devs),
        memory_capacity_bytes=tuple(float(topology.devices[d].memory_bytes) for d in devs),
        allreduce_seconds=tuple(float(e - b) for b, e in zip(sim.ar_start, sim.ar_done,
                                                              strict=True)),
        optimizer_seconds=float(max(sim.opt_seconds.values())),
        ideal_seconds=float(m * max(per_device.values())),
        intervals=intervals if timeline else (),
        memory_timeline=tuple(tuple(sim.mem_line[d]) for d in devs) if timeline else (),
        options=opts,
    )

