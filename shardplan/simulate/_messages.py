"""The simulator's workers and the messages between them: a rank's worker (:class:`_Worker`),
when torch's pipelining runtime posts each receive (:func:`recv_positions`), and the
simulator's sends (:class:`_Messages`: activations after a forward, gradients after a
backward, each device's FIFO send queue, delivery over :mod:`shardplan.simulate._network`,
and what a message in flight takes from its ends' compute).

The model is in :mod:`shardplan.simulate._engine`'s docstring (**Messages**, **Network**).
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.ir import Topology
from shardplan.ir.schedule import (
    BACKWARD,
    BACKWARD_INPUT,
    FORWARD,
    REDUCE_GRAD,
    Schedule,
)
from shardplan.simulate._network import _Message, _Network
from shardplan.simulate.result import Interval

__all__ = ["_Messages", "_Worker", "recv_positions"]


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


class _Messages:
    """The messages of the simulator :class:`~shardplan.simulate._engine._Sim` (a part of
    it: ``_Sim`` sets up the state below and runs the events and the compute)."""

    # the simulator's state these methods use (set by ``_Sim.__init__``)
    t: float
    overlap: bool
    schedule: Schedule
    topology: Topology
    routes: Any
    dev: np.ndarray
    devices: tuple[int, ...]
    intervals: list[Interval]
    out_msgs: dict[tuple[int, int], list[tuple[int, int, float, float]]]
    in_msgs: dict[tuple[int, int], list[tuple[int, int, float, float]]]
    arrived: dict[tuple[str, int, int, int], int]
    worker_of: dict[tuple[int, int], _Worker]
    workers_on: dict[int, list[_Worker]]
    recv_at: dict[tuple[str, int, int], int]
    held_from: dict[int, int]
    net: _Network
    send_q: dict[int, deque[_Message]]
    sending: dict[int, bool]
    computing: dict[int, bool]
    pending: dict[int, int]
    cpu_share: dict[int, float]
    debt: dict[int, float]
    _link_ids: dict[tuple[int, int], int]
    _link_bw: dict[tuple[int, int], float]
    _paths: dict[tuple[int, int], tuple[int, ...]]
    _latency: dict[tuple[int, int], float]

    if TYPE_CHECKING:  # the simulator's events and compute (``_Sim``)
        def at(self, time: float, fn: Callable[[], None]) -> None: ...
        def advance(self, w: _Worker) -> None: ...
        def busy_seconds(self, device: int) -> float: ...

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
