"""The simulator's network: messages streaming bytes over routed, shared links.

A :class:`_Message` waits its latency, then streams its bytes over the links of its path;
:class:`_Network` shares every link among the messages on it max-min fairly (progressive
filling) and knows when the next one finishes. The model is in
:mod:`shardplan.simulate._engine`'s docstring (**Network**); the simulator's sends, queues
and receives are :mod:`shardplan.simulate._messages`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

__all__ = ["_Message", "_Network"]


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
