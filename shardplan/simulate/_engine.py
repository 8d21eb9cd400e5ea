"""The discrete-event simulator of one training iteration of a pipeline plan.

Tasks, messages and the network are modelled as follows (Parmesan section 3 mentions its
task-graph simulator and leaves it to appendix H, which our copy lacks; everything below is
what we decided):

- **Compute.** Every device runs its rank's schedule actions in order, one at a time (a
  blocked head action blocks the device, as torch's pipelining runtime does). Forward and
  backward seconds come from the shared :class:`~shardplan.cost.CostModel` on the device
  that runs them, divided by the R replicas of the stage (each replica runs ``1/R`` of every
  micro-batch, as in the cost model's equation 3); recomputation adds the forward to the
  backward. So a pipeline of free transfers gives exactly the cost model's stage times.
- **Messages.** After the forward of (stage a, micro-batch m), replica i sends to replica i
  of every stage b that reads a's outputs one message of ``B[a, b] / R`` bytes (the cost
  model's :func:`~shardplan.cost.stage_traffic`), paying ``T[a, b]`` latencies (one per
  distinct tensor, sent back to back). Gradients of the same size go back after the
  backward of b. The forward of b waits for every input message, the backward of a for every
  gradient. Messages between stages on one device are free.
- **Network.** A device sends one message at a time (FIFO) but computes meanwhile (a
  separate communication stream). A message waits its latency, then streams its bytes over
  the routed path (:func:`shardplan.topology.routes_of`, physical ``links`` when the
  topology has them, else one direct link per pair); concurrent messages share every link
  on their paths max-min fairly (progressive filling). Alone on its path a message takes
  exactly ``latency + bytes / bandwidth``, the cost model's transfer time.
- **All-reduce.** When all R replicas of a stage have passed its ``REDUCE_GRAD`` action (after
  its last backward), its gradients (the stage's ``param_bytes``) are ring all-reduced:
  ``2 (R - 1)`` steps, each every replica sending ``P / R`` bytes to the next on the ring
  (the plan's device order) through the same send queues and links, the next step starting
  when the whole step has arrived. Uncontended this is exactly
  :func:`~shardplan.cost.allreduce_seconds`. The device keeps computing meanwhile.
- **Optimizer step.** A device steps once its actions are done and the all-reduces of its
  stages are over: ``OPTIMIZER_FLOPS[optimizer]`` FLOPs per parameter (our estimate of the
  elementwise update: 2 for SGD, 4 with momentum, 12 for Adam) at the device's rate.
- **Memory.** A device holds its stages' parameters, gradients, optimizer state and extra
  memory throughout, plus one micro-batch's activations per (stage, micro-batch) from the
  start of its forward to the end of its backward: the terms of
  :func:`~shardplan.cost.partition_memory_breakdown` (its activations are linear in the
  micro-batches in flight), so the peak under 1F1B is the cost model's
  :func:`~shardplan.cost.in_flight_microbatches` figure.

Complexity: O(E log E + C I F h) for E events, C changes of the set of streaming messages
(rates are recomputed once per time step at which messages start or end), I progressive-
filling rounds (distinct bottleneck shares), F concurrent messages (at most one per device)
and h hops per path. A 16-device iteration of ResNet-152 takes tens of milliseconds; 512
devices of a 3-D torus with 32-replica all-reduces about 6 s.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardplan.cost import CostModel, plan_arrays, stage_traffic
from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, Plan, Topology
from shardplan.simulate._pipeline import PipelineView
from shardplan.simulate.result import Interval, SimulationResult
from shardplan.simulate.schedule import BACKWARD, FORWARD, REDUCE_GRAD, Schedule
from shardplan.topology import routes_of

__all__ = ["OPTIMIZER_FLOPS", "simulate"]

OPTIMIZER_FLOPS = {"sgd": 2.0, "sgd-momentum": 4.0, "momentum": 4.0, "adam": 12.0,
                   "adamw": 14.0}
_PARAM_BYTES = 4.0  # bytes per parameter when counting the optimizer's parameters


@dataclass
class _Message:
    src: int
    dst: int
    nbytes: float
    latency: float
    kind: str
    stage: int
    microbatch: int | None
    on_arrival: Callable[[], None]
    links: tuple[int, ...] = ()
    remaining: float = 0.0
    rate: float = 0.0
    start: float = 0.0


@dataclass
class _Worker:
    rank: int
    replica: int
    device: int
    actions: tuple[Any, ...]
    pos: int = 0
    busy: bool = False
    done: bool = False
    stages: tuple[int, ...] = ()
    waiting: str = ""


@dataclass
class _Network:
    """Messages streaming bytes over shared links: max-min fair rates (progressive filling),
    recomputed only when the set of messages changes (lazily, once per time step)."""

    capacity: list[float]
    flows: list[_Message] = field(default_factory=list)
    t_ref: float = 0.0
    dirty: bool = False
    next_time: float = math.inf

    def settle(self, t: float) -> None:
        """Advance every message's remaining bytes to time ``t`` at the current rates."""
        if t > self.t_ref:
            dt = t - self.t_ref
            for f in self.flows:
                f.remaining -= f.rate * dt
            self.t_ref = t

    def add(self, msg: _Message, t: float) -> None:
        self.settle(t)
        msg.remaining = msg.nbytes
        self.flows.append(msg)
        self.dirty = True

    def refresh(self, t: float) -> None:
        """Recompute the rates and the next completion time if messages came or went."""
        if not self.dirty:
            return
        self.settle(t)
        self.rates()
        self.next_time = min((t + max(f.remaining, 0.0) / f.rate for f in self.flows),
                             default=math.inf)
        self.dirty = False

    def pop_done(self, t: float) -> list[_Message]:
        self.settle(t)
        # done: no bytes left (to rounding), or so few that time cannot tell the difference
        done = [f for f in self.flows if f.remaining <= 1e-9 * max(f.nbytes, 1.0)
                or self.t_ref + f.remaining / f.rate <= t]
        if done:
            gone = {id(f) for f in done}
            self.flows = [f for f in self.flows if id(f) not in gone]
        self.dirty = True
        return done

    def rates(self) -> None:
        """Max-min fair rates by progressive filling: repeatedly find the links whose capacity
        left, shared equally among their unfixed messages, is smallest, and fix those
        messages at that share. O(iterations x total hops), vectorised."""
        flows = self.flows
        if not flows:
            return
        lens = np.fromiter((len(f.links) for f in flows), dtype=np.int64, count=len(flows))
        fid = np.repeat(np.arange(len(flows)), lens)
        lid = np.fromiter((lk for f in flows for lk in f.links), dtype=np.int64,
                          count=int(lens.sum()))
        left = np.asarray(self.capacity, dtype=np.float64).copy()
        num_links = left.size
        active = np.ones(len(flows), dtype=bool)
        rate = np.zeros(len(flows))
        while active.any():
            on = active[fid]
            count = np.bincount(lid[on], minlength=num_links)
            with np.errstate(divide="ignore", invalid="ignore"):
                share = np.where(count > 0, left / np.maximum(count, 1), np.inf)
            best = float(share.min())
            bottleneck = share <= best * (1 + 1e-12)
            hit = np.zeros(len(flows), dtype=bool)
            hit[fid[on & bottleneck[lid]]] = True
            rate[hit] = best
            active &= ~hit
            used = hit[fid]
            left -= best * np.bincount(lid[used], minlength=num_links)
        for f, r in zip(flows, rate.tolist(), strict=True):
            f.rate = r


class _Sim:
    def __init__(self, plan: Plan, graph: Graph, topology: Topology, schedule: Schedule,
                 cm: CostModel, order: tuple[int, ...], optimizer: str) -> None:
        self.t = 0.0
        self.heap: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = 0
        self.intervals: list[Interval] = []
        self.schedule = schedule
        assign, _ = plan_arrays(plan, graph)
        k = plan.num_stages
        inv = np.empty(k, dtype=np.int64)
        inv[list(order)] = np.arange(k)
        a = inv[assign]  # pipeline position of every node
        self.r = r = len(plan.stages[0].devices)
        # devices: rank p uses the devices of the plan stage at pipeline position p
        rank_dev = [plan.stages[order[p]].devices for p in range(schedule.num_ranks)]
        self.dev = np.array([rank_dev[schedule.stage_rank[s]] for s in range(k)],
                            dtype=np.int64).reshape(k, r)
        # compute seconds of every (stage, replica)
        fm, ff, bm, bf = cm.stage_work(a, k)
        speed, rate = cm.device_speed[self.dev], cm.device_rate[self.dev]
        fwd = fm[:, None] / speed + ff[:, None] / rate
        bwd = bm[:, None] / speed + bf[:, None] / rate
        if cm.recompute:
            bwd = bwd + fwd
        self.fwd, self.bwd = fwd / r, bwd / r
        # traffic and dependencies
        self.bytes, self.tensors = stage_traffic(graph, a, k)
        adj = graph.stage_adjacency(a, k)
        self.succ = [np.flatnonzero(adj[s]).tolist() for s in range(k)]
        self.pred = [np.flatnonzero(adj[:, s]).tolist() for s in range(k)]
        # memory
        mem = cm.memory_breakdown(a, k, in_flight=0, replicas=r)["total"]
        mem1 = cm.memory_breakdown(a, k, in_flight=1, replicas=r)["total"]
        self.per_mb = mem1 - mem
        self.devices = tuple(sorted({int(d) for d in self.dev.ravel()}))
        self.mem_now = {d: 0.0 for d in self.devices}
        for s in range(k):
            for i in range(r):
                self.mem_now[int(self.dev[s, i])] += float(mem[s])
        self.mem_peak = dict(self.mem_now)
        self.mem_line = {d: [(0.0, self.mem_now[d])] for d in self.devices}
        # optimizer: seconds per device
        params = np.bincount(a, weights=graph.param_bytes.astype(np.float64), minlength=k)
        self.grad_bytes = params
        flops = OPTIMIZER_FLOPS.get(optimizer, 12.0)
        self.opt_seconds = {d: 0.0 for d in self.devices}
        for s in range(k):
            for i in range(r):
                d = int(self.dev[s, i])
                self.opt_seconds[d] += params[s] / _PARAM_BYTES * flops / cm.device_rate[d]
        # network
        self.topology = topology
        self.routes = routes_of(topology)
        self._link_ids: dict[tuple[int, int], int] = {}
        caps: list[float] = []
        best: dict[tuple[int, int], tuple[float, float]] = {}
        for lk in topology.links:
            key = (int(lk.src), int(lk.dst))
            if key not in best or (lk.latency, -lk.bandwidth) < best[key]:
                best[key] = (lk.latency, -lk.bandwidth)
        self._link_bw = {key: -v[1] for key, v in best.items()}
        self.net = _Network(caps)
        self._paths: dict[tuple[int, int], tuple[int, ...]] = {}
        self.send_q: dict[int, deque[_Message]] = {d: deque() for d in self.devices}
        self.sending: dict[int, bool] = {d: False for d in self.devices}
        # workers and bookkeeping
        self.workers = [_Worker(p, i, int(rank_dev[p][i]), schedule.ranks[p],
                                stages=tuple(s for s in range(k) if schedule.stage_rank[s] == p))
                        for p in range(schedule.num_ranks) for i in range(r)]
        self.worker_of = {(w.rank, w.replica): w for w in self.workers}
        self.arrived: dict[tuple[str, int, int, int], int] = {}
        self.ar_ready = [0] * k
        self.ar_start = [math.nan] * k
        self.ar_done = [math.nan] * k
        self.ar_step_left = [0] * k
        self.last_backward = 0.0
        self.finish: dict[int, float] = {}

    # ------------------------------------------------------------------ events
    def at(self, time: float, fn: Callable[[], None]) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (time, self.seq, fn))

    def run(self) -> None:
        for w in self.workers:
            self.advance(w)
        net = self.net
        while self.heap or net.flows:
            net.refresh(self.t)
            t_heap = self.heap[0][0] if self.heap else math.inf
            if net.flows and net.next_time <= t_heap:
                self.t = max(self.t, net.next_time)
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
        if act.op == FORWARD:
            need = len(self.pred[act.stage])
            have = self.arrived.get((FORWARD, act.stage, w.replica, act.microbatch), 0)
        else:
            need = len(self.succ[act.stage])
            have = self.arrived.get((BACKWARD, act.stage, w.replica, act.microbatch), 0)
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
            w.pos += 1
            s, i = act.stage, w.replica
            dur = float(self.fwd[s, i] if act.op == FORWARD else self.bwd[s, i])
            start = self.t
            w.busy = True
            if act.op == FORWARD:
                self.memory(w.device, float(self.per_mb[s]))

            def finish(w: _Worker = w, act: Any = act, start: float = start) -> None:
                w.busy = False
                self.intervals.append(Interval(w.device, start, self.t, act.op, act.stage,
                                               act.microbatch))
                if act.op == FORWARD:
                    self.sent_forward(act.stage, w.replica, act.microbatch)
                else:
                    self.memory(w.device, -float(self.per_mb[act.stage]))
                    self.last_backward = max(self.last_backward, self.t)
                    self.sent_backward(act.stage, w.replica, act.microbatch)
                self.advance(w)

            self.at(self.t + dur, finish)

    def optimizer(self, w: _Worker) -> None:
        w.busy = True
        start = self.t

        def finish() -> None:
            w.busy = False
            w.done = True
            self.intervals.append(Interval(w.device, start, self.t, "OPT", min(w.stages)))
            self.finish[w.device] = self.t

        self.at(self.t + self.opt_seconds[w.device], finish)

    def memory(self, device: int, delta: float) -> None:
        self.mem_now[device] += delta
        self.mem_peak[device] = max(self.mem_peak[device], self.mem_now[device])
        self.mem_line[device].append((self.t, self.mem_now[device]))

    # ------------------------------------------------------------------ messages
    def wake(self, kind: str, stage: int, replica: int, mb: int) -> None:
        key = (kind, stage, replica, mb)
        self.arrived[key] = self.arrived.get(key, 0) + 1
        self.advance(self.worker_of[(self.schedule.stage_rank[stage], replica)])

    def sent_forward(self, s: int, i: int, m: int) -> None:
        for b in self.succ[s]:
            self.send(int(self.dev[s, i]), int(self.dev[b, i]), self.bytes[s, b] / self.r,
                      self.tensors[s, b], "activation", s, m,
                      lambda b=b: self.wake(FORWARD, b, i, m))

    def sent_backward(self, s: int, i: int, m: int) -> None:
        for a in self.pred[s]:
            self.send(int(self.dev[s, i]), int(self.dev[a, i]), self.bytes[a, s] / self.r,
                      self.tensors[a, s], "gradient", s, m,
                      lambda a=a: self.wake(BACKWARD, a, i, m))

    def send(self, src: int, dst: int, nbytes: float, tensors: float, kind: str, stage: int,
             mb: int | None, on_arrival: Callable[[], None]) -> None:
        if src == dst:
            on_arrival()
            return
        lat = float(self.topology.latency[src, dst]) * float(tensors)
        self.send_q[src].append(_Message(src, dst, float(nbytes), lat, kind, stage, mb,
                                         on_arrival))
        self.next_send(src)

    def next_send(self, src: int) -> None:
        if self.sending[src] or not self.send_q[src]:
            return
        msg = self.send_q[src].popleft()
        self.sending[src] = True
        msg.start = self.t
        self.at(self.t + msg.latency, lambda: self.stream(msg))

    def stream(self, msg: _Message) -> None:
        if msg.nbytes <= 0:
            self.delivered(msg)
            return
        msg.links = self.path(msg.src, msg.dst)
        self.net.add(msg, self.t)

    def path(self, src: int, dst: int) -> tuple[int, ...]:
        key = (src, dst)
        if key not in self._paths:
            try:
                hops = self.routes.links_on_path(src, dst)
            except ShardplanError:
                raise ShardplanError(f"device {dst} cannot be reached from device {src}: the "
                                     "plan needs a link the topology does not have") from None
            ids = []
            for hop in hops:
                if hop not in self._link_ids:
                    self._link_ids[hop] = len(self.net.capacity)
                    bw = self._link_bw.get(hop, float(self.topology.bandwidth[hop]))
                    self.net.capacity.append(bw)
                ids.append(self._link_ids[hop])
            self._paths[key] = tuple(ids)
        return self._paths[key]

    def delivered(self, msg: _Message) -> None:
        self.intervals.append(Interval(msg.src, msg.start, self.t, msg.kind, msg.stage,
                                       msg.microbatch, msg.dst))
        self.sending[msg.src] = False
        msg.on_arrival()
        self.next_send(msg.src)

    # ------------------------------------------------------------------ all-reduce
    def reduce_ready(self, s: int) -> None:
        self.ar_ready[s] += 1
        if self.ar_ready[s] < self.r:
            return
        self.ar_start[s] = self.t
        if self.r == 1 or self.grad_bytes[s] <= 0:
            self.reduce_done(s)
        else:
            self.reduce_step(s, 2 * (self.r - 1))

    def reduce_step(self, s: int, steps_left: int) -> None:
        if steps_left == 0:
            self.reduce_done(s)
            return
        self.ar_step_left[s] = self.r
        chunk = self.grad_bytes[s] / self.r

        def arrived() -> None:
            self.ar_step_left[s] -= 1
            if self.ar_step_left[s] == 0:
                self.reduce_step(s, steps_left - 1)

        for i in range(self.r):
            self.send(int(self.dev[s, i]), int(self.dev[s, (i + 1) % self.r]), chunk, 1.0,
                      "allreduce", s, None, arrived)

    def reduce_done(self, s: int) -> None:
        self.ar_done[s] = self.t
        p = self.schedule.stage_rank[s]
        for i in range(self.r):
            self.advance(self.worker_of[(p, i)])


def simulate(plan: Plan, graph: Graph, topology: Topology, *, schedule: str | Schedule = "1f1b",
             num_microbatches: int = 4, recompute: bool = False, virtual_stages: int = 2,
             optimizer: str = "adam", mixed_precision: bool = False,
             param_dtype_bytes: int = 2, efficiency: float = 1.0,
             profile_flops: float | None = None, timeline: bool = True) -> SimulationResult:
    """Simulate one training iteration of ``plan`` (see the module docstring for the model).

    Parameters
    ----------
    plan, graph, topology
        Every stage must have the same number R of replica devices.
    schedule : {"gpipe", "1f1b", "interleaved-1f1b"} or Schedule
        A name, or a schedule of the plan's number of stages (pipeline positions in the
        order of :func:`stage_order`). ``interleaved-1f1b`` runs the S stages on the
        devices of the first ``S / virtual_stages`` pipeline positions, stage s on those of
        position ``s mod (S / v)`` (the looping placement of Narayanan et al. 2021); the
        other stages' devices stay idle.
    num_microbatches : int
        Ignored when ``schedule`` is a Schedule (its own count is used).
    recompute : bool
        Activation recomputation: the backward re-runs the forward, and only stage inputs are
        kept between the passes (the cost model's ``recompute``).
    virtual_stages : int
    optimizer, mixed_precision, param_dtype_bytes, efficiency, profile_flops
        Passed to :class:`~shardplan.cost.CostModel`.
    timeline : bool
        Keep the intervals and memory timeline in the result.

    Returns
    -------
    SimulationResult

    Raises
    ------
    ShardplanError
        Stages with different replica counts, a cyclic stage graph, a schedule that does not
        fit the plan or deadlocks, an unreachable device pair.

    Examples
    --------
    >>> from shardplan.ir import Device, Graph, Objective, Plan, Stage, Topology
    >>> g = Graph.from_arrays(name="g", fwd_flops=[1e12, 1e12], src=[0], dst=[1])
    >>> t = Topology(name="t", devices=(Device("a", 1e12, 1e12), Device("b", 1e12, 1e12)),
    ...              bandwidth=[[0, 1e9], [1e9, 0]], latency=[[0, 0], [0, 0]])
    >>> p = Plan("g", "t", "hand", (Stage((0,), (0,)), Stage((1,), (1,))), Objective("x", 0))
    >>> r = simulate(p, g, t, schedule="gpipe", num_microbatches=3, optimizer="sgd")
    >>> round(r.iteration_seconds, 6), round(r.bubble_fraction, 4)  # (3 + 2 - 1) * (1 + 2)
    (12.0, 0.25)
    """
    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int) \
            or num_microbatches < 1:
        raise ShardplanError(f"the number of micro-batches must be a positive integer, got "
                             f"{num_microbatches!r}")
    plan.validate(graph, topology)
    plan_arrays(plan, graph)  # same replica count everywhere
    cm = CostModel(graph, topology, optimizer=optimizer, mixed_precision=mixed_precision,
                   param_dtype_bytes=param_dtype_bytes, efficiency=efficiency,
                   recompute=recompute, profile_flops=profile_flops)
    k = plan.num_stages
    if isinstance(schedule, Schedule):
        view = PipelineView.build(plan, graph, schedule=schedule)
    else:
        settings = ExecutionSettings(schedule=schedule, microbatches=num_microbatches,
                                     virtual_stages=max(int(virtual_stages), 2)
                                     if schedule == "interleaved-1f1b" else 2)
        if schedule == "interleaved-1f1b" and virtual_stages < 2:
            raise ShardplanError("interleaved 1F1B needs at least 2 virtual stages per rank")
        view = PipelineView.build(plan, graph, settings)
    sch, order = view.schedule, view.order
    sim = _Sim(plan, graph, topology, sch, cm, order, optimizer)
    sim.run()
    m = sch.num_microbatches
    devs = sim.devices
    busy = {d: 0.0 for d in devs}
    for iv in sim.intervals:
        if iv.kind in (FORWARD, BACKWARD):
            busy[iv.device] += iv.end - iv.start
    iteration = float(max(sim.finish.values()))
    pipeline = float(sim.last_backward)
    bubble = 1.0 - sum(busy.values()) / (len(devs) * pipeline) if pipeline > 0 else 0.0
    per_device = {d: 0.0 for d in devs}
    for s in range(k):
        for i in range(sim.r):
            d = int(sim.dev[s, i])
            per_device[d] += float(sim.fwd[s, i] + sim.bwd[s, i])
    samples = m * int(graph.batch_size)
    intervals = tuple(sorted(sim.intervals, key=lambda iv: (iv.start, iv.device, iv.end)))
    return SimulationResult(
        schedule=sch, stage_order=order, num_microbatches=m, num_replicas=sim.r,
        samples_per_iteration=samples, iteration_seconds=iteration, pipeline_seconds=pipeline,
        throughput=samples / iteration if iteration > 0 else math.inf,
        bubble_fraction=float(max(0.0, bubble)), devices=devs,
        busy_seconds=tuple(float(busy[d]) for d in devs),
        peak_memory_bytes=tuple(float(sim.mem_peak[d]) for d in devs),
        memory_capacity_bytes=tuple(float(topology.devices[d].memory_bytes) for d in devs),
        allreduce_seconds=tuple(float(e - b) for b, e in zip(sim.ar_start, sim.ar_done,
                                                              strict=True)),
        optimizer_seconds=float(max(sim.opt_seconds.values())),
        ideal_seconds=float(m * max(per_device.values())),
        intervals=intervals if timeline else (),
        memory_timeline=tuple(tuple(sim.mem_line[d]) for d in devs) if timeline else (),
        options={"schedule": sch.name, "num_microbatches": m, "recompute": recompute,
                 "virtual_stages": virtual_stages if sch.name == "interleaved-1f1b" else 1,
                 "optimizer": optimizer, "mixed_precision": mixed_precision,
                 "efficiency": efficiency},
    )
