"""The simulator's collectives and gradient synchronisation: the chunks a stage's gradients
are synchronised in (:func:`_sync_chunks`: DDP's buckets, FSDP's units), and the
collectives among a stage's replicas (:class:`_Collectives`: issued in order per group, a
measured curve's time or a ring of synchronised steps over the network, the remaining
steps in closed form when the ring is private, :mod:`shardplan.simulate._ring`).

The model is in :mod:`shardplan.simulate._engine`'s docstring (**All-reduce**).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from shardplan.cost import CostModel, _overheads
from shardplan.cost._collectives import measured_seconds, ring_steps
from shardplan.ir import ExecutionSettings
from shardplan.simulate._messages import _Messages, _Worker
from shardplan.simulate._ring import ring_arrivals
from shardplan.simulate.result import Interval

__all__ = ["_Collectives", "_sync_chunks"]


class _Collectives(_Messages):
    """The collectives of the simulator :class:`~shardplan.simulate._engine._Sim` (a part
    of it, over its messages: ``_Sim`` sets up the state below)."""

    # the simulator's state these methods use (set by ``_Sim.__init__``)
    reps: np.ndarray
    grad_bytes: np.ndarray
    sync: str
    grad_left: list[int]
    ar_ready: list[int]
    ar_start: list[float]
    ar_done: list[float]
    coll_queue: list[deque[Any]]
    coll_running: list[bool]
    coll_issued: dict[tuple[Any, ...], int]
    coll_done: set[tuple[Any, ...]]
    waiters: dict[tuple[Any, ...], list[Callable[[], None]]]
    direct_links: bool
    workers: list[_Worker]
    stages_on: dict[int, list[int]]
    timeline: bool
    _ring_disjoint: dict[int, bool]

    # ------------------------------------------------------------------ collectives
    def reduce_ready(self, s: int) -> None:
        """A replica passed the stage's ``REDUCE_GRAD``: with ``end`` sync, the stage's
        all-reduce starts once all have (``zero1``: its reduce-scatter, the parameters'
        all-gather following each replica's optimizer step); otherwise the buckets' or
        units' collectives (launched during the last backward) are what the optimizer
        waits for."""
        self.ar_ready[s] += 1
        r = int(self.reps[s])
        if self.ar_ready[s] < r:
            return
        if math.isnan(self.ar_start[s]):
            self.ar_start[s] = self.t
        if r == 1 or self.grad_bytes[s] <= 0:
            self.reduce_done(s)
        elif self.sync in ("end", "zero1"):  # zero1: the all-gather follows the step
            self.grad_left[s] = 1
            kind = "allreduce" if self.sync == "end" else "reducescatter"
            for _ in range(r):
                self.issue((kind, s, "grad", 0, float(self.grad_bytes[s])))
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
