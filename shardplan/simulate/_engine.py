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
import functools
import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardplan.cost import CostModel, _overheads, stage_times
from shardplan.cost._collectives import measured_seconds, ring_steps
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
from shardplan.simulate._pipeline import PipelineView
from shardplan.simulate._ring import ring_arrivals
from shardplan.simulate.result import Interval, SimulationResult
from shardplan.topology import routes_of
from shardplan.topology._routing import GridRoutes

__all__ = ["simulate"]


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
    t_rate: float = 0.0
    finish: float = 0.0
    busy0: tuple[float, float] = (0.0, 0.0)  # its ends' compute seconds when it started


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
    completed: int = 0  # compute actions finished (receives posted: recv_positions)
    held: list[tuple[int, Callable[[], None]]] = field(default_factory=list)


@dataclass
class _Network:
    """Messages streaming bytes over shared links at max-min fair rates.

    While no link carries two messages (the common case of a pipeline's point-to-point
    traffic), every message streams at its path's bottleneck from start to end: its finish
    time is known when it starts and goes on a heap, O(log F) per message. When links are
    shared, the rates are recomputed by progressive filling whenever the set of messages
    changes (lazily, once per time step), and the finish times with them."""

    capacity: list[float]
    flows: dict[int, _Message] = field(default_factory=dict)
    count: dict[int, int] = field(default_factory=dict)  # messages per link
    shared: int = 0  # links carrying two or more messages
    heap: list[tuple[float, int, int]] = field(default_factory=list)  # (finish, seq, id)
    dirty: bool = False
    seq: int = 0

    def _push(self, msg: _Message) -> None:
        self.seq += 1
        msg.finish = msg.t_rate + max(msg.remaining, 0.0) / msg.rate
        heapq.heappush(self.heap, (msg.finish, self.seq, id(msg)))

    def add(self, msg: _Message, t: float) -> None:
        for lk in msg.links:
            c = self.count.get(lk, 0) + 1
            self.count[lk] = c
            if c == 2:
                self.shared += 1
        msg.remaining, msg.t_rate = msg.nbytes, t
        self.flows[id(msg)] = msg
        if self.shared == 0 and not self.dirty:
            msg.rate = min(self.capacity[lk] for lk in msg.links)
            self._push(msg)
        else:
            self.dirty = True

    def remove(self, msg: _Message) -> None:
        was_shared = self.shared > 0
        for lk in msg.links:
            c = self.count[lk] - 1
            self.count[lk] = c
            if c == 1:
                self.shared -= 1
        del self.flows[id(msg)]
        if was_shared:
            self.dirty = True  # the others' shares may grow

    def refresh(self, t: float) -> None:
        """After messages came or went under sharing: settle every message's bytes at its
        old rate, recompute the rates and every finish time."""
        if not self.dirty:
            return
        flows = list(self.flows.values())
        for f in flows:
            f.remaining -= f.rate * (t - f.t_rate)
            f.t_rate = t
        self.rates(flows)
        self.heap = []
        for f in flows:
            self._push(f)
        self.dirty = False

    def next_time(self) -> float:
        """When the next message finishes (``inf`` if none streams)."""
        heap = self.heap
        while heap and (heap[0][2] not in self.flows
                        or self.flows[heap[0][2]].finish != heap[0][0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    def pop_done(self, t: float) -> list[_Message]:
        """The messages finishing at ``t`` (to rounding), removed."""
        done = []
        while True:
            nxt = self.next_time()
            if nxt > t * (1 + 1e-12) + 1e-15:
                break
            _, _, key = heapq.heappop(self.heap)
            msg = self.flows[key]
            self.remove(msg)
            done.append(msg)
        return done

    def rates(self, flows: list[_Message]) -> None:
        """Max-min fair rates by progressive filling: repeatedly find the links whose
        capacity left, shared equally among their unfixed messages, is smallest, and fix
        those messages at that share. O(iterations x total hops), vectorised."""
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


def recv_positions(schedule: Schedule) -> dict[tuple[str, int, int], int]:
    """When each rank posts the receive of every stage-to-stage message: ``(kind, stage,
    micro-batch) -> n``, the receive of the activation (``kind`` ``F``) or gradient (``B``)
    that ``stage``'s action on that micro-batch consumes is posted once its rank has
    finished its first ``n`` compute actions (sub-actions of an ``OVERLAP_F_B`` counted one
    by one).

    torch's pipelining runtime lowers a compute-only schedule by
    ``torch.distributed.pipelining.schedules._add_send_recv``: it walks the ranks' lists
    round-robin, appending each rank's next compute action once its inputs are sent, and
    the matching receive to the receiving rank's list at that moment; a rank runs its list
    in order, so a receive is posted after every compute action before it. This function
    walks the same way. Transports that move a message only once both ends have posted
    (gloo's and NCCL's point-to-point) start it then: under GPipe the next micro-batch's
    receive is posted only after the current one is computed, which exposes one message per
    micro-batch that 1F1B hides behind its other pass. O(actions x ranks).
    """
    last = schedule.num_stages - 1
    rank_of = schedule.stage_rank
    todo = {r: list(acts) for r, acts in enumerate(schedule.ranks)}
    prev: dict[int, set[tuple[str, int, int | None]]] = {r: set() for r in todo}
    done = dict.fromkeys(todo, 0)
    out: dict[tuple[str, int, int], int] = {}

    def comm(a: Any) -> tuple[str, int] | None:  # (kind received, receiving stage)
        if a.op == FORWARD and a.stage != last and rank_of[a.stage + 1] != rank_of[a.stage]:
            return FORWARD, a.stage + 1
        if a.op in (BACKWARD, BACKWARD_INPUT) and a.stage != 0 and \
                rank_of[a.stage - 1] != rank_of[a.stage]:
            return BACKWARD, a.stage - 1
        return None

    def ready(a: Any, seen: set[tuple[str, int, int | None]]) -> bool:
        if a.op == FORWARD and a.stage != 0:
            return ("RECV_F", a.stage, a.microbatch) in seen or \
                (FORWARD, a.stage - 1, a.microbatch) in seen
        if a.op in (BACKWARD, BACKWARD_INPUT) and a.stage != last:
            return ("RECV_B", a.stage, a.microbatch) in seen or any(
                (op, a.stage + 1, a.microbatch) in seen for op in (BACKWARD_INPUT, BACKWARD))
        return True

    while todo:
        progress = False
        for r in sorted(todo):
            act = todo[r][0]
            if act.op != REDUCE_GRAD:
                leaves = act.leaves()
                if not all(ready(a, prev[r]) for a in leaves):
                    continue
                for a in leaves:
                    prev[r].add((a.op, a.stage, a.microbatch))
                    c = comm(a)
                    if c is not None:
                        kind, stage = c
                        dst = rank_of[stage]
                        mb = a.microbatch
                        assert mb is not None  # compute actions name their micro-batch
                        prev[dst].add(("RECV_F" if kind == FORWARD else "RECV_B", stage, mb))
                        out[(kind, stage, int(mb))] = done[dst]
                done[r] += len(leaves)
            todo[r].pop(0)
            if not todo[r]:
                del todo[r]
            progress = True
        if not progress:  # not a schedule torch can lower: messages go when sent
            return out
    return out


class _Sim:
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
            w.done = True
            self.intervals.append(Interval(w.device, start, self.t, "OPT", min(w.stages)))
            self.finish[w.device] = self.t

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

    # ------------------------------------------------------------------ messages
    def wake(self, kind: str, stage: int, replica: int, mb: int) -> None:
        key = (kind, stage, replica, mb)
        self.arrived[key] = self.arrived.get(key, 0) + 1
        self.advance(self.worker_of[(self.schedule.stage_rank[stage], replica)])

    def sent_forward(self, s: int, i: int, m: int) -> None:
        for b, j, nb, tn in self.out_msgs.get((s, i), ()):
            src = int(self.dev[s, i])
            self.when_posted((FORWARD, b, m), j, src, functools.partial(
                self.send, src, int(self.dev[b, j]), nb, tn, "activation", s, m,
                functools.partial(self.wake, FORWARD, b, j, m)))

    def sent_backward(self, s: int, j: int, m: int) -> None:
        for a, i, nb, tn in self.in_msgs.get((s, j), ()):
            src = int(self.dev[s, j])
            self.when_posted((BACKWARD, a, m), i, src, functools.partial(
                self.send, src, int(self.dev[a, i]), nb, tn, "gradient", s, m,
                functools.partial(self.wake, BACKWARD, a, i, m)))

    def when_posted(self, key: tuple[str, int, int], replica: int, src: int,
                    go: Callable[[], None]) -> None:
        """Send now, or once the receiving worker has posted the receive (after its first
        ``recv_at[key]`` compute actions: :func:`recv_positions`); until then ``src`` has
        the message to send (it is not quiet)."""
        n = self.recv_at.get(key)
        w = self.worker_of[(self.schedule.stage_rank[key[1]], replica)]
        if n is None or w.completed >= n:
            go()
            return
        self.held_from[src] = self.held_from.get(src, 0) + 1

        def release() -> None:
            self.held_from[src] -= 1
            go()

        w.held.append((n, release))

    def post_receives(self, w: _Worker) -> None:
        if not w.held:
            return
        now = [go for n, go in w.held if w.completed >= n]
        if now:
            w.held = [(n, go) for n, go in w.held if w.completed < n]
            for go in now:
                go()

    def send(self, src: int, dst: int, nbytes: float, tensors: float, kind: str, stage: int,
             mb: int | None, on_arrival: Callable[[], None],
             seconds: float | None = None) -> None:
        """Queue a message on ``src``'s send queue; ``seconds``: a measured collective's
        share, which holds the queue that long instead of streaming bytes."""
        if src == dst:
            on_arrival()
            return
        lat = self.pair_latency(src, dst) * float(tensors) if seconds is None \
            else float(seconds)
        self.send_q[src].append(_Message(src, dst, float(nbytes), lat, kind, stage, mb,
                                         on_arrival))
        self.pending[src] += 1
        self.pending[dst] += 1
        self.next_send(src)

    def next_send(self, src: int) -> None:
        if self.sending[src] or not self.send_q[src]:
            return
        msg = self.send_q[src][0]
        if not self.overlap and (self.computing[src] or self.computing[msg.dst]):
            return  # retried when a computation ends
        self.send_q[src].popleft()
        self.sending[src] = True
        msg.start = self.t
        msg.busy0 = (self.busy_seconds(src), self.busy_seconds(msg.dst))
        self.at(self.t + msg.latency, lambda: self.stream(msg))

    def retry_sends(self) -> None:
        for d in self.devices:
            self.next_send(d)

    def stream(self, msg: _Message) -> None:
        if msg.nbytes <= 0:
            self.delivered(msg)
            return
        msg.links = self.path(msg.src, msg.dst)
        self.net.add(msg, self.t)

    def pair_latency(self, src: int, dst: int) -> float:
        """The topology's latency from ``src`` to ``dst``, looked up once per pair (a pair
        model computes it on demand: a ring all-reduce over 1280 devices asks 3.6 M times)."""
        key = (src, dst)
        lat = self._latency.get(key)
        if lat is None:
            lat = self._latency[key] = float(self.topology.latency[src, dst])
        return lat

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
        self.pending[msg.src] -= 1
        self.pending[msg.dst] -= 1
        for end, before in zip((msg.src, msg.dst), msg.busy0, strict=True):
            if self.cpu_share[end] > 0:  # the CPU it took from that end's compute
                self.debt[end] += self.cpu_share[end] * (self.busy_seconds(end) - before)
        msg.on_arrival()
        self.next_send(msg.src)
        if not self.overlap:
            for d in (msg.src, msg.dst):
                for w in self.workers_on.get(d, ()):
                    self.advance(w)

    # ------------------------------------------------------------------ collectives
    def reduce_ready(self, s: int) -> None:
        """A replica passed the stage's ``REDUCE_GRAD``: with ``end`` sync, the stage's
        all-reduce starts once all have; otherwise the buckets' or units' collectives
        (launched during the last backward) are what the optimizer waits for."""
        self.ar_ready[s] += 1
        r = int(self.reps[s])
        if self.ar_ready[s] < r:
            return
        if math.isnan(self.ar_start[s]):
            self.ar_start[s] = self.t
        if r == 1 or self.grad_bytes[s] <= 0:
            self.reduce_done(s)
        elif self.sync == "end":
            self.grad_left[s] = 1
            for _ in range(r):
                self.issue(("allreduce", s, "grad", 0, float(self.grad_bytes[s])))
        elif self.grad_left[s] == 0:
            self.reduce_done(s)

    def issue(self, key: Any) -> None:
        """One replica issues collective ``key = (kind, stage, tag, index, bytes)``; it runs
        when every replica of the stage has issued it and the stage's previous collectives
        are over (one stream per group, as NCCL and gloo run them, in issue order)."""
        kind, s, tag, idx, nbytes = key
        ident = key[:4]
        if ident in self.coll_done:
            return
        count = self.coll_issued.get(ident, 0) + 1
        self.coll_issued[ident] = count
        if count == 1:
            self.coll_queue[s].append(key)
            if kind != "allgather" and math.isnan(self.ar_start[s]):
                self.ar_start[s] = self.t
        self.start_collective(s)

    def collective_done(self, key: Any) -> bool:
        return key[:4] in self.coll_done

    def measured_collective(self, kind: str, s: int, nbytes: float) -> float | None:
        """The topology's measured time of this collective over stage s's replicas, if it
        has a curve for that group size."""
        return measured_seconds(self.topology, kind, int(self.reps[s]), nbytes)

    def start_collective(self, s: int) -> None:
        queue = self.coll_queue[s]
        if self.coll_running[s] or not queue:
            return
        kind, _, _, _, nbytes = key = queue[0]
        r = int(self.reps[s])
        if self.coll_issued.get(key[:4], 0) < r:
            return
        queue.popleft()
        self.coll_running[s] = True
        measured = self.measured_collective(kind, s, nbytes)
        left = [r]

        def arrived() -> None:
            left[0] -= 1
            if left[0] == 0:
                self.collective_finished(key)

        if measured is not None:  # a measured collective: each replica busy for its time
            for i in range(r):
                self.send(int(self.dev[s, i]), int(self.dev[s, (i + 1) % r]), 0.0, 0.0,
                          kind, s, None, arrived, seconds=measured)
            return
        self.ring_step(s, key, ring_steps(kind, r))

    def ring_step(self, s: int, key: Any, steps_left: int) -> None:
        if steps_left == 0:
            self.collective_finished(key)
            return
        if self.ring_private(s):  # the remaining steps in closed form (:mod:`._ring`)
            self.ring_closed(s, key, steps_left)
            return
        r = int(self.reps[s])
        left = [r]
        chunk = key[4] / r

        def arrived() -> None:
            left[0] -= 1
            if left[0] == 0:
                self.ring_step(s, key, steps_left - 1)

        for i in range(r):
            self.send(int(self.dev[s, i]), int(self.dev[s, (i + 1) % r]), chunk, 1.0,
                      key[0], s, None, arrived)

    def ring_private(self, s: int) -> bool:
        """Whether stage s's ring owns its devices and links until it ends (see
        :mod:`._ring`): direct links, idle empty send queues, every worker on the ring's
        devices past its last action and every other stage on them synchronised (a plan of
        one stage under overlap: only nothing in flight, whatever its workers do). On routed
        links (meshes, tori, a topology's physical ``links``) the ring's paths must share
        no link, and nothing else may be in flight or still to run anywhere (any message
        could cross the ring's links): then every ring message streams at its path's
        bottleneck alone, as on direct links."""
        ring = self.dev[s, :int(self.reps[s])].tolist()
        if len(self.reps) == 1 and self.overlap:
            # one stage: its collectives, one at a time, are all the traffic there is, and
            # with overlap its computing holds no message back
            return (self.direct_links or self.ring_paths_disjoint(s)) \
                and not self.net.flows and all(self.quiet(d) for d in ring)
        if self.direct_links:  # only the ring's own devices can touch its links
            devices: Any = ring
            workers: Any = (w for d in ring for w in self.workers_on.get(d, ()))
            stages: Any = (s2 for d in ring for s2 in self.stages_on[d])
        elif self.ring_paths_disjoint(s) and not self.net.flows:
            devices, workers, stages = self.devices, self.workers, range(len(self.reps))
        else:
            return False
        return all(self.quiet(d) for d in devices) \
            and all(not w.busy and w.pos >= len(w.actions) for w in workers) \
            and all(s2 == s or not (self.coll_running[s2] or self.coll_queue[s2]
                                    or math.isnan(self.ar_done[s2])) for s2 in stages)

    def quiet(self, d: int) -> bool:
        """Device d sends nothing and has nothing queued or held to send."""
        return not (self.sending[d] or self.send_q[d] or self.held_from.get(d, 0))

    def ring_paths_disjoint(self, s: int) -> bool:
        """Whether the links of stage s's ring paths (each replica to the next) are all
        different. O(R x path length), once per stage."""
        got = self._ring_disjoint.get(s)
        if got is None:
            ring = self.dev[s, :int(self.reps[s])].tolist()
            links = [lk for a, b in zip(ring, ring[1:] + ring[:1], strict=True)
                     for lk in self.path(a, b)]
            got = self._ring_disjoint[s] = len(set(links)) == len(links)
        return got

    def ring_closed(self, s: int, key: Any, steps_left: int) -> None:
        """The remaining ``steps_left`` steps of stage s's private ring at once: the same
        arrivals as the stepwise path (:func:`._ring.ring_arrivals`), its intervals kept
        when the timeline is."""
        r = int(self.reps[s])
        ring = self.dev[s, :r].tolist()
        nxt = ring[1:] + ring[:1]
        lat = np.array([self.pair_latency(a, b) for a, b in zip(ring, nxt, strict=True)])
        rate = np.array([min(self.net.capacity[lk] for lk in self.path(a, b))
                         for a, b in zip(ring, nxt, strict=True)])
        chunk = key[4] / r
        times = ring_arrivals(self.t, lat, rate, chunk, steps_left)
        if self.timeline:
            stream = chunk / rate if chunk > 0 else np.zeros(r)
            for t0 in times[:-1].tolist():
                ends = ((t0 + lat) + stream).tolist()
                self.intervals.extend(
                    Interval(a, t0, e, key[0], s, None, b)
                    for a, b, e in zip(ring, nxt, ends, strict=True))
        self.at(float(times[-1]), lambda: self.collective_finished(key))

    def collective_finished(self, key: Any) -> None:
        s, tag = key[1], key[2]
        self.coll_running[s] = False
        self.coll_done.add(key[:4])
        if tag == "grad":
            self.grad_left[s] -= 1
            if self.grad_left[s] == 0 and self.ar_ready[s] >= int(self.reps[s]):
                self.reduce_done(s)
        for fn in self.waiters.pop(key[:4], []):
            fn()
        self.start_collective(s)

    def reduce_done(self, s: int) -> None:
        self.ar_done[s] = self.t
        p = self.schedule.stage_rank[s]
        for i in range(int(self.reps[s])):
            self.advance(self.worker_of[(p, i)])


def strategy_stage_seconds(plan: Plan, graph: Graph, topology: Topology,
                           settings: ExecutionSettings) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of one micro-batch on each device of every stage of a
    plan carrying a PaSE ``strategy``: the stage's P devices run its nodes under their
    configurations, priced by :func:`shardplan.strategy._price.stage_prices` (the same
    price PaSE's search uses: compute at the plan's micro-batch and precision, activation
    collectives and re-shards every micro-batch at their sizes, DTensor overheads, the
    all-gathers of outputs leaving the stage). Weight gradients are not in these seconds:
    :func:`simulate` reduces them once per iteration with the plan's gradient
    synchronisation. O(n + m) per stage."""
    from shardplan.strategy._price import stage_prices

    assert plan.strategy is not None  # the only callers pass plans that carry one
    prices = stage_prices(plan, graph, topology, settings)
    return (np.array([p["forward"] for p in prices]),
            np.array([p["backward"] for p in prices]))


def _strategy_stage_times(st: Any, strat: dict[str, Any], cm: CostModel, a_pos: np.ndarray,
                          k: int, order: Sequence[int], topology: Topology) -> Any:
    """``st`` (priced on what each device holds) with the strategy's seconds on every
    device of each stage, the gradient bytes of the stages' rings, and whole tensors between
    stages: each device sends the whole activation to its counterpart in the next stage, as
    the hybrid runtime does. O(S R + messages)."""
    from shardplan.cost._pipeline import _messages, ring_collectives, stage_traffic

    mask = st.devices >= 0
    fwd = np.asarray(strat["forward"])[list(order)]
    bwd = np.asarray(strat["backward"])[list(order)]
    grads = np.bincount(a_pos, weights=cm.graph.param_bytes.astype(np.float64), minlength=k)
    reps = st.replicas
    ar = np.zeros(k)
    for s in range(k):
        r = int(reps[s])
        if r > 1 and grads[s] > 0:
            ring = st.devices[s:s + 1, :r]
            ar[s] = float(ring_collectives(topology, "allreduce", ring, grads[s:s + 1],
                                           cm.inverse_bandwidth)[0])
    tb, tt = stage_traffic(cm.graph, a_pos, k)
    whole = tb * np.maximum(reps[:, None], reps[None, :])
    msgs = _messages(whole, tt, st.devices, reps, topology.latency, cm.inverse_bandwidth)
    return dataclasses.replace(st, forward=np.where(mask, fwd[:, None], 0.0),
                               backward=np.where(mask, bwd[:, None], 0.0),
                               param_bytes=grads, allreduce=ar, messages=msgs)


def _strategy_engine_inputs(plan: Plan, graph: Graph, topology: Topology,
                            settings: ExecutionSettings) -> dict[str, Any]:
    """What the engine needs to run a strategy plan with each stage's devices as its
    replicas: per stage its seconds, the graph whose parameter bytes are what each node's
    gradient adds to its stage's ring (:meth:`~shardplan.strategy._price.StagePricer.
    sync_bytes`: an all-batch configuration adds its whole gradient, as data parallelism
    does), and the graph of what one device holds (its part of every parameter and of
    every output). O(n + m) per stage."""
    from shardplan.strategy._price import stage_prices

    if settings.gradient_sync == "sharded":
        raise ShardplanError("a strategy plan synchronises gradients with 'end' or "
                             "'bucketed', not 'sharded'")
    prices = stage_prices(plan, graph, topology, settings)
    sync = np.sum([p["sync_bytes"] for p in prices], axis=0)
    grads = np.sum([p["grad_bytes"] for p in prices], axis=0)
    outs = np.sum([p["output_bytes"] for p in prices], axis=0)
    micro = settings.resolve(graph).graph_for(graph)
    return {"forward": np.array([p["forward"] for p in prices]),
            "backward": np.array([p["backward"] for p in prices]),
            "sync": graph.replace(param_bytes=sync),
            "held": micro.replace(param_bytes=grads, output_bytes=np.rint(outs))}


def _sync_chunks(cm: CostModel, assignment: np.ndarray, k: int, settings: ExecutionSettings
                 ) -> tuple[list[list[tuple[float, float]]], tuple[list, list, list]]:
    """Per stage, DDP's gradient buckets and FSDP's units, as ``(bytes, end fraction)`` lists
    (the units of the forward, of the backward, and the root's bytes reduced when the
    backward ends).

    Buckets: the stage's nodes in reverse topological order (the order a backward produces
    gradients), parameters gathered until a bucket holds ``bucket_bytes``; a bucket is ready
    when the backward has done the share of its compute up to the bucket's last node.
    Units: the modules the runtime wraps (a transformer's blocks, else the top-level
    children with parameters, the root holding the rest:
    :func:`shardplan.cost._overheads.fsdp_unit_chunks`) when the graph names its nodes'
    modules; else the nodes in topological order, cut every ``bucket_bytes`` of
    parameters. A unit's forward ends at its share of the forward's compute, and the
    backward runs the units in reverse; the root's parameters, gathered in the forward and
    kept for the backward, have their gradients reduced when the backward ends (FSDP2's
    final callback; a profile of two gloo ranks: 15 ms of a transformer's 200 ms step, which
    the simulator left out). O(n)."""
    g = cm.graph
    order = g.topological_order
    fwd, bwd = cm.node_seconds(0)
    params = g.param_bytes.astype(np.float64)
    cap = float(settings.bucket_bytes)

    def chunks(nodes: np.ndarray, work: np.ndarray) -> list[tuple[float, float]]:
        total = float(work[nodes].sum())
        out: list[tuple[float, float]] = []
        acc_b = acc_w = 0.0
        for v in nodes.tolist():
            acc_w += float(work[v])
            if params[v] <= 0:
                continue
            acc_b += float(params[v])
            if acc_b >= cap:
                out.append((acc_b, acc_w / total if total > 0 else 1.0))
                acc_b = 0.0
        if acc_b > 0:
            out.append((acc_b, 1.0))
        if out:  # the last chunk ends with the action
            out[-1] = (out[-1][0], 1.0)
        return out

    keys = _overheads.fsdp_unit_keys(g) if settings.gradient_sync == "sharded" else None
    buckets: list[list[tuple[float, float]]] = []
    ufwd: list[list[tuple[float, float]]] = []
    ubwd: list[list[tuple[float, float]]] = []
    uroot: list[float] = []
    for s in range(k):
        nodes = order[assignment[order] == s]
        buckets.append(chunks(nodes[::-1], bwd) if settings.gradient_sync == "bucketed"
                       else [])
        if settings.gradient_sync == "sharded" and keys is not None:  # the runtime's units
            f, b = _overheads.fsdp_unit_chunks(keys, nodes, fwd, bwd, params)
            ufwd.append(f)
            ubwd.append(b)
        elif settings.gradient_sync == "sharded":
            f = chunks(nodes, fwd)
            sizes = [b for b, _ in f][::-1]  # the same units, backward runs them in reverse
            rev = nodes[::-1]
            total = float(bwd[rev].sum())
            ends, acc, i, acc_b = [], 0.0, 0, 0.0
            for v in rev.tolist():
                acc += float(bwd[v])
                acc_b += float(params[v])
                if i < len(sizes) and acc_b >= sizes[i] - 1e-6:
                    ends.append(acc / total if total > 0 else 1.0)
                    acc_b, i = 0.0, i + 1
            ends = (ends + [1.0] * len(sizes))[:len(sizes)]
            if ends:  # a stage without parameters has no units
                ends[-1] = 1.0
            ufwd.append(f)
            ubwd.append(list(zip(sizes, ends, strict=True)))
        else:
            ufwd.append([])
            ubwd.append([])
        # the root's gradients, reduced when the backward ends (FSDP2 keeps the root's
        # parameters after the forward: it has a forward gather and no backward one)
        uroot.append(float(ufwd[-1][0][0]) if len(ufwd[-1]) > len(ubwd[-1]) else 0.0)
    return buckets, (ufwd, ubwd, uroot)


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
        share = weight_share(graph, a_pos, k, recompute=settings.recompute)
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
