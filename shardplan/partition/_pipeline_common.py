"""Shared pieces of the pipeline partitioners (Parmesan section 4 and its baselines).

Plan layout (what :func:`build_plan` writes, and what issues #5 and #6 read):

- ``stages``: in pipeline order. Every partition is *monotone*: ``a[u] <= a[v]`` for every
  edge ``u -> v``, so ``{v : a[v] <= j}`` is a fronted subgraph (Definition 4.2) for every j,
  each stage is the difference of two nested fronted subgraphs (hence convex, Definition 4.6)
  and the stage graph is a chain-ordered DAG.
- ``devices``: the *consecutive* placement, stage s replica r on device ``s * R + r`` (the
  replicas of a stage are neighbours, i.e. in one box of a dgx1 topology). Transfers are
  evaluated with this placement; issue #5 remaps later.
- ``objective``: the largest stage time under the partitioner's view of the one stage-time
  model (:mod:`shardplan.cost._pipeline`): ``max_stage_seconds_overlap`` by default (the
  simulator's model: compute and sends overlap, all-reduce spread over the iteration), or
  ``max_stage_seconds`` (Parmesan's equation 3) with ``objective="eq3"``; ``lower_bound`` =
  :func:`pipeline_lower_bound` for the plan's S x R (total compute / D, the largest operator
  / R and, under ``overlap``, the gradient all-reduce no split avoids).
- ``execution``: the execution settings the plan was made with (:func:`pipeline_settings`:
  the options' micro-batch size or global batch, micro-batches, schedule, optimizer, ...),
  micro-batch size resolved; later commands read them.
- ``options``: the algorithm's options as given, with the chosen ``stages``/``replicas``
  and ``objective``.
- extra top-level fields: ``stage_bytes`` (k x k bytes stage a sends stage b per micro-batch
  forward pass, each tensor once per receiving stage), ``stage_seconds`` (per stage, ``null``
  for one that does not fit), ``placement`` (``"consecutive"``), ``search`` (per-algorithm
  statistics).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from shardplan.cost import (
    OBJECTIVE_NAMES,
    CostModel,
    StageTimes,
    pipeline_factor,
    stage_times,
    stage_traffic,
)
from shardplan.cost._collectives import measured_seconds, ring_steps
from shardplan.errors import InfeasibleError, ShardplanError
from shardplan.ir import ExecutionSettings, Graph, Objective, Plan, Stage, Topology
from shardplan.ir.settings import LEGACY_SETTING_KEYS
from shardplan.registry import Result

__all__ = ["OBJECTIVES", "SETTING_DEFAULTS", "build_plan", "placement", "shape_candidates",
           "is_monotone", "monotone_from_labels", "pipeline_settings", "tensor_bytes",
           "Deadline", "infeasible_reason", "sequence_dp", "bottleneck_split",
           "pipeline_lower_bound"]

#: The views a pipeline partitioner can optimise (``objective`` option).
OBJECTIVES = ("overlap", "eq3")

#: Options every pipeline partitioner takes besides its own: the execution settings (see
#: :class:`~shardplan.ir.ExecutionSettings`; ``global_batch`` sets the micro-batch size) and
#: the ``objective`` view.
SETTING_DEFAULTS: dict[str, Any] = {
    **{k: None for k in ExecutionSettings.__dataclass_fields__},
    **{k: None for k in LEGACY_SETTING_KEYS},
    "global_batch": None, "objective": None,
}


def pipeline_settings(options: Mapping[str, Any], graph: Graph | None = None
                      ) -> tuple[ExecutionSettings, str]:
    """The execution settings and the objective view the ``options`` ask for.

    Settings not given take :class:`~shardplan.ir.ExecutionSettings`' defaults (resolved
    against ``graph`` when given); the view defaults to ``overlap`` -- the simulator's
    model -- or to ``eq3`` when the settings turn overlap off (a device that cannot compute
    while it communicates is what equation 3 describes)."""
    keys = [k for k in SETTING_DEFAULTS if k != "objective"]
    settings, _ = ExecutionSettings().override(**{k: options.get(k) for k in keys})
    if graph is not None:
        settings = settings.resolve(graph)
    view = options.get("objective")
    if view is None:
        view = "overlap" if settings.overlap else "eq3"
    if view not in OBJECTIVES:
        raise ShardplanError(f"objective must be one of {', '.join(OBJECTIVES)}, got "
                             f"{view!r}")
    return settings, view


def infeasible_reason(st: StageTimes, seconds: np.ndarray) -> str:
    """One line naming why a partition's stage time is infinite (memory or no route)."""
    bad = np.flatnonzero(~np.isfinite(seconds))
    s = int(bad[0]) if bad.size else 0
    if not st.fits[s]:
        return (f"stage {s} needs {st.memory[s] / 2**30:.3g} GiB per device and its devices "
                f"have {st.capacity[s] / 2**30:.3g} GiB")
    return f"stage {s} must exchange data with a device it cannot reach"


class Deadline:
    """``time_limit`` seconds from construction (``None``: never)."""

    def __init__(self, time_limit: float | None) -> None:
        self.start = time.perf_counter()
        self.limit = time_limit

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def expired(self) -> bool:
        return self.limit is not None and self.elapsed() >= self.limit

    def monotonic(self) -> float | None:
        """The deadline as a ``time.monotonic()`` reading (what the simulator takes), or
        None without a limit."""
        if self.limit is None:
            return None
        return time.monotonic() + (self.limit - self.elapsed())


def placement(num_stages: int, num_replicas: int) -> np.ndarray:
    """Consecutive placement: stage s, replica r on device ``s * R + r``; shape (S, R)."""
    return np.arange(num_stages * num_replicas, dtype=np.int64).reshape(num_stages,
                                                                        num_replicas)


def shape_candidates(options: Mapping[str, Any], num_devices: int,
                     num_nodes: int) -> list[tuple[int, int]]:
    """The (S, R) pairs to try: the user's, or every ``S x R = D`` with ``S <= n``.

    With only ``stages`` given, ``R = D // S``; with only ``replicas``, ``S = D // R``.
    """
    s, r = options.get("stages"), options.get("replicas")
    for name, v in (("stages", s), ("replicas", r)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))
                              or v < 1):
            raise ShardplanError(f"{name} must be a positive integer, got {v!r}")
    if s is not None and s > num_nodes:
        raise ShardplanError(f"{s} stages need at least {s} nodes, the graph has {num_nodes}")
    if s is not None and r is not None:
        if s * r > num_devices:
            raise ShardplanError(f"{s} stages x {r} replicas need {s * r} devices, the "
                                 f"topology has {num_devices}")
        return [(int(s), int(r))]
    if s is not None:
        if s > num_devices:
            raise ShardplanError(f"{s} stages need {s} devices, the topology has "
                                 f"{num_devices}")
        return [(int(s), num_devices // int(s))]
    if r is not None:
        if r > num_devices:
            raise ShardplanError(f"{r} replicas need {r} devices, the topology has "
                                 f"{num_devices}")
        return [(min(num_devices // int(r), num_nodes), int(r))]
    return [(d, num_devices // d) for d in range(1, num_devices + 1)
            if num_devices % d == 0 and d <= num_nodes]


def is_monotone(graph: Graph, assignment: np.ndarray) -> bool:
    """Whether every edge goes from a stage to the same or a later one. O(m)."""
    return bool(np.all(assignment[graph.src] <= assignment[graph.dst]))


def monotone_from_labels(graph: Graph, labels: np.ndarray) -> np.ndarray:
    """Convex repair: the smallest monotone assignment with ``a[v] >= labels[v]``.

    ``a[v] = max(labels[v], max over predecessors u of a[u])`` in topological order; then
    stage ids are compacted (empty stages dropped, order kept). O(n + m).
    """
    a = np.asarray(labels, dtype=np.int64).copy()
    indptr, idx, _ = graph._pred_csr
    for v in graph.topological_order:
        lo, hi = indptr[v], indptr[v + 1]
        if hi > lo:
            m = a[idx[lo:hi]].max()
            if m > a[v]:
                a[v] = m
    _, a = np.unique(a, return_inverse=True)
    return a.astype(np.int64)


def tensor_bytes(graph: Graph) -> np.ndarray:
    """Per node, the largest bytes on its out-edges (its output tensor), shape (n,)."""
    tb = np.zeros(graph.num_nodes)
    if graph.num_edges:
        np.maximum.at(tb, graph.src, graph.edge_bytes.astype(np.float64))
    return tb


def build_plan(graph: Graph, topology: Topology, *, algorithm: str, assignment: np.ndarray,
               num_replicas: int, settings: ExecutionSettings, options: Mapping[str, Any],
               seed: int, deadline: Deadline, status: str,
               stats: Mapping[str, Any] | None = None,
               model: CostModel | None = None, view: str = "overlap") -> Result:
    """A :class:`Result` for a monotone ``assignment`` with the consecutive placement.

    The objective value is the ``view`` of :func:`~shardplan.cost.stage_times`, exactly as
    ``shardplan cost --objective max-stage`` recomputes it from the plan's execution
    settings. Raises :class:`~shardplan.errors.InfeasibleError` when a stage does not fit in
    its devices' memory or cannot reach a neighbour (one line naming which), and
    :class:`ShardplanError` if it uses more devices than the topology has.
    """
    a = np.asarray(assignment, dtype=np.int64)
    if not is_monotone(graph, a):
        raise AssertionError(f"{algorithm} produced a non-monotone partition")
    _, a = np.unique(a, return_inverse=True)
    a = a.astype(np.int64)
    k = int(a.max()) + 1 if a.size else 0
    if k * num_replicas > topology.num_devices:
        raise ShardplanError(f"{k} stages x {num_replicas} replicas need more devices than "
                             f"the topology's {topology.num_devices}")
    devices = placement(k, num_replicas)
    if model is None:
        model = CostModel.from_settings(graph, topology, settings)
    st = stage_times(model, a, devices, num_stages=k, order=range(k))
    seconds = st.stage_seconds(view)
    if not np.all(np.isfinite(seconds)):
        raise InfeasibleError(f"{algorithm}: no plan of {k} stages x {num_replicas} replicas: "
                              f"{infeasible_reason(st, seconds)}")
    value = float(seconds.max()) if k else 0.0
    bound = pipeline_lower_bound(model, k, int(num_replicas), view)
    bytes_m, _ = stage_traffic(model.graph, a, k)
    order = np.argsort(a, kind="stable")
    cuts = np.searchsorted(a[order], np.arange(k + 1))
    stages = tuple(Stage(tuple(int(v) for v in order[cuts[s]:cuts[s + 1]]),
                         tuple(int(d) for d in devices[s])) for s in range(k))
    recorded = {key: v for key, v in options.items() if v is not None}
    recorded["stages"], recorded["replicas"] = k, int(num_replicas)
    recorded["objective"] = view
    if deadline.expired() and status != "optimal":
        status = "timed_out"
    meta = {
        "placement": "consecutive",
        "stage_bytes": bytes_m.tolist(),
        "stage_seconds": [float(x) for x in seconds],
        "search": dict(stats or {}),
    }
    plan = Plan(graph=graph.name, topology=topology.name, algorithm=algorithm, stages=stages,
                objective=Objective(OBJECTIVE_NAMES[view], value, bound), status=status,
                seed=int(seed), options=recorded, search_seconds=deadline.elapsed(),
                meta=meta, execution=model.settings)
    return Result(plan, dict(stats or {}))


def pipeline_lower_bound(model: CostModel, num_stages: int, num_replicas: int,
                         view: str = "overlap") -> float:
    """A lower bound on the objective of every monotone split into ``num_stages`` stages
    of ``num_replicas`` replicas each on the consecutive placement (:func:`placement`):
    what :func:`build_plan` reports as the plan's ``objective.lower_bound``.

    With ``S`` stages, ``R`` replicas, ``w_v`` node v's forward + backward seconds on the
    fastest of the placed devices and ``p_v`` its parameter bytes, every stage time of
    every view is at least the stage's compute ``c_s >= sum of w_v in s / R``; under
    ``overlap`` it is ``max(c_s, send_s) + a_s / F >= c_s + a_s / F``, where ``a_s`` is
    the stage's gradient synchronisation (the ring all-reduce, or reduce-scatter under
    sharded sync) and ``F = M + P - 1`` the pipeline steps. The ring over the stage's
    replicas takes ``a_s = K max_i (l_i + P_s b_i / R)`` for ``P_s > 0`` (``K`` ring steps,
    ``l_i`` and ``b_i`` latency and inverse bandwidth of its ring links), at least
    ``K (L + P_s B / R)`` with ``B`` the smallest over stages of the slowest ring link's
    inverse bandwidth and ``L`` the smallest such link's latency: linear in the stage's
    parameters. So the largest stage time is at least

    - ``max(sum_v w_v / (S R), max_v w_v / R)`` (every view; the classic makespan bounds,
      :meth:`CostModel.lower_bound_seconds` on the placed devices);
    - under ``overlap``, the average of ``c_s + a_s / F`` over the stages,
      ``(sum_v w_v / R + K (L [P > 0] + P B / R) / F) / S``, and for every node the stage
      holding it, ``max_v (w_v / R + K (L + p_v B / R) / F [p_v > 0])``.

    The all-reduce is communication that no split avoids: the parameters have to be
    reduced across the replicas whatever the stages, and with many replicas it is often
    most of the stage time (Parmesan's c_AR, equation 7). Point-to-point sends between
    stages are left out: bounding them needs the cheapest *balanced* cut of the DAG
    (NP-hard), and the cheapest cut of any fronted subgraph is a single tensor on most
    graphs (a graph's first operator alone). The usual polynomial relaxations give nothing
    here: the linear relaxation of "a fronted subgraph holding between lo and hi of the
    memory (or parameters)" contains the uniform fractional subgraph, every node at the
    same fraction, which cuts no edge; Lagrangian multipliers on those limits reach at best
    that relaxation (closure polytopes are integral), so they too bound the sends by 0.
    ``0`` terms where the topology has measured collective curves (they need not be linear
    in the bytes). The all-reduce terms are
    rounded down by 1e-12 relative (the plan's value sums them in another order). Not from
    the papers. O(n + S R).
    """
    topo = model._topo()
    k, r = int(num_stages), int(num_replicas)
    if k < 1 or model.graph.num_nodes == 0:
        return 0.0
    dev = placement(k, r)
    used = dev.reshape(-1)
    fm, ff, bm, bf = model._work
    if model.recompute:  # the backward re-runs the forward
        bm, bf = bm + fm, bf + ff
    pairs = np.unique(np.stack([model.device_speed[used], model.device_rate[used]], axis=1),
                      axis=0)
    work = np.min([(fm + bm) / sp + (ff + bf) / rt for sp, rt in pairs], axis=0)
    bound = max(float(work.sum()) / (k * r), float(work.max()) / r)
    if view != "overlap" or r <= 1:
        return bound
    settings = model.settings
    kind = "reducescatter" if settings.gradient_sync == "sharded" else "allreduce"
    if measured_seconds(topo, kind, r, 1.0) is not None:
        return bound
    nxt = np.roll(dev, -1, axis=1)
    lat, ib = topo.latency[dev, nxt], model.inverse_bandwidth[dev, nxt]
    slow = np.argmax(ib, axis=1)
    rows = np.arange(k)
    link_lat, link_ib = float(lat[rows, slow].min()), float(ib[rows, slow].min())
    steps = ring_steps(kind, r) / float(pipeline_factor(
        settings.microbatches, -(-k // settings.stages_per_rank)))
    params = model.graph.param_bytes.astype(np.float64)
    total = float(params.sum())
    with np.errstate(invalid="ignore"):
        ring = np.where(params > 0, steps * (link_lat + params * link_ib / r), 0.0)
        avg = (float(work.sum()) / r + (steps * (link_lat + total * link_ib / r)
                                        if total > 0 else 0.0)) / k
    # (rounded down by 1e-12 relative: the plan's value sums the same terms in another
    # order, and a split that reaches this bound must not end a rounding error below it)
    return max(bound, (1.0 - 1e-12) * max(avg, float((work / r + ring).max())))


def best_of(results: list[Result], key: Any = None) -> Result:
    """The result with the smallest ``key`` (default: objective value)."""
    if key is None:
        def key(r: Result) -> float:
            return r.plan.objective.value
    return min(results, key=key)


def sequence_dp(segment_cost: Any, n: int, num_stages: int,
                check: Callable[[], bool] | None = None) -> tuple[float, np.ndarray] | None:
    """Min-max split of positions ``0..n-1`` into ``num_stages`` non-empty segments.

    ``segment_cost(i, j, s)`` returns the costs of segments ``[i, j)`` for an array ``i`` and
    one ``j`` as stage ``s`` (0-based). Returns ``(optimum, segment id of every position)``,
    or None when ``check()`` (called once per table row) says the time is up.
    The classic linear-partition DP, vectorised over i: O(n^2 S) element work, O(n S) numpy
    calls. :func:`bottleneck_split` solves the structured case in O(n) per probe.
    """
    table = np.full((num_stages + 1, n + 1), np.inf)
    table[0, 0] = 0.0
    arg = np.zeros((num_stages + 1, n + 1), dtype=np.int64)
    rows = 0
    for s in range(1, num_stages + 1):
        for j in range(s, n - (num_stages - s) + 1):
            if check is not None and rows % 64 == 0 and check():
                return None
            rows += 1
            i = np.arange(s - 1, j)
            val = np.maximum(table[s - 1, i], segment_cost(i, j, s - 1))
            b = int(np.argmin(val))
            table[s, j] = val[b]
            arg[s, j] = i[b]
    seg = np.empty(n, dtype=np.int64)
    j = n
    for s in range(num_stages, 0, -1):
        lo = int(arg[s, j])
        seg[lo:j] = s - 1
        j = lo
    return float(table[num_stages, n]), seg


def _float_order(x: float) -> int:
    """The rank of a non-negative float among all doubles (order-preserving)."""
    return int(np.array(x, dtype=np.float64).view(np.int64))


def _from_order(k: int) -> float:
    return float(np.array(k, dtype=np.int64).view(np.float64))


def bottleneck_split(prefixes: Sequence[np.ndarray], coefs: Sequence[float], cut: np.ndarray,
                     num_stages: int, check: Callable[[], bool] | None = None
                     ) -> tuple[float, np.ndarray] | None:
    """Min-max split of positions ``0..n-1`` into exactly ``num_stages`` non-empty segments
    when a segment's cost is monotone in its extent plus a cost per cut.

    The cost of segment ``[i, j)`` is ``max(max_k coefs[k] * (prefixes[k][j] -
    prefixes[k][i]), cut[i] if i > 0 else 0)`` with every ``prefixes[k]`` non-decreasing,
    shape (n + 1,), and ``cut`` shape (n + 1,) (``cut[i]``: cutting before position i). It is
    the same optimum as :func:`sequence_dp` with that cost, found by bisection on the value:

    ``t`` is feasible iff the greedy split that extends every segment as far as the value
    allows and cuts at the last allowed position (``cut <= t``) needs at most S segments, and
    at least S - 1 cuts are allowed (extra allowed cuts only shorten segments, so every count
    between the greedy's and that is reachable). The greedy is optimal for the count because
    a segment that starts later reaches at least as far (monotone cost). Feasibility is
    monotone in ``t``, so bisection over the doubles (ordered as integers: at most 64 probes)
    finds the smallest feasible value exactly; the split built at it has that value.

    Returns ``(optimum, segment id of every position)``, or None if ``check()`` (called once
    per probe) says the time is up. O(n + S log n) per probe, O(64 (n + S log n)) in all.
    Not from the papers: PipeDream's and Parmesan's DPs are O(n^2 S); this form is what
    makes the sequence start cheap on graphs of 10^4 operators.
    """
    n = int(prefixes[0].shape[0]) - 1
    s_want = int(num_stages)
    if not 1 <= s_want <= n:
        raise ValueError(f"cannot split {n} positions into {s_want} segments")
    qs = [np.asarray(q, dtype=np.float64) for q in prefixes]
    cs = [float(c) for c in coefs]
    cut = np.asarray(cut, dtype=np.float64)

    def seg_cost(i: int, j: int) -> float:
        c = max(c_k * (q[j] - q[i]) for c_k, q in zip(cs, qs, strict=True))
        return max(c, float(cut[i])) if i > 0 else c

    def reach(i: int, t: float) -> int:
        """Largest j > i with the monotone part of cost([i, j)) <= t (i if none)."""
        j = n
        for c_k, q in zip(cs, qs, strict=True):
            if c_k > 0:
                j = min(j, int(np.searchsorted(q, q[i] + t / c_k, side="right")) - 1)
        j = max(j, i)

        def mono(jj: int) -> float:
            return max(c_k * (q[jj] - q[i]) for c_k, q in zip(cs, qs, strict=True))

        while j > i and mono(j) > t:  # the division above may round either way
            j -= 1
        while j < n and mono(j + 1) <= t:
            j += 1
        return j

    def greedy(t: float) -> list[int] | None:
        """Cut positions of the greedy split at ``t`` (at most S - 1), or None."""
        allowed = np.flatnonzero(cut[1:n] <= t) + 1
        if allowed.size < s_want - 1:
            return None
        cuts: list[int] = []
        start = 0
        while True:
            j = reach(start, t)
            if j >= n:
                return cuts
            k = int(np.searchsorted(allowed, j, side="right")) - 1
            if k < 0 or allowed[k] <= start:
                return None
            start = int(allowed[k])
            cuts.append(start)
            if len(cuts) > s_want - 1:
                return None

    hi_value = max(seg_cost(0, n), float(cut[1:n].max()) if n > 1 else 0.0)
    lo, hi = -1, _float_order(hi_value)  # lo infeasible (below 0.0), hi feasible
    while hi - lo > 1:
        if check is not None and check():
            return None
        mid = (lo + hi) // 2
        if greedy(_from_order(mid)) is None:
            lo = mid
        else:
            hi = mid
    t = _from_order(hi)
    cuts = greedy(t)
    assert cuts is not None
    if len(cuts) < s_want - 1:  # add allowed cuts, cheapest first, to reach S segments
        used = set(cuts)
        extra = [int(i) for i in np.flatnonzero(cut[1:n] <= t) + 1 if int(i) not in used]
        extra.sort(key=lambda i: (float(cut[i]), i))
        cuts = sorted(cuts + extra[:s_want - 1 - len(cuts)])
    bounds = [0, *cuts, n]
    seg = np.repeat(np.arange(s_want, dtype=np.int64), np.diff(bounds))
    value = max(seg_cost(bounds[k], bounds[k + 1]) for k in range(s_want))
    return value, seg
