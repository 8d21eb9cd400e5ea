"""Parmesan's dynamic programming over fronted subgraphs (paper 002, section 4.1, eq. 2-3).

The DP runs on *units*: the operators themselves, or the hyper-operators of
:mod:`._pipeline_cluster`. A stage is the difference ``F - F'`` of two nested fronted
subgraphs (down-closed unit sets); the table is ``T[F, c]`` = the smallest possible largest
stage time when ``F`` is split into ``c`` stages, the c-th of which is ``F - F'``::

    T[F, c] = min over fronted F' (strict subset of F) of max(T[F', c - 1], t_{c-1}(F - F'))

with ``T[{}, 0] = 0``. The replica count is the constant R (the paper's ``d - d'`` taken as
a constant, section 4.1), so the device dimension of the paper's table disappears.

Stage time (``t_j``, stage j of the pipeline, on the devices of the consecutive placement):
the partitioner's view (``eq3`` or ``overlap``, :func:`shardplan.cost.view_seconds`) of
compute (forward + backward, the slowest of its R devices) / R and of the messages the stage
sends and receives -- each tensor it sends or receives costs ``latency + bytes / (R *
bandwidth)`` once as a send and once as a receive (activations forward, gradients backward)
-- plus, for ``overlap``, its gradient all-reduce over the iteration's pipeline steps;
``inf`` when its memory (:func:`shardplan.cost._formulas.stage_memory` with the
micro-batches stage j keeps in flight) exceeds the smallest memory of its devices. This is
:func:`shardplan.cost.stage_times` with two simplifications that make the stage time a
function of the node set alone, as equation 3 requires:

- links are one nominal link (the median latency and inverse bandwidth between the placed
  devices), the all-reduce ring's too; exact on flat topologies;
- a tensor the stage sends is charged either once (``sends="once"``) or once per consumer
  unit outside ``F`` but at most ``S - 1 - j`` times, once per later stage
  (``sends="bounded"``); the cost model charges it once per receiving stage, which lies
  between the two. Received tensors are exact.

So the DP is exact for either *surrogate*. On flat topologies, when every out-edge of a node
carries the same bytes, ``once`` is a lower bound and ``bounded`` an upper bound of the cost
model's stage times: the ``once`` optimum is a lower bound of the true optimum (a plan that
reaches it is optimal), and a ``bounded`` plan is never worse, under the cost model, than
the value its DP reports. The partitioner runs both and keeps the better plan.

Complexity: enumerating the ``N`` fronted subgraphs is O(N K) (``K`` units); the subset
matrix O(N^2 K) (one matrix product); the DP O(sum over F of |F_F| (P + K + S R)) where
``|F_F|`` is the number of fronted subgraphs of F and P the units' boundary producers. For a
chain, N = K + 1 and the DP is O(K^2 (P + S R)).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from shardplan.cost import CostModel, pipeline_factor, ring_allreduce_seconds, view_seconds
from shardplan.cost._collectives import measured_seconds, ring_steps
from shardplan.cost._formulas import stage_memory, sync_shards, work_seconds
from shardplan.cost._memory import in_flight_microbatches
from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, Topology

__all__ = ["MAX_STAGE_DEVICES", "StageContext", "Units", "enumerate_fronted", "fronted_dp",
           "surrogate_seconds"]

#: Most devices a pipeline shape (stages x replicas) may use: its context takes the median of
#: the latency and bandwidth over every pair of them, O(devices^2) memory (128 MiB per
#: float64 matrix here).
MAX_STAGE_DEVICES = 4096


@dataclass(frozen=True, eq=False)
class Units:
    """A partition of the operators into convex units whose quotient graph is a DAG.

    Attributes
    ----------
    unit_of : ndarray of int64, shape (n,)
    num_units : int
    work : ndarray, shape (K, 2)
        Per unit, measured seconds and FLOPs of forward + backward.
    params, outputs, extra, inputs : ndarray, shape (K,)
        ``inputs``: output bytes of the unit's graph inputs (nodes without predecessors),
        what a stage keeps per micro-batch under recomputation.
    prod_unit : ndarray of int64, shape (P,)
        The unit of every operator that sends a tensor out of its unit.
    prod_bytes : ndarray, shape (P,)
        That tensor's bytes.
    prod_cons : scipy.sparse.csr_matrix, shape (P, K)
        1 where the producer has a consumer in that (other) unit.
    preds : list of int
        Per unit, a bit mask of its predecessor units.
    """

    unit_of: np.ndarray
    num_units: int
    work: np.ndarray
    params: np.ndarray
    outputs: np.ndarray
    extra: np.ndarray
    inputs: np.ndarray
    prod_unit: np.ndarray
    prod_bytes: np.ndarray
    prod_cons: sp.csr_matrix
    preds: list[int]

    @cached_property
    def order(self) -> np.ndarray:
        """A topological order of the units (Kahn's algorithm on ``preds``). O(K^2 / 64)."""
        k = self.num_units
        indeg = [bin(p).count("1") for p in self.preds]
        succ: list[list[int]] = [[] for _ in range(k)]
        for v, p in enumerate(self.preds):
            while p:
                low = p & -p
                succ[low.bit_length() - 1].append(v)
                p ^= low
        ready = [v for v in range(k) if indeg[v] == 0]
        out = []
        while ready:
            u = ready.pop()
            out.append(u)
            for v in succ[u]:
                indeg[v] -= 1
                if indeg[v] == 0:
                    ready.append(v)
        return np.asarray(out, dtype=np.int64)

    @cached_property
    def cons_total(self) -> np.ndarray:
        """Consumer units of every producer, shape (P,), float32."""
        return np.diff(self.prod_cons.indptr).astype(np.float32)

    @classmethod
    def from_assignment(cls, graph: Graph, unit_of: np.ndarray,
                        num_units: int | None = None, *, recompute: bool = False,
                        model: CostModel | None = None) -> Units:
        """Units from an operator -> unit map (units must be convex, quotient acyclic);
        ``recompute`` adds each forward to its backward work, ``model`` prices the nodes
        (its measured and FLOP parts, roofline included; default: the graph's own columns).
        O(n + m)."""
        from shardplan.cost import split_work

        u = np.asarray(unit_of, dtype=np.int64)
        k = int(u.max()) + 1 if num_units is None else int(num_units)
        fm, ff, bm, bf = split_work(graph) if model is None else model._work
        if recompute:  # the backward re-runs the forward
            bm, bf = bm + fm, bf + ff
        work = np.stack([np.bincount(u, weights=fm + bm, minlength=k),
                         np.bincount(u, weights=ff + bf, minlength=k)], axis=1)
        params = np.bincount(u, weights=graph.param_bytes.astype(np.float64), minlength=k)
        outputs = np.bincount(u, weights=graph.output_bytes.astype(np.float64), minlength=k)
        extra = np.zeros(k) if graph.memory_bytes is None else np.bincount(
            u, weights=np.nan_to_num(graph.memory_bytes, nan=0.0), minlength=k)
        is_input = graph.in_degree == 0
        inputs = np.bincount(u[is_input], weights=graph.output_bytes[is_input].astype(
            np.float64), minlength=k)
        us, ud = u[graph.src], u[graph.dst]
        cross = us != ud
        pos = cross & (graph.edge_bytes > 0)
        prods, pidx = np.unique(graph.src[pos], return_inverse=True)
        pbytes = np.zeros(prods.size)
        np.maximum.at(pbytes, pidx, graph.edge_bytes[pos].astype(np.float64))
        cons = sp.csr_matrix((np.ones(pidx.size), (pidx, ud[pos])), shape=(prods.size, k))
        cons.data[:] = 1.0
        cons.sum_duplicates()
        cons.data[:] = 1.0
        preds = [0] * k
        for a, b in set(zip(us[cross].tolist(), ud[cross].tolist(), strict=True)):
            preds[b] |= 1 << a
        return cls(u, k, work, params, outputs, extra, inputs, u[prods], pbytes, cons, preds)


@dataclass(frozen=True, eq=False)
class StageContext:
    """What a stage time needs besides its node set: R, the placement, memory, one link,
    the settings and the view."""

    num_stages: int
    num_replicas: int
    speed: np.ndarray  # (S, R) measured-time speed of each stage replica's device
    rate: np.ndarray  # (S, R) effective FLOP/s
    memory: np.ndarray  # (S,) smallest device memory of each stage
    in_flight: np.ndarray  # (S,)
    settings: ExecutionSettings
    view: str
    latency: float
    inv_bandwidth: float
    topology: Topology | None = None

    def collective(self, kind: str, nbytes: np.ndarray) -> np.ndarray:
        """Seconds of a collective over a stage's R replicas for ``nbytes``: the topology's
        measured curve for R devices when it has one, else the ring on the nominal link."""
        r = self.num_replicas
        if r <= 1:
            return np.zeros_like(np.asarray(nbytes, dtype=np.float64))
        if self.topology is not None:
            measured = measured_seconds(self.topology, kind, r, nbytes)
            if measured is not None:
                return np.asarray(measured, dtype=np.float64)
        full = ring_allreduce_seconds(r, nbytes, self.latency, self.inv_bandwidth)
        return full * ring_steps(kind, r) / (2 * (r - 1))

    @property
    def state_factor(self) -> float:
        """Memory per parameter byte that does not depend on the micro-batch (parameters,
        gradients, optimizer state and master weights), as :func:`stage_memory` counts,
        per device of a stage on ``num_replicas`` replicas: split over them under FSDP
        (``sharded``: all of it) and the distributed optimizer (``zero1``: master weights
        and optimizer state), so that the clustering's memory check admits what fits only
        sharded."""
        shards, state_shards = sync_shards(self.settings.gradient_sync, self.num_replicas)
        return float(stage_memory(params=1.0, outputs=0.0, received=0.0, inputs=0.0,
                                  extra=0.0, in_flight=0.0, replicas=1,
                                  optimizer=self.settings.optimizer, recompute=False,
                                  mixed_precision=self.settings.mixed_precision,
                                  param_dtype_bytes=self.settings.param_dtype_bytes,
                                  shards=shards, state_shards=state_shards)["total"])

    @classmethod
    def build(cls, model: CostModel, topology: Topology, settings: ExecutionSettings,
              num_stages: int, num_replicas: int, view: str = "overlap") -> StageContext:
        dev = np.arange(num_stages * num_replicas).reshape(num_stages, num_replicas)
        used = dev.reshape(-1)
        if used.size > MAX_STAGE_DEVICES:
            raise ShardplanError(f"{num_stages} stages x {num_replicas} replicas use "
                                 f"{used.size} devices; pipeline partitioning prices at most "
                                 f"{MAX_STAGE_DEVICES} (the median over every pair of them)")
        if used.size > 1:
            off = ~np.eye(used.size, dtype=bool)
            lat = float(np.median(topology.latency[np.ix_(used, used)][off]))
            inv = float(np.median(model.inverse_bandwidth[np.ix_(used, used)][off]))
        else:
            lat = inv = 0.0
        flight = in_flight_microbatches(num_stages, int(settings.microbatches),
                                        settings.schedule,
                                        virtual_stages=settings.virtual_stages)
        return cls(num_stages, num_replicas, model.device_speed[dev], model.device_rate[dev],
                   topology.device_memory[dev].min(axis=1).astype(np.float64),
                   flight.astype(np.float64), settings, view, lat, inv, topology)

    def stage_times(self, work: np.ndarray, params: np.ndarray, outputs: np.ndarray,
                    extra: np.ndarray, inputs: np.ndarray, recv_bytes: np.ndarray,
                    tensors: np.ndarray, tensor_bytes: np.ndarray) -> np.ndarray:
        """Stage times of candidate node sets at every stage position, shape (S, c).

        ``tensors`` and ``tensor_bytes`` (sent plus received) have shape (S, c) or (c,):
        each is one message the stage sends (an activation, or the gradient of what it
        received) and one it receives, so ``send = recv``.
        """
        r = self.num_replicas
        s = self.settings
        xfer = tensors * self.latency + tensor_bytes / r * self.inv_bandwidth
        comp = work_seconds(work[None, None, :, 0], work[None, None, :, 1],
                            self.speed[:, :, None], self.rate[:, :, None]).max(axis=1) / r
        sharded = s.gradient_sync == "sharded"
        ar = self.collective("reducescatter" if sharded else "allreduce", params)[None, :]
        if sharded:  # two all-gathers of the stage's parameters every micro-batch
            xfer = xfer + 2.0 * self.collective("allgather", params)[None, :]
        steps = pipeline_factor(s.microbatches, -(-self.num_stages // s.stages_per_rank))
        times = view_seconds(self.view, comp, xfer, xfer, ar, steps)
        mem = stage_memory(params=params[None, :], outputs=outputs[None, :],
                           received=recv_bytes[None, :], inputs=inputs[None, :],
                           extra=extra[None, :], in_flight=self.in_flight[:, None],
                           replicas=r, optimizer=s.optimizer, recompute=s.recompute_full,
                           mixed_precision=s.mixed_precision,
                           param_dtype_bytes=s.param_dtype_bytes,
                           shards=r if sharded else 1,
                           state_shards=r if s.gradient_sync == "zero1" else 1,
                           gathered=np.minimum(2.0 * s.bucket_bytes, params[None, :])
                           if sharded else 0.0)["total"]
        return np.where(mem <= self.memory[:, None], times, np.inf)


def enumerate_fronted(preds: list[int], cap: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Every fronted (down-closed) unit set, by size: ``(masks as bool (N, K), sizes)``.

    ``None`` when there are more than ``cap``. Breadth-first from the empty set; a set of size
    i + 1 is a set of size i plus one unit whose predecessors it contains. O(N K).
    """
    k = len(preds)
    order: list[int] = [0]
    parent: list[int] = [-1]
    added: list[int] = [-1]
    index = {0: 0}
    frontier = [0]
    while frontier:
        nxt = []
        for f in frontier:
            fi = index[f]
            for v in range(k):
                bit = 1 << v
                if not f & bit and preds[v] & ~f == 0:
                    g = f | bit
                    if g not in index:
                        index[g] = len(order)
                        order.append(g)
                        parent.append(fi)
                        added.append(v)
                        nxt.append(g)
                        if len(order) > cap:
                            return None
        frontier = nxt
    n = len(order)
    masks = np.zeros((n, k), dtype=bool)
    for i in range(1, n):
        masks[i] = masks[parent[i]]
        masks[i, added[i]] = True
    return masks, masks.sum(axis=1)


def _candidate_terms(units: Units, lattice: tuple[np.ndarray, ...], j: int, cands: np.ndarray,
                     num_stages: int, sends: str) -> tuple[np.ndarray, ...]:
    """Sums and tensors of the candidate stages ``F_j - F'`` for every F' in ``cands``.

    ``lattice`` is :func:`_lattice_arrays` of the fronted subgraphs: everything is a
    difference of two rows, since F' is a subset of F_j. Tensors and their bytes come out per
    stage position, shape (S, c): a tensor the stage sends is charged ``min(consumer units
    outside F_j, S - 1 - position)`` times (``sends="bounded"``) or once (``"once"``).
    """
    fa, in_f, cons_in = lattice
    sums = fa[j][None, :] - fa[cands]
    cols = np.flatnonzero(in_f[j] > 0.5)  # only producers inside F_j can matter
    rows = np.ix_(cands, cols)
    in_x = (in_f[j, cols][None, :] - in_f[rows]) > 0.5  # producer in F_j - F'  (c, P')
    has_cons = (cons_in[j, cols][None, :] - cons_in[rows]) > 0.5  # a consumer in F_j - F'
    recv = (has_cons & ~in_x).astype(np.float64)
    out_n = units.cons_total[cols] - cons_in[j, cols]  # consumer units outside F_j
    if sends == "once":
        out_n = np.minimum(out_n, 1.0)
    send = (in_x & (out_n > 0.5)[None, :]).astype(np.float64)
    prod_bytes = units.prod_bytes[cols]
    recv_b = recv @ prod_bytes
    recv_n = recv.sum(axis=1)
    ks = np.arange(1, num_stages)
    ge = (out_n[:, None] >= ks[None, :] - 0.5).astype(np.float64)  # (P, S - 1)
    zero = np.zeros((cands.size, 1))
    cum_n = np.hstack([zero, np.cumsum(send @ ge, axis=1)])  # (c, S): by cap 0..S-1
    cum_b = np.hstack([zero, np.cumsum(send @ (ge * prod_bytes[:, None]), axis=1)])
    cap = num_stages - 1 - np.arange(num_stages)  # per position
    tens = recv_n[None, :] + cum_n[:, cap].T
    tens_b = recv_b[None, :] + cum_b[:, cap].T
    return (sums[:, 0:2], sums[:, 2], sums[:, 3], sums[:, 4], sums[:, 5], recv_b, tens,
            tens_b)


def _lattice_arrays(units: Units, masks: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per fronted subgraph: attribute sums (N, 6), producers inside (N, P) and, per
    producer, its consumer units inside (N, P). O(N (K + nnz))."""
    mf = masks.astype(np.float64)
    attrs = np.column_stack([units.work, units.params, units.outputs, units.extra,
                             units.inputs])
    in_f = masks[:, units.prod_unit].astype(np.float32)
    cons_in = np.asarray((units.prod_cons @ mf.T).T, dtype=np.float32)
    return mf @ attrs, in_f, cons_in


def fronted_dp(units: Units, ctx: StageContext, fronted: tuple[np.ndarray, np.ndarray], *,
               sends: str = "bounded", check: Callable[[], bool] | None = None
               ) -> tuple[float, np.ndarray] | None:
    """Equation 2 over the given fronted subgraphs: ``(optimum, unit -> stage)``.

    Returns ``None`` when ``check()`` turns true (time limit) before the table is full. The
    optimum is ``inf`` (and the assignment a best effort) when no partition fits in memory.
    """
    masks, _ = fronted
    n_f, k = masks.shape
    s_max = ctx.num_stages
    lattice = _lattice_arrays(units, masks)
    upper = _upper_bound(units, ctx, sends)
    fastest = (float(ctx.speed.max()), float(ctx.rate.max()))
    # sub[i, j] = |F_i - F_j|; F_i is a subset of F_j iff 0.
    m32 = masks.astype(np.float32)
    sub = m32 @ (1.0 - m32).T
    table = np.full((n_f, s_max + 1), np.inf)
    table[0, 0] = 0.0
    arg = np.full((n_f, s_max + 1), -1, dtype=np.int64)
    for j in range(1, n_f):
        if check is not None and j % 64 == 0 and check():
            return None
        cands = np.flatnonzero(sub[:, j] == 0)
        cands = cands[cands != j]
        if np.isfinite(upper):
            # Pruning: a stage slower than a known solution is in no optimal one.
            w = lattice[0][j, 0:2][None, :] - lattice[0][cands, 0:2]
            low = (w[:, 0] / fastest[0] + w[:, 1] / fastest[1]) / ctx.num_replicas
            cands = cands[low <= upper * (1 + 1e-9)]
            if cands.size == 0:
                continue
        work, params, outputs, extra, inputs, recv_b, tens, tens_b = _candidate_terms(
            units, lattice, j, cands, s_max, sends)
        times = ctx.stage_times(work, params, outputs, extra, inputs, recv_b, tens,
                                tens_b)  # (S, c)
        prev = table[cands, :s_max]  # (c, S): T[F', c - 1] for c = 1..S
        val = np.maximum(prev, times.T)
        best = np.argmin(val, axis=0)
        table[j, 1:] = val[best, np.arange(s_max)]
        arg[j, 1:] = cands[best]
    full = n_f - 1
    value = float(table[full, s_max])
    stage_of_unit = np.zeros(k, dtype=np.int64)
    j, c = full, s_max
    while c > 0 and j > 0:
        i = int(arg[j, c])
        if i < 0:
            break
        stage_of_unit[masks[j] & ~masks[i]] = c - 1
        j, c = i, c - 1
    return value, stage_of_unit


def _upper_bound(units: Units, ctx: StageContext, sends: str) -> float:
    """The surrogate value of two simple partitions of a topological order of the units
    (equal counts, balanced compute): a solution the DP's optimum cannot exceed."""
    k, s_max = units.num_units, ctx.num_stages
    if k < s_max:
        return np.inf
    order = units.order
    work = units.work[order, 0] + units.work[order, 1] / float(ctx.rate.max())
    best = np.inf
    counts = np.arange(k) * s_max // k
    cum = np.cumsum(work) - work / 2
    total = float(work.sum())
    balanced = np.minimum((cum / total * s_max).astype(np.int64), s_max - 1) if total > 0 \
        else counts
    for pos in (counts, balanced):
        if len(set(pos.tolist())) < s_max:
            continue
        stage_of_unit = np.empty(k, dtype=np.int64)
        stage_of_unit[order] = pos
        best = min(best, surrogate_seconds(units, ctx, stage_of_unit, sends))
    return best


def surrogate_seconds(units: Units, ctx: StageContext, stage_of_unit: np.ndarray,
                      sends: str = "bounded") -> float:
    """The DP's objective (the largest surrogate stage time) of a unit -> stage map."""
    s_max = ctx.num_stages
    worst = 0.0
    for s in range(s_max):
        masks = np.stack([stage_of_unit < s, stage_of_unit <= s])
        terms = _candidate_terms(units, _lattice_arrays(units, masks), 1, np.array([0]), s_max,
                                 sends)
        t = ctx.stage_times(*terms)[s, 0]
        worst = max(worst, float(t))
    return worst
