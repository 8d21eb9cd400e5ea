"""Parmesan's iterative refinement (paper 002, section 4.3).

Moves of single boundary operators between neighbouring stages of a monotone partition (see
:mod:`._pipeline_common`): operator v of stage j may move to j + 1 when all its successors
lie in stages >= j + 1 and one of them in j + 1, and to j - 1 when all its predecessors lie in
stages <= j - 1 and one in j - 1. These are exactly the single moves that keep every stage a
difference of nested fronted subgraphs (so convex, with an acyclic stage graph); a stage is
never emptied. Each step evaluates every such move and takes the one with the smallest
(largest stage time, total bytes between stages), if that is strictly smaller than the
current pair; memory violations show up as infinite stage times, so a move that breaks memory
is never taken and one that repairs it is preferred. The paper's selection criteria (its
appendix C) are not in our text; this lexicographic rule is ours, as the issue asks.

Evaluation is incremental and exact for the cost model: :class:`StageState` keeps, per
producer and consuming stage, the edge bytes, and the stage-pair traffic matrices ``B, T``
of :func:`~shardplan.cost.stage_traffic`; a move updates them in O(deg(v) + deg of v's
producers' entries) and the stage times are recomputed from ``B, T`` and per-stage sums in
O(U S^2) with the one model's functions (:func:`~shardplan.cost._pipeline.uniform_comm`,
:func:`~shardplan.cost.view_seconds`, :func:`~shardplan.cost._formulas.stage_memory`), so
the refined plan's value is the one ``shardplan cost`` reports. ``U <= R`` counts the classes
of alike replicas (the same links to the other stages' replicas and the same devices: their
times are equal, so one of each is evaluated; one class on a hierarchy under the consecutive
placement). A step does not move and move back: every candidate's ``B, T`` deltas are listed
without moving (:meth:`StageState.delta`) and the keys of all candidates come out of one batch
of array operations (:meth:`StageState.evaluate`), the same numbers as moving (tested). One
step costs O(m) for the candidate scan (CSR reductions) plus O(candidates x (deg + U S^2))
element work in O(1) numpy calls per chunk.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from shardplan.cost import CostModel, pipeline_factor, view_seconds
from shardplan.cost._collectives import measured_seconds, ring_steps
from shardplan.cost._formulas import (
    message_seconds,
    ring_allreduce_seconds,
    stage_memory,
    work_seconds,
)
from shardplan.cost._memory import in_flight_microbatches
from shardplan.ir import ExecutionSettings, Graph

__all__ = ["StageState", "refine"]


class StageState:
    """A monotone partition with incrementally maintained stage times (see module doc)."""

    def __init__(self, graph: Graph, model: CostModel, settings: ExecutionSettings,
                 assignment: np.ndarray, devices: np.ndarray, view: str = "overlap") -> None:
        graph = model.graph  # at the settings' micro-batch size
        self.graph = graph
        self.model = model
        self.settings = settings
        self.view = view
        self.a = np.asarray(assignment, dtype=np.int64).copy()
        self.k, self.r = devices.shape
        self.devices = devices
        k = self.k
        fm, ff, bm, bf = model._work
        if model.recompute:  # the backward re-runs the forward
            bm, bf = bm + fm, bf + ff
        self.meas = fm + bm
        self.flops = ff + bf
        # what a replica computes beyond its share (dispatch, weight reads, accumulation)
        self.fixed = model.replica_extra_seconds(self.r)
        self.params = graph.param_bytes.astype(np.float64)
        self.outb = graph.output_bytes.astype(np.float64)
        self.inb = np.where(graph.in_degree == 0, self.outb, 0.0)
        self.extra = np.zeros(graph.num_nodes) if graph.memory_bytes is None else \
            np.nan_to_num(graph.memory_bytes, nan=0.0)
        a = self.a
        self.s_meas = np.bincount(a, weights=self.meas, minlength=k)
        self.s_flops = np.bincount(a, weights=self.flops, minlength=k)
        self.s_fixed = np.bincount(a, weights=self.fixed, minlength=k)
        self.s_params = np.bincount(a, weights=self.params, minlength=k)
        self.s_extra = np.bincount(a, weights=self.extra, minlength=k)
        self.s_out = np.bincount(a, weights=self.outb, minlength=k)
        self.s_in = np.bincount(a, weights=self.inb, minlength=k)
        self.count = np.bincount(a, minlength=k)
        self.flight = in_flight_microbatches(k, int(settings.microbatches), settings.schedule,
                                             virtual_stages=settings.virtual_stages
                                             ).astype(np.float64)
        self.steps = pipeline_factor(settings.microbatches, -(-k // settings.stages_per_rank))
        topo = model._topo()
        self.mem_cap = topo.device_memory[devices].min(axis=1).astype(np.float64)
        self.inv = model.inverse_bandwidth
        lat = topo.latency
        lats = np.stack([lat[np.ix_(p, p)] * (p[:, None] != p[None, :])
                         for p in devices.T])  # (R, S, S)
        ibs = np.stack([self.inv[np.ix_(p, p)] for p in devices.T])
        speed, rate = model.device_speed[devices], model.device_rate[devices]  # (S, R)
        # Replicas whose links and devices are alike have equal times: keep one of each
        # class (on a hierarchy under the consecutive placement, usually one in all).
        keys = np.concatenate([lats.reshape(self.r, -1), ibs.reshape(self.r, -1), speed.T,
                               rate.T], axis=1)
        _, first = np.unique(keys, axis=0, return_index=True)
        first = np.sort(first)
        self.lat, self.ib = lats[first], ibs[first]  # (U, S, S)
        self.lat_t = np.ascontiguousarray(self.lat.transpose(0, 2, 1))
        self.ib_t = np.ascontiguousarray(self.ib.transpose(0, 2, 1))
        self.speed, self.rate = speed[:, first], rate[:, first]  # (S, U)
        # each stage's ring (replicas in plan order): its links' latency and 1 / bandwidth
        nxt = np.roll(devices, -1, axis=1)
        self.ring_lat, self.ring_ib = topo.latency[devices, nxt], self.inv[devices, nxt]
        # cons[u][stage] = list of positive edge bytes from u into that stage.
        self.cons: list[dict[int, list[float]]] = [{} for _ in range(graph.num_nodes)]
        self.inputs: list[list[tuple[int, float]]] = [[] for _ in range(graph.num_nodes)]
        for u, v, nb in zip(graph.src.tolist(), graph.dst.tolist(),
                             graph.edge_bytes.tolist(), strict=True):
            if nb > 0:
                self.cons[u].setdefault(int(a[v]), []).append(float(nb))
                self.inputs[v].append((u, float(nb)))
        self.B = np.zeros((k, k))
        self.T = np.zeros((k, k))
        for u in range(graph.num_nodes):
            for t, lst in self.cons[u].items():
                if t != a[u]:
                    self.B[a[u], t] += max(lst)
                    self.T[a[u], t] += 1.0
        indptr, idx, _ = graph._succ_csr
        self.succ_ptr, self.succ_idx = indptr, idx
        pptr, pidx, _ = graph._pred_csr
        self.pred_ptr, self.pred_idx = pptr, pidx

    # ------------------------------------------------------------------ evaluation
    def stage_seconds(self) -> np.ndarray:
        """The view's stage times of the current partition, ``inf`` when not fitting."""
        r = self.r
        comp = work_seconds(self.s_meas[:, None], self.s_flops[:, None], self.speed,
                            self.rate) / r + self.s_fixed[:, None]  # (k, U)
        send, recv = self.comm()  # (U, k)
        s = self.settings
        sharded = s.gradient_sync == "sharded"
        ar = self.ring("reducescatter" if sharded else "allreduce")
        if sharded:  # two all-gathers of the stage's parameters every micro-batch
            gather = 2.0 * self.ring("allgather")
            send, recv = send + gather[None, :], recv + gather[None, :]
        t = view_seconds(self.view, comp.T, send, recv, ar[None, :], self.steps).max(axis=0)
        mem = stage_memory(params=self.s_params, outputs=self.s_out, received=self.B.sum(axis=0),
                           inputs=self.s_in, extra=self.s_extra, in_flight=self.flight,
                           replicas=r, optimizer=s.optimizer, recompute=s.recompute_full,
                           mixed_precision=s.mixed_precision,
                           param_dtype_bytes=s.param_dtype_bytes,
                           shards=r if sharded else 1,
                           state_shards=r if s.gradient_sync == "zero1" else 1,
                           gathered=np.minimum(2.0 * s.bucket_bytes, self.s_params)
                           if sharded else 0.0)["total"]
        return np.where(mem <= self.mem_cap, t, np.inf)

    def comm(self) -> tuple[np.ndarray, np.ndarray]:
        """Send and receive seconds of every replica class, (U, k):
        :func:`~shardplan.cost._pipeline.uniform_comm` vectorised over the replicas (the
        same terms, summed in the same order). O(U S^2)."""
        b = (self.B / self.r)[None]
        t = self.T[None]
        f = message_seconds(t, self.lat, b, self.ib)
        g = message_seconds(t, self.lat_t, b, self.ib_t)
        return f.sum(axis=2) + g.sum(axis=1), f.sum(axis=1) + g.sum(axis=2)

    def ring(self, kind: str, params: np.ndarray | None = None) -> np.ndarray:
        """:func:`~shardplan.cost._collectives.ring_collectives` of the stages' parameters
        (``params``, shape (..., k); default the current ones) with the rings' links looked
        up once. O(S R) per row."""
        r = self.r
        p = self.s_params if params is None else params
        if r <= 1:
            return np.zeros(p.shape)
        measured = measured_seconds(self.model._topo(), kind, r, p)
        if measured is not None:
            return np.asarray(measured, dtype=np.float64)
        full = ring_allreduce_seconds(r, p[..., None], self.ring_lat,
                                      self.ring_ib).max(axis=-1)
        return full * ring_steps(kind, r) / (2 * (r - 1))

    def delta(self, v: int, dst: int) -> list[tuple[int, int, float, float]]:
        """The changes ``(row, column, bytes, tensors)`` of ``B, T`` if operator v moved to
        stage ``dst`` (:meth:`move` without moving). O(deg(v) + the producers' lists)."""
        a = self.a
        src = int(a[v])
        out: list[tuple[int, int, float, float]] = []
        for t, lst in self.cons[v].items():  # v's own tensor, per consuming stage
            m = max(lst)
            if t != src:
                out.append((src, t, -m, -1.0))
            if t != dst:
                out.append((dst, t, m, 1.0))
        moved: dict[int, list[float]] = {}
        for u, nb in self.inputs[v]:
            moved.setdefault(u, []).append(nb)
        for u, nbs in moved.items():  # v's producers: v's edges leave src, join dst
            su = int(a[u])
            old_src = self.cons[u].get(src, [])
            if su != src:
                rest = list(old_src)
                for nb in nbs:
                    rest.remove(nb)
                out.append((su, src, (max(rest) if rest else 0.0) - max(old_src),
                            0.0 if rest else -1.0))
            if su != dst:
                old_dst = self.cons[u].get(dst)
                new_max = max(nbs) if not old_dst else max(max(old_dst), max(nbs))
                out.append((su, dst, new_max - (max(old_dst) if old_dst else 0.0),
                            0.0 if old_dst else 1.0))
        return out

    def evaluate(self, moves: list[tuple[int, int]], chunk: int = 1 << 21
                 ) -> list[tuple[float, float]]:
        """:meth:`key` after each move of ``moves`` (each alone, from the current state),
        all at once: the stage times of a batch of partitions in one set of array
        operations (the same terms as :meth:`stage_seconds`). O(moves x (deg + U S^2))
        element work in O(1) numpy calls per ``chunk`` elements."""
        k = self.k
        per = max(1, chunk // max(1, self.lat.shape[0] * k * k))
        keys: list[tuple[float, float]] = []
        for lo in range(0, len(moves), per):
            part = moves[lo:lo + per]
            c = len(part)
            rows, cols, db, dt, idx = [], [], [], [], []
            for i, (v, to) in enumerate(part):
                for row, col, b, tt in self.delta(v, to):
                    idx.append(i)
                    rows.append(row)
                    cols.append(col)
                    db.append(b)
                    dt.append(tt)
            bm = np.repeat(self.B[None], c, axis=0)
            tm = np.repeat(self.T[None], c, axis=0)
            np.add.at(bm, (idx, rows, cols), db)
            np.add.at(tm, (idx, rows, cols), dt)
            vs = np.array([v for v, _ in part], dtype=np.int64)
            src = self.a[vs]
            dst = np.array([t for _, t in part], dtype=np.int64)
            ci = np.arange(c)
            sums = []
            for arr, w in ((self.s_meas, self.meas), (self.s_flops, self.flops),
                           (self.s_out, self.outb), (self.s_params, self.params),
                           (self.s_extra, self.extra), (self.s_in, self.inb),
                           (self.s_fixed, self.fixed)):
                x: np.ndarray = np.repeat(arr[None], c, axis=0)
                x[ci, src] -= w[vs]
                x[ci, dst] += w[vs]
                sums.append(x)
            meas, flops, out, params, extra, inb, fixed = sums
            secs = self._batch_seconds(bm, tm, meas, flops, out, params, extra, inb, fixed)
            worst = secs.max(axis=1)
            total = bm.sum(axis=(1, 2))
            keys.extend(zip(worst.tolist(), total.tolist(), strict=True))
        return keys

    def _batch_seconds(self, bm: np.ndarray, tm: np.ndarray, meas: np.ndarray,
                       flops: np.ndarray, out: np.ndarray, params: np.ndarray,
                       extra: np.ndarray, inb: np.ndarray, fixed: np.ndarray) -> np.ndarray:
        """:meth:`stage_seconds` of a batch of states (leading axis), shape (C, k)."""
        r = self.r
        comp = work_seconds(meas[:, :, None], flops[:, :, None], self.speed[None],
                            self.rate[None]) / r \
            + fixed[:, :, None]  # (C, k, U)
        b = (bm / r)[:, None]
        tt = tm[:, None]
        f = message_seconds(tt, self.lat[None], b, self.ib[None])  # (C, U, k, k)
        g = message_seconds(tt, self.lat_t[None], b, self.ib_t[None])
        send, recv = f.sum(axis=3) + g.sum(axis=2), f.sum(axis=2) + g.sum(axis=3)
        s = self.settings
        sharded = s.gradient_sync == "sharded"
        ar = self.ring("reducescatter" if sharded else "allreduce", params)  # (C, k)
        if sharded:
            gather = 2.0 * self.ring("allgather", params)
            send, recv = send + gather[:, None, :], recv + gather[:, None, :]
        t = view_seconds(self.view, comp.transpose(0, 2, 1), send, recv, ar[:, None, :],
                         self.steps).max(axis=1)
        mem = stage_memory(params=params, outputs=out, received=bm.sum(axis=1), inputs=inb,
                           extra=extra, in_flight=self.flight, replicas=r,
                           optimizer=s.optimizer, recompute=s.recompute_full,
                           mixed_precision=s.mixed_precision,
                           param_dtype_bytes=s.param_dtype_bytes,
                           shards=r if sharded else 1,
                           state_shards=r if s.gradient_sync == "zero1" else 1,
                           gathered=np.minimum(2.0 * s.bucket_bytes, params)
                           if sharded else 0.0)["total"]
        return np.where(mem <= self.mem_cap, t, np.inf)

    def key(self) -> tuple[float, float]:
        return float(self.stage_seconds().max()), float(self.B.sum())

    # ------------------------------------------------------------------ moves
    def _contrib(self, u: int, t: int, sign: float) -> None:
        lst = self.cons[u].get(t)
        su = int(self.a[u])
        if lst and t != su:
            self.B[su, t] += sign * max(lst)
            self.T[su, t] += sign

    def move(self, v: int, dst: int) -> None:
        """Move operator v to stage ``dst`` (no validity check)."""
        src = int(self.a[v])
        if src == dst:
            return
        producers = {u for u, _ in self.inputs[v]}
        keys = [(u, src) for u in producers] + [(u, dst) for u in producers]
        own = list(self.cons[v])
        for u, t in keys:
            self._contrib(u, t, -1.0)
        for t in own:
            self._contrib(v, t, -1.0)
        for u, nb in self.inputs[v]:
            lst = self.cons[u][src]
            lst.remove(nb)
            if not lst:
                del self.cons[u][src]
            self.cons[u].setdefault(dst, []).append(nb)
        self.a[v] = dst
        for u, t in keys:
            self._contrib(u, t, 1.0)
        for t in own:
            self._contrib(v, t, 1.0)
        for arr, w in ((self.s_meas, self.meas[v]), (self.s_flops, self.flops[v]),
                       (self.s_out, self.outb[v]), (self.s_params, self.params[v]),
                       (self.s_extra, self.extra[v]), (self.s_in, self.inb[v]),
                       (self.s_fixed, self.fixed[v])):
            arr[src] -= w
            arr[dst] += w
        self.count[src] -= 1
        self.count[dst] += 1

    def candidates(self) -> list[tuple[int, int]]:
        """Valid boundary moves ``(v, target stage)``. O(n + m)."""
        g = self.graph
        a = self.a
        n = g.num_nodes
        big = np.iinfo(np.int64).max
        min_succ = np.full(n, big, dtype=np.int64)
        max_pred = np.full(n, -1, dtype=np.int64)
        if g.num_edges:  # per-node reductions over the CSR rows (nodes with edges)
            has = np.flatnonzero(np.diff(self.succ_ptr) > 0)
            min_succ[has] = np.minimum.reduceat(a[self.succ_idx], self.succ_ptr[has])
            has = np.flatnonzero(np.diff(self.pred_ptr) > 0)
            max_pred[has] = np.maximum.reduceat(a[self.pred_idx], self.pred_ptr[has])
        ok_stage = self.count[a] > 1
        fwd = np.flatnonzero(ok_stage & (min_succ == a + 1))
        bwd = np.flatnonzero(ok_stage & (max_pred == a - 1) & (a > 0))
        return [(int(v), int(a[v]) + 1) for v in fwd] + [(int(v), int(a[v]) - 1) for v in bwd]


def refine(state: StageState, steps: int, *, check: Callable[[], bool] | None = None,
           tol: float = 1e-12) -> dict[str, float]:
    """Run up to ``steps`` refinement steps on ``state`` in place; statistics out."""
    cur = state.key()
    start = cur
    done = 0
    evaluated = 0
    for _ in range(steps):
        if check is not None and check():
            break
        best = None
        best_key = cur
        cands = state.candidates()
        worst = state.stage_seconds()
        hot = set(np.flatnonzero(worst >= worst.max() * (1 - tol)).tolist())
        # First the moves that touch a bottleneck stage (only they can lower the maximum);
        # the others (bytes only) when none of those helps.
        first = [c for c in cands if int(state.a[c[0]]) in hot or c[1] in hot]
        rest = [c for c in cands if not (int(state.a[c[0]]) in hot or c[1] in hot)]
        for group in (first, rest):
            for (v, t), key in zip(group, state.evaluate(group), strict=True):
                evaluated += 1
                if key[0] < best_key[0] * (1 - tol) or (
                        key[0] <= best_key[0] * (1 + tol) and key[1] < best_key[1] - 0.5):
                    best, best_key = (v, t), key
            if best is not None and best_key[0] < cur[0] * (1 - tol):
                break
        if best is None:
            break
        state.move(*best)
        cur = state.key()
        done += 1
    return {"refine_steps": done, "refine_moves_evaluated": evaluated,
            "refine_start": start[0], "refine_end": cur[0]}
