"""``pipedream``: PipeDream's optimizer (Narayanan et al., SOSP 2019, section 3.1), a baseline
for Parmesan.

PipeDream splits a DNN into stages, each replicated on its own number of workers, so that
the slowest stage of the pipeline is as fast as possible. Its optimizer
(``optimizer/optimizer_graph_hierarchical.py`` in msr-fiddle/pipedream) does it by dynamic
programming over the graph's *antichain DAG*: every state is a down-closed set of layers (the
predecessors of an antichain), a stage is the difference of two nested states, and

    A(j, m) = min( t(0 -> j, m),
                   min over states k inside j, 1 <= m' < m of max(A(k, m - m'), t(k -> j, m')) )

is the best pipeline of state j on exactly m workers, t the stage time of
:mod:`._pipedream_model` (compute plus weight synchronisation over the stage's replicas, its
activation transfers). Two levels (e.g. GPUs in servers) solve the same DP inside every range
of states with the ``n1`` workers of one group, then across groups with the range's inner
optimum as its compute (the hierarchical optimizer).

What we take from the code and what we decided:

- states: every down-closed node set of the graph (PipeDream reaches the same sets from its
  antichains); when there are more than ``max_states`` (default 1000; 200 with two levels,
  whose level-1 DP runs from every state; branchy graphs, for which PipeDream's README asks
  users to compress the branches by hand), the prefixes of a topological order, thinned to
  ``max_states`` cut points at equal steps of cumulative work and of node count, and the
  status is ``feasible`` instead of ``optimal``;
- the input and ``__getitem__`` nodes PipeDream drops are dropped by the importer
  (``shardplan import pipedream``);
- levels: two when the topology has a level of equal groups of more than one device (the
  innermost such, e.g. a dgx1 box) and the plan uses every device; the bandwidth of a level
  is the median bandwidth of the device pairs it joins (``bandwidths`` overrides them);
- transfers: on, compression 1 (the paper's ``2 C_i``; PipeDream's code has them only with
  ``--activation_compression_ratio``); ``transfers=false`` is its default;
- memory is not a constraint (PipeDream's default; ``--use_memory_constraint`` is not
  implemented), nor are fewer workers than the budget (``--use_fewer_machines``);
- ``stages`` / ``replicas`` (what every pipeline partitioner takes) fix every stage's
  replica count to R on S x R workers: PipeDream's ``--straight_pipeline`` generalised.

The plan: stages in pipeline order with their own replica counts; stage s of a one-level plan
uses the next ``r_s`` devices, a two-level plan's stage runs on ``rho`` consecutive devices of
each of its range's groups. Objective ``pipedream_seconds`` (``shardplan cost --objective
pipedream``), lower bound total work / devices (every stage time is at least its work over its
replicas). ``pipedream_ranges`` (two levels) lists ``[first stage, stop stage, groups]``.

Complexity: enumerating N states O(N m); the one-level DP O(N^2 M^2) element work (M
workers) vectorised over the candidate states; two levels O(N^3 n1^2 + N^2 n2^2).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, Objective, Plan, Stage, Topology
from shardplan.partition._pipedream_model import (
    OBJECTIVE,
    PipeDreamConfig,
    evaluate_stages,
    node_work,
    prefix_cut_bytes,
    stage_seconds,
)
from shardplan.partition._pipeline_common import (
    SETTING_DEFAULTS,
    Deadline,
    pipeline_settings,
    tensor_bytes,
)
from shardplan.registry import Progress, Result, register, take_options

__all__ = ["States", "pipedream_partition"]

DEFAULTS: dict[str, Any] = {"stages": None, "replicas": None, "devices": None, "levels": None,
                            "bandwidths": None, "transfers": True, "compression": 1.0,
                            "max_states": 1000,
                            **{k: v for k, v in SETTING_DEFAULTS.items() if k != "objective"}}
_TWO_LEVEL_STATES = 200  # two levels solve the level-1 DP from every state: O(N^3 n1^2)


# ---------------------------------------------------------------------------- states
def _ideals(graph: Graph, cap: int) -> np.ndarray | None:
    """Every down-closed node set, as bool rows sorted by size (empty first), or None when
    there are more than ``cap``. Level by level: a set of size i + 1 is one of size i plus a
    node whose predecessors it holds. O(N m) with N sets."""
    n = graph.num_nodes
    if n + 1 > cap:
        return None  # a DAG on n nodes has at least n + 1 of them
    adj = sp.csr_matrix((np.ones(graph.num_edges, dtype=np.float32), (graph.src, graph.dst)),
                        shape=(n, n))
    adj.sum_duplicates()
    adj.data[:] = 1.0
    indeg = np.asarray(adj.sum(axis=0)).ravel()
    adj_t = adj.T.tocsr()
    frontier = np.zeros((1, n), dtype=bool)
    levels = [frontier]
    total = 1
    for _ in range(n):
        held = np.asarray(adj_t @ frontier.T.astype(np.float32)).T  # predecessors held
        f_idx, v_idx = np.nonzero(~frontier & (held == indeg[None, :]))
        # A graph with at most ``cap`` sets has antichains of at most log2(cap) nodes, so a
        # set has at most that many extensions: more pairs than 16 cap mean more sets than
        # cap (and would cost memory to deduplicate).
        if f_idx.size > 16 * cap:
            return None
        nxt = frontier[f_idx].copy()
        nxt[np.arange(f_idx.size), v_idx] = True
        _, first = np.unique(np.packbits(nxt, axis=1), axis=0, return_index=True)
        frontier = nxt[np.sort(first)]
        total += frontier.shape[0]
        if total > cap:
            return None
        levels.append(frontier)
    return np.concatenate(levels, axis=0)


def _containment(masks: np.ndarray) -> np.ndarray:
    """``sub[k, j]``: set k is inside set j. O(N^2 n / 64)."""
    n_sets, n = masks.shape
    packed = np.packbits(masks, axis=1)
    pad = (-packed.shape[1]) % 8
    if pad:
        packed = np.concatenate([packed, np.zeros((n_sets, pad), dtype=np.uint8)], axis=1)
    words = packed.view(np.uint64)
    sub = np.empty((n_sets, n_sets), dtype=bool)
    for j in range(n_sets):
        sub[:, j] = ~np.any(words & ~words[j], axis=1)
    return sub


@dataclass(frozen=True, eq=False)
class States:
    """The DP's states: nested node sets from empty (index 0) to the whole graph (last).

    Attributes
    ----------
    work, params, cut : ndarray, shape (N,)
        Forward + backward seconds and parameter bytes inside each set, bytes of the tensors
        leaving it.
    sub : ndarray of bool, shape (N, N)
        ``sub[k, j]``: set k is inside set j.
    mode : str
        ``ideals`` (every down-closed set), ``prefixes`` (of a topological order) or
        ``thinned prefixes``.
    masks : ndarray of bool (N, n), or None
        The sets (ideals mode); prefixes are ``order[:cuts[i]]``.
    """

    work: np.ndarray
    params: np.ndarray
    cut: np.ndarray
    sub: np.ndarray
    mode: str
    masks: np.ndarray | None
    order: np.ndarray
    cuts: np.ndarray

    @property
    def size(self) -> int:
        return int(self.work.shape[0])

    def nodes_between(self, k: int, j: int) -> np.ndarray:
        """The nodes of set j not in set k (k inside j)."""
        if self.masks is not None:
            return np.flatnonzero(self.masks[j] & ~self.masks[k])
        return np.sort(self.order[self.cuts[k]:self.cuts[j]])

    @classmethod
    def build(cls, graph: Graph, work: np.ndarray, cap: int, min_states: int) -> States:
        """Every down-closed set when there are at most ``cap``, else topological prefixes
        (thinned to ``max(cap, min_states)``). O(N m + N^2 n / 64)."""
        n = graph.num_nodes
        params = graph.param_bytes.astype(np.float64)
        tb = tensor_bytes(graph)
        order = graph.topological_order
        masks = _ideals(graph, cap)
        if masks is not None:
            f = masks.astype(np.float64)
            leaving = np.zeros((masks.shape[0], n), dtype=bool)
            if graph.num_edges:
                cross = masks[:, graph.src] & ~masks[:, graph.dst]  # edge leaves the set
                inc_t = sp.csr_matrix((np.ones(graph.num_edges),
                                       (graph.src, np.arange(graph.num_edges))),
                                      shape=(n, graph.num_edges))
                leaving = np.asarray(inc_t @ cross.T.astype(np.float64)).T > 0
            return cls(f @ work, f @ params, leaving.astype(np.float64) @ tb,
                       _containment(masks), "ideals", masks, order,
                       np.zeros(0, dtype=np.int64))
        pos = np.arange(n + 1)
        mode = "prefixes"
        limit = max(cap, min_states)
        if n + 1 > limit:  # cut points at equal steps of cumulative work (and of count)
            cum = np.concatenate(([0.0], np.cumsum(work[order])))
            total = cum[-1]
            want = np.linspace(0.0, total, limit) if total > 0 else np.zeros(0)
            by_work = np.searchsorted(cum, want)
            by_count = np.linspace(0, n, limit).round().astype(np.int64)
            pos = np.unique(np.concatenate(([0, n], by_work, by_count)))
            pos = pos[(pos >= 0) & (pos <= n)]
            if pos.size > limit:  # keep every other count point until it fits
                keep = np.unique(np.concatenate(([0, pos.size - 1],
                                                 np.linspace(0, pos.size - 1, limit)
                                                 .round().astype(np.int64))))
                pos = pos[keep]
            mode = "thinned prefixes"
        stage_of = np.empty(n, dtype=np.int64)
        stage_of[order] = np.searchsorted(pos, np.arange(n), side="right") - 1
        k = pos.size - 1
        wsum = np.concatenate(([0.0], np.cumsum(np.bincount(stage_of, weights=work,
                                                            minlength=k))))
        psum = np.concatenate(([0.0], np.cumsum(np.bincount(stage_of, weights=params,
                                                            minlength=k))))
        cut = prefix_cut_bytes(graph, stage_of, k)
        sub = np.triu(np.ones((pos.size, pos.size), dtype=bool))
        return cls(wsum, psum, cut, sub, mode, None, order, pos)


# ---------------------------------------------------------------------------- the DP
@dataclass
class _Table:
    """``value[j, m]`` and how it was reached: ``prev[j, m]`` (-1: one stage from the start)
    and ``width[j, m]`` (workers of the last stage)."""

    value: np.ndarray
    prev: np.ndarray
    width: np.ndarray


def _level_dp(states: States, start: int, workers: int, allowed: np.ndarray,
              first_cost: Callable[[np.ndarray], np.ndarray],
              stage_cost: Callable[[np.ndarray, int], np.ndarray],
              check: Callable[[], bool]) -> _Table | None:
    """A(j, m) for every state j containing ``start`` and m = 0..workers (exactly m).

    ``first_cost(js)``: (len(js), workers + 1) costs of the stages from ``start`` to each j;
    ``stage_cost(ks, j)``: (len(ks), workers + 1) of the stages from each k to j; only the
    widths in ``allowed`` (bool, workers + 1) are tried. None when ``check()`` says so.
    """
    n_states = states.size
    m_all = workers + 1
    value = np.full((n_states, m_all), np.inf)
    prev = np.full((n_states, m_all), -2, dtype=np.int64)
    width = np.zeros((n_states, m_all), dtype=np.int64)
    inside = np.flatnonzero(states.sub[start] & (np.arange(n_states) != start))
    if inside.size == 0:
        return _Table(value, prev, width)
    first = first_cost(inside)
    first = np.where(allowed[None, :], first, np.inf)
    value[inside] = first
    prev[inside] = -1
    width[inside] = np.arange(m_all)[None, :]
    widths = np.flatnonzero(allowed)
    for j in inside:  # by size: every k inside j comes first
        if check():
            return None
        ks = np.flatnonzero(states.sub[start] & states.sub[:, j])
        ks = ks[(ks != start) & (ks != j)]
        if ks.size == 0:
            continue
        cost = stage_cost(ks, int(j))
        sub_val = value[ks]
        for m in range(2, m_all):
            mp = widths[(widths >= 1) & (widths < m)]
            if mp.size == 0:
                continue
            cand = np.maximum(sub_val[:, m - mp], cost[:, mp])
            flat = int(np.argmin(cand))
            best = cand.flat[flat]
            if best < value[j, m]:
                ki, wi = divmod(flat, mp.size)
                value[j, m] = best
                prev[j, m] = ks[ki]
                width[j, m] = mp[wi]
    return _Table(value, prev, width)


def _backtrack(table: _Table, start: int, j: int, m: int) -> list[tuple[int, int, int]]:
    """``[(from state, to state, workers), ...]`` in pipeline order."""
    out = []
    while True:
        p, w = int(table.prev[j, m]), int(table.width[j, m])
        if p == -2:
            raise AssertionError("backtracking an unreachable state")
        if p == -1:
            out.append((start, j, m))
            break
        out.append((p, j, w))
        j, m = p, m - w
    return out[::-1]


# ---------------------------------------------------------------------------- levels
def _resolve_levels(opts: Mapping[str, Any], topology: Topology, devices: int,
                    uniform: bool) -> tuple[tuple[tuple[int, float], ...], list[list[int]]]:
    """The levels ``((workers, bandwidth), ...)`` and, for two, the device groups."""
    want = opts["levels"]
    if want not in (None, 1, 2):
        raise ShardplanError(f"levels must be 1 or 2, got {want!r}")
    groups: list[list[int]] = []
    if want != 1 and not uniform and devices == topology.num_devices:
        for level in reversed(topology.levels):  # innermost first
            sizes = {len(g) for g in level.groups}
            if len(level.groups) > 1 and len(sizes) == 1 and sizes.pop() > 1:
                groups = [list(g) for g in level.groups]
                break
    if want == 2 and not groups:
        raise ShardplanError("two levels need a topology level of equal groups of more than "
                             "one device, every device used and no fixed replicas")
    bws = opts["bandwidths"]
    n_levels = 2 if groups else 1
    if bws is not None:
        if not isinstance(bws, (list, tuple)) or len(bws) != n_levels or not all(
                isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0
                for b in bws):
            raise ShardplanError(f"bandwidths must be {n_levels} positive number(s) (bytes/s, "
                                 f"innermost level first), got {bws!r}")
        bws = [float(b) for b in bws]
    if n_levels == 1:
        d = np.arange(devices)
        off = ~np.eye(devices, dtype=bool)
        if bws:
            bw = bws[0]
        else:
            bw = float(np.median(topology.bandwidth[np.ix_(d, d)][off])) if devices > 1 \
                else float("inf")
        if not bw > 0:
            raise ShardplanError("the devices have no bandwidth between them (PipeDream needs "
                                 "links between every worker)")
        return ((devices, bw),), []
    label = np.empty(topology.num_devices, dtype=np.int64)
    for i, g in enumerate(groups):
        label[g] = i
    same = label[:, None] == label[None, :]
    off = ~np.eye(topology.num_devices, dtype=bool)
    b1 = bws[0] if bws else float(np.median(topology.bandwidth[same & off]))
    b2 = bws[1] if bws else float(np.median(topology.bandwidth[~same]))
    if not (b1 > 0 and b2 > 0):
        raise ShardplanError("some devices have no bandwidth between them (PipeDream needs "
                             "links between every worker)")
    return ((len(groups[0]), b1), (len(groups), b2)), groups


# ---------------------------------------------------------------------------- the partitioner
def _check_options(opts: Mapping[str, Any], topology: Topology, n: int) -> tuple[int, int | None]:
    """(devices used, fixed replica count or None)."""
    def pos_int(name: str) -> int | None:
        v = opts[name]
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))
                              or v < 1):
            raise ShardplanError(f"{name} must be a positive integer, got {v!r}")
        return None if v is None else int(v)

    s, r, dev = pos_int("stages"), pos_int("replicas"), pos_int("devices")
    pos_int("max_states")
    c = opts["compression"]
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not c > 0:
        raise ShardplanError(f"compression must be a positive number, got {c!r}")
    if not isinstance(opts["transfers"], bool):
        raise ShardplanError(f"transfers must be true or false, got {opts['transfers']!r}")
    total = topology.num_devices
    if s is not None and r is None:
        r = max(1, (dev or total) // s)
    if s is not None:
        assert r is not None  # set just above
        dev = s * r
    elif r is not None and dev is None:
        dev = (total // r) * r
    dev = total if dev is None else dev
    if dev > total or dev < 1:
        raise ShardplanError(f"{dev} devices asked for, the topology has {total}")
    if r is not None and dev % r:
        raise ShardplanError(f"{dev} devices are not a multiple of {r} replicas")
    if r is not None and dev // r > n:
        raise ShardplanError(f"{dev // r} stages need at least {dev // r} nodes, the graph "
                             f"has {n}")
    return dev, r


def _fallback(states: States, devices: int, replicas: int | None
              ) -> list[tuple[int, int, int]]:
    """A plan without the DP (the time limit): data parallelism, or with fixed replicas
    equal-work stages along a chain of nested states. O(N)."""
    last = states.size - 1
    if replicas is None or replicas == devices:
        return [(0, last, devices)]
    k = devices // replicas
    chain = [0]
    for j in range(1, states.size):  # sorted by size: a maximal chain of nested states
        if states.sub[chain[-1], j]:
            chain.append(j)
    work = states.work[chain]
    idx = [0]
    for t in range(1, k):
        want = int(np.searchsorted(work, work[-1] * t / k))
        idx.append(min(max(want, idx[-1] + 1), len(chain) - 1 - (k - t)))
    idx.append(len(chain) - 1)
    return [(chain[idx[t]], chain[idx[t + 1]], replicas) for t in range(k)]


@register("partition", "pipedream")
def pipedream_partition(graph: Graph, topology: Topology, *, options: Mapping[str, Any],
                        seed: int, time_limit: float | None,
                        progress: Progress | None = None) -> Result:
    """PipeDream's optimizer: DP over the antichain DAG with per-stage replication, its
    transfer model, one or two levels (see the module docstring). Deterministic.

    Options: ``stages``, ``replicas`` (fix every stage to R replicas), ``devices``,
    ``levels`` (1, 2 or auto), ``bandwidths`` (bytes/s per level, innermost first),
    ``transfers``, ``compression``, ``max_states``, and the cost-model settings
    (``efficiency`` for FLOP-derived times).
    """
    deadline = Deadline(time_limit)
    opts = take_options("pipedream", options, DEFAULTS)
    n = graph.num_nodes
    if n == 0:
        raise ShardplanError("the graph has no nodes")
    settings, _ = pipeline_settings(opts, graph)
    devices, fixed = _check_options(opts, topology, n)
    levels, groups = _resolve_levels(opts, topology, devices, fixed is not None)
    config = PipeDreamConfig(levels, bool(opts["transfers"]), float(opts["compression"]))
    work, scaled = node_work(graph, topology, settings)
    cap = int(opts["max_states"])
    if len(levels) == 2:
        cap = min(cap, _TWO_LEVEL_STATES)
    states = States.build(scaled, work, cap, (devices // fixed if fixed else 1) + 1)
    kw: dict[str, Any] = {"transfers": config.transfers, "compression": config.compression}
    last = states.size - 1
    out_bytes = np.where(np.arange(states.size) == last, 0.0, states.cut)
    stats: dict[str, Any] = {"states": states.size, "state_mode": states.mode,
                             "levels": len(levels)}
    timed_out = False

    def check() -> bool:
        return deadline.expired()

    def one_level(start: int, workers: int, bw: float, allowed: np.ndarray,
                  compute: np.ndarray | None = None, within: float = 1.0) -> _Table | None:
        """The DP from state ``start`` with the level's workers and bandwidth; ``compute``
        (N, N) replaces the work differences (the level-1 optimum of each range)."""
        widths = np.arange(workers + 1, dtype=np.float64)

        def span(ks: np.ndarray, j: int | np.ndarray) -> np.ndarray:
            if compute is not None:
                return compute[ks, j]
            return states.work[j] - states.work[ks]

        def first_cost(js: np.ndarray) -> np.ndarray:
            c = span(np.full(js.size, start), js) if compute is not None else \
                states.work[js] - states.work[start]
            p = states.params[js] - states.params[start]
            return stage_seconds(c[:, None], p[:, None], 0.0, 0.0, widths[None, :], bw,
                                 within=within, first=True, **kw)

        def stage_cost(ks: np.ndarray, j: int) -> np.ndarray:
            c = span(ks, j)
            p = states.params[j] - states.params[ks]
            return stage_seconds(c[:, None], p[:, None], states.cut[ks][:, None],
                                 out_bytes[j], widths[None, :], bw, first=False, **kw)

        return _level_dp(states, start, workers, allowed, first_cost, stage_cost, check)

    def allowed_widths(workers: int) -> np.ndarray:
        a = np.zeros(workers + 1, dtype=bool)
        if fixed is None:
            a[1:] = True
        else:
            a[fixed] = True
        return a

    stages_plan: list[tuple[int, int, int, int]] | None = None  # (from, to, workers, range)
    ranges: list[list[int]] = []
    if len(levels) == 1:
        (m1, b1), = levels
        table = one_level(0, m1, b1, allowed_widths(m1))
        if table is None or not np.isfinite(table.value[last, m1]):
            timed_out = table is None
        else:
            stages_plan = [(a, b, w, 0) for a, b, w in _backtrack(table, 0, last, m1)]
    else:
        (n1, b1), (n2, b2) = levels
        inner = np.full((states.size, states.size), np.inf)
        tables: dict[int, _Table] = {}
        for a in range(states.size - 1):
            if progress is not None:
                progress("pipedream level 1", a, states.size - 1)
            t = one_level(a, n1, b1, allowed_widths(n1))
            if t is None:
                timed_out = True
                break
            tables[a] = t
            inner[a] = t.value[:, n1]
        if not timed_out:
            outer = one_level(0, n2, b2, allowed_widths(n2), compute=inner, within=float(n1))
            if outer is None:
                timed_out = True
            elif np.isfinite(outer.value[last, n2]):
                stages_plan = []
                for t_idx, (a, b, g) in enumerate(_backtrack(outer, 0, last, n2)):
                    first = len(stages_plan)
                    for x, y, rho in _backtrack(tables[a], a, b, n1):
                        stages_plan.append((x, y, rho * g, t_idx))
                    ranges.append([first, len(stages_plan), g])
    status = "optimal" if states.mode == "ideals" else "feasible"
    if stages_plan is None:
        if not timed_out:
            raise ShardplanError("no PipeDream plan: every split has an infinite stage time")
        if groups:  # data parallel over both levels: one range, one stage per group
            stages_plan = [(0, last, devices, 0)]
            ranges = [[0, 1, len(groups)]]
        else:
            stages_plan = [(a, b, w, 0) for a, b, w in _fallback(states, devices, fixed)]
        status = "timed_out"
    elif deadline.expired():
        status = "timed_out"
    if progress is not None:
        progress("pipedream", 1, 1)
    return _build(graph, topology, states, stages_plan, ranges, groups, config, settings,
                  opts, seed, deadline, status, stats, work, scaled)


def _build(graph: Graph, topology: Topology, states: States,
           stages_plan: list[tuple[int, int, int, int]], ranges: list[list[int]],
           groups: list[list[int]], config: PipeDreamConfig, settings: ExecutionSettings,
           opts: Mapping[str, Any], seed: int, deadline: Deadline, status: str,
           stats: dict[str, Any], work: np.ndarray, scaled: Graph) -> Result:
    """The plan of a list of stages ``(from state, to state, plan replicas, range)``."""
    stages = []
    if groups:
        offset = {i: 0 for i in range(len(groups))}  # next free device in each group
        group_of_range = []
        g0 = 0
        for _, _, g in ranges:
            group_of_range.append(list(range(g0, g0 + g)))
            g0 += g
        for a, b, reps, rng in stages_plan:
            gs = group_of_range[rng]
            rho = reps // len(gs)
            devs = []
            for gi in gs:
                devs += groups[gi][offset[gi]:offset[gi] + rho]
                offset[gi] += rho
            stages.append(Stage(tuple(int(v) for v in states.nodes_between(a, b)),
                                tuple(int(d) for d in devs)))
    else:
        nxt = 0
        for a, b, reps, _ in stages_plan:
            stages.append(Stage(tuple(int(v) for v in states.nodes_between(a, b)),
                                tuple(range(nxt, nxt + reps))))
            nxt += reps
    k = len(stages)
    stage_of = np.empty(graph.num_nodes, dtype=np.int64)
    for s, st in enumerate(stages):
        stage_of[list(st.nodes)] = s
    wsum = np.bincount(stage_of, weights=work, minlength=k)
    psum = np.bincount(stage_of, weights=graph.param_bytes.astype(np.float64), minlength=k)
    cuts = prefix_cut_bytes(scaled, stage_of, k)
    counts = [len(st.devices) for st in stages]
    value, details = evaluate_stages(wsum, psum, cuts, counts, config, ranges or None)
    used = sum(counts)
    bound = float(work.sum()) / used if used else 0.0
    recorded = {key: v for key, v in opts.items() if v is not None}
    recorded.update(config.to_options())
    meta: dict[str, Any] = {"placement": "pipedream", "search": stats,
                            "stage_seconds": details["stage_seconds"]}
    if ranges:
        meta["pipedream_ranges"] = ranges
    execution = settings
    plan = Plan(graph=graph.name, topology=topology.name, algorithm="pipedream",
                stages=tuple(stages), objective=Objective(OBJECTIVE, value, min(bound, value)),
                status=status, seed=int(seed), options=recorded,
                search_seconds=deadline.elapsed(), meta=meta, execution=execution)
    return Result(plan, stats)
