"""Re-planning an LLM plan for the cluster as it is now (issue 48, items 1 and 2).

Paper 000 ends with the dynamic environment where devices come and go; at 16,384 GPUs that is
the normal case (Llama 3's 54-day run had 419 unexpected interruptions, arXiv 2407.21783).
:func:`replan` answers, for a plan and the devices there now (:mod:`._cluster_change`):

- **the best plan for the new cluster**: a search of the LLM plan kind over every device
  count the layouts can use -- an LLM layout uses ``tp x cp x pp x dp`` devices with ``dp``
  dividing the global batch, so 16,376 GPUs (16,384 less a node; 8 x 23 x 89) have no layout
  using them all, and ``plan`` finds none: the re-plan leaves the fewest devices idle that
  the best layout needs, and says so;
- **the cheapest change that keeps training** (:func:`minimal_changes`): the same layout on a
  spare node when the survivors still hold it, the same layout with fewer data-parallel
  replicas (spares idle), or the pipeline re-cut into one stage fewer; each priced in the
  same simulator, and always simulated by the search, so the best plan is never slower;

each with what changes: the degrees moved, the blocks each pipeline rank takes from which,
the bytes each device receives over NVLink, the network or from the checkpoint, the time to
reshard (:mod:`._reshard`), on surviving devices chosen so that as much state as possible
stays in place (:func:`~._reshard.assign_nodes`).

**Reuse** (item 2). ``plan -o`` leaves in the plan file a ``replan`` object
(:class:`ReplanContext`): the model and cluster it was made for, the global batch and
training settings, and the first search's best priced layouts with their simulated times.
The re-plan (a) takes the layouts whose devices still exist on a cluster that prices them
the same (identical nodes, the same GPU: its two-level pair model and devices unchanged)
with their times as they are, unsimulated -- after gaining GPUs, the old search's answers
stand and only layouts using the new devices are priced; (b) orders every other layout by
its time as the old prices predict it (:func:`_estimate`: the old layout of the same shape,
its time scaled by the devices and by the rough bubble and communication terms of
:func:`~shardplan.planner._llm._promise`), so the likely best are priced first; (c) keeps
the first search's training settings and global batch. Pricing and simulation are the
LLM search's (:func:`~shardplan.cost.llm_costs`, :func:`~shardplan.simulate._llm.
simulate_llm`, branch and bound on :func:`~shardplan.simulate._llm.lower_bound_seconds`).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from shardplan.cost._llm import block_layout
from shardplan.errors import InvalidFileError, ShardplanError
from shardplan.ir import ExecutionSettings, Graph, Objective, ParallelConfig, Plan, Topology
from shardplan.ir.parallel import pipeline_split
from shardplan.planner._cluster_change import ClusterChange
from shardplan.planner._llm import (
    PRICING_SHARE,
    LLMCandidate,
    SearchSpace,
    _promise,
    candidates,
    model_parameters,
    moved_knobs,
    node_size,
    price_candidate,
    wide_space,
)
from shardplan.planner._reshard import (
    Placement,
    Reshard,
    assign_nodes,
    block_moves,
    fabric_of,
    reshard,
)
from shardplan.strategy.llm import OBJECTIVE, layout_plan

__all__ = ["CONTEXT_FORMAT", "CONTEXT_KEY", "ReplanContext", "ReplanOption", "ReplanResult",
           "ReplanSearch", "context_of_search", "minimal_changes", "replan", "replan_search",
           "reshard_back", "usable_counts"]

#: The plan file's key holding the :class:`ReplanContext`, and its format.
CONTEXT_KEY = "replan"
CONTEXT_FORMAT = "shardplan.replan/1"

#: Layouts of the first search a plan file keeps for a re-plan.
CONTEXT_CANDIDATES = 20

#: The share of :func:`replan`'s time limit kept for placing its answers and writing them.
AFTER_SHARE = 0.2

#: Device counts below this share of the surviving devices are not searched (the cheapest
#: changes are, whatever they use).
MIN_USE = 0.5


def _candidate_dict(c: LLMCandidate) -> dict[str, Any]:
    return {"parallel": c.parallel.to_dict(), "execution": c.settings.to_dict(),
            "iteration_seconds": c.iteration_seconds, "peak_memory_bytes": c.peak_memory_bytes,
            "fits": c.fits}


@dataclass(frozen=True)
class ReplanContext:
    """What a plan file keeps for a re-plan (key :data:`CONTEXT_KEY`; module docstring).

    Attributes
    ----------
    global_batch : int
    settings : ExecutionSettings
        The training settings the first search shared (before it chose a layout's).
    candidates : tuple of LLMCandidate
        Its best layouts, simulated, best first.
    model : str or None
        The model spec captured, or the graph file read (``model_is_file``).
    batch_size, seq_len : int or None
        How the spec was captured.
    cluster : str or None
        The ``--cluster`` given (a spec or a file), with ``gpus`` and ``memory_limit``.
    topology : str
        The name of the cluster the candidates were priced on.
    """

    global_batch: int
    settings: ExecutionSettings
    candidates: tuple[LLMCandidate, ...] = ()
    model: str | None = None
    model_is_file: bool = False
    batch_size: int | None = None
    seq_len: int | None = None
    cluster: str | None = None
    gpus: int | None = None
    memory_limit: float | None = None
    topology: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"format": CONTEXT_FORMAT, "global_batch": self.global_batch,
                "settings": self.settings.to_dict(), "model": self.model,
                "model_is_file": self.model_is_file, "batch_size": self.batch_size,
                "seq_len": self.seq_len, "cluster": self.cluster, "gpus": self.gpus,
                "memory_limit": self.memory_limit, "topology": self.topology,
                "candidates": [_candidate_dict(c) for c in self.candidates]}

    @classmethod
    def from_dict(cls, data: Any) -> ReplanContext:
        """Read a plan file's ``replan`` object. Raises :class:`InvalidFileError`."""
        if not isinstance(data, Mapping) or data.get("format") != CONTEXT_FORMAT:
            raise InvalidFileError(f"the plan's 'replan' object is not {CONTEXT_FORMAT}")
        try:
            cands = tuple(LLMCandidate(ParallelConfig.from_dict(c["parallel"]),
                                       ExecutionSettings.from_dict(c["execution"]),
                                       _finite(c["iteration_seconds"]),
                                       float(c["peak_memory_bytes"]), bool(c["fits"]))
                          for c in data.get("candidates") or [])
            return cls(global_batch=int(data["global_batch"]),
                       settings=ExecutionSettings.from_dict(data["settings"]),
                       candidates=cands, model=data.get("model"),
                       model_is_file=bool(data.get("model_is_file")),
                       batch_size=data.get("batch_size"), seq_len=data.get("seq_len"),
                       cluster=data.get("cluster"), gpus=data.get("gpus"),
                       memory_limit=data.get("memory_limit"),
                       topology=str(data.get("topology", "")))
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidFileError(f"the plan's 'replan' object is malformed ({exc})") from None

    @classmethod
    def of_plan(cls, plan: Plan) -> ReplanContext | None:
        """The context a plan file keeps, or None."""
        data = plan.meta.get(CONTEXT_KEY)
        return None if data is None else cls.from_dict(data)


def _finite(x: Any) -> float:
    return math.inf if x is None else float(x)


# ------------------------------------------------------------------------------ candidates
def _heads_ok(graph: Graph, tp: int) -> bool:
    dims = graph.meta.get("transformer") if isinstance(graph.meta, dict) else None
    heads = [dims.get(k) for k in ("heads", "kv_heads")] if isinstance(dims, dict) else []
    return not any(isinstance(h, int) and h % tp for h in heads)


def usable_counts(graph: Graph, settings: ExecutionSettings, *, global_batch: int,
                  devices: int, node: int, space: SearchSpace, min_use: float = MIN_USE
                  ) -> list[int]:
    """The device counts, largest first, at least ``min_use`` of ``devices``, that some
    layout of :func:`~shardplan.planner._llm.candidates` uses exactly: ``tp x cp x pp x dp``
    with ``tp`` a divisor of the node size and the heads, ``cp`` as ``space`` allows, ``pp``
    a pipeline split of the blocks, ``dp`` a divisor of the global batch; whole nodes beyond
    one node. O(tp x cp x blocks x divisors(global batch)).
    """
    blocks = block_layout(graph).num_blocks
    dims = graph.meta.get("transformer") if isinstance(graph.meta, dict) else None
    seq = dims.get("seq") if isinstance(dims, dict) else None
    tps = [t for t in range(1, min(node, devices) + 1)
           if min(node, devices) % t == 0 and _heads_ok(graph, t)]
    cps = [1]
    if space.context and isinstance(seq, int):
        cps = [c for c in (1, 2, 4, 8) if seq % (2 * c) == 0 and (c == 1 or seq // (2 * c)
                                                                  >= 1024)]
    pps = [p for p in range(1, blocks + 1)
           if (blocks % p == 0) or (space.uneven and pipeline_split(blocks, p, 1)[0])]
    dps = [d for d in range(1, global_batch + 1) if global_batch % d == 0]
    out = set()
    for t, c, p in itertools.product(tps, cps, pps):
        for d in dps:
            w = t * c * p * d
            if w > devices:
                break
            if w >= min_use * devices and (w <= node or w % node == 0):
                out.add(w)
    return sorted(out, reverse=True)


def minimal_changes(graph: Graph, parallel: ParallelConfig, settings: ExecutionSettings, *,
                    global_batch: int, devices: int, node: int
                    ) -> list[tuple[str, ParallelConfig, ExecutionSettings]]:
    """The cheapest changes that keep training on ``devices`` (module docstring), each
    ``(kind, layout, settings)``: ``same layout`` (when it still fits the survivors),
    ``fewer replicas`` (the data-parallel degree down to the largest divisor of the global
    batch that fits, the micro-batch per replica kept, more micro-batches), ``re-cut
    pipeline`` (the largest pipeline degree below the old that fits on whole nodes, the
    blocks split again as :func:`~shardplan.ir.parallel.pipeline_split` allows, the
    virtual stages kept where the micro-batches allow, else fewer). O(pp x vp + divisors).
    """
    out: list[tuple[str, ParallelConfig, ExecutionSettings]] = []
    if parallel.world_size <= devices:
        out.append(("same layout", parallel, settings))
        return out
    fewer = _fewer_replicas(parallel, settings, global_batch, devices)
    if fewer is not None:
        out.append(("fewer replicas", *fewer))
    recut = _recut(graph, parallel, settings, devices, node)
    if recut is not None:
        out.append(("re-cut pipeline", *recut))
    return out


def _fewer_replicas(par: ParallelConfig, st: ExecutionSettings, global_batch: int,
                    devices: int) -> tuple[ParallelConfig, ExecutionSettings] | None:
    per = (st.microbatch_size or par.data_parallel) // par.data_parallel
    fixed = par.world_size // par.data_parallel
    for d in range(par.data_parallel - 1, 0, -1):
        if global_batch % d or fixed * d > devices or (global_batch // d) % per:
            continue
        m = global_batch // (d * per)
        if par.vp > 1 and m % par.pp:
            continue
        try:
            if par.dp_shard > 1 and par.dp > 1:
                if d % par.dp_shard:
                    continue
                new = replace(par, dp=d // par.dp_shard)
            elif par.dp_shard > 1:
                new = replace(par, dp_shard=d)
            else:
                new = replace(par, dp=d)
        except ShardplanError:
            continue
        return new, replace(st, microbatch_size=per * d, microbatches=m)
    return None


def _recut(graph: Graph, par: ParallelConfig, st: ExecutionSettings, devices: int,
           node: int) -> tuple[ParallelConfig, ExecutionSettings] | None:
    blocks = block_layout(graph).num_blocks
    per_rank = par.devices_per_rank
    m = st.microbatches
    for pp in range(par.pp - 1, 0, -1):
        w = per_rank * pp
        if w > devices or (w > node and w % node):
            continue
        for vp in range(par.vp, 0, -1):
            if vp > 1 and (m % pp or m < pp):
                continue
            ok, split = pipeline_split(blocks, pp, vp)
            if not ok:
                continue
            try:
                new = replace(par, pp=pp, vp=vp, stage_layers=split)
            except ShardplanError:
                continue
            sched = "interleaved-1f1b" if vp > 1 else ("1f1b" if st.schedule ==
                                                       "interleaved-1f1b" else st.schedule)
            return new, replace(st, schedule=sched,
                                virtual_stages=vp if vp > 1 else st.virtual_stages)
    return None


def _shape(par: ParallelConfig, st: ExecutionSettings) -> tuple[Any, ...]:
    per = (st.microbatch_size or 0) // max(1, par.data_parallel)
    return (par.tp, par.cp, par.dp_shard > 1, st.recompute, st.sequence_parallel,
            st.gradient_sync, per)


def _estimate(par: ParallelConfig, st: ExecutionSettings,
              refs: Mapping[tuple[Any, ...], LLMCandidate], best: LLMCandidate | None,
              work: Any) -> float:
    """A layout's time as the old prices predict it (module docstring): the old layout of
    its shape (else the old best), its time times the ratio of the busiest device's work
    (``work``: its pipeline rank's forward FLOPs over its ``tp x cp x dp`` devices, which
    sees an output head that weighs on the last stage) and the ratio of
    :func:`~shardplan.planner._llm._promise` (the bubble, recompute, tensor and context
    parallelism's communication). Only an order; never a price. O(1) per layout after the
    first of its pipeline split."""
    ref = refs.get(_shape(par, st), best)
    if ref is None:
        return _promise(par, st) * work(par)
    return (ref.iteration_seconds * work(par) / work(ref.parallel)
            * _promise(par, st) / _promise(ref.parallel, ref.settings))


def _work_of(graph: Graph) -> Any:
    """``work(parallel)``: the forward FLOPs of the busiest pipeline rank over the devices
    of a rank (:func:`_estimate`), cached per pipeline split."""
    from shardplan.planner._reshard import _unit_ranks

    layout = block_layout(graph)
    nb = layout.num_blocks
    key = np.clip(layout.block, -1, nb) + 1
    flops = np.bincount(key, weights=np.asarray(graph.fwd_flops, dtype=np.float64),
                        minlength=nb + 2)
    blocks = np.arange(-1, nb + 1)
    cache: dict[tuple[Any, ...], float] = {}

    def work(par: ParallelConfig) -> float:
        k = (par.pp, par.vp, par.stage_layers)
        if k not in cache:
            ranks = _unit_ranks(blocks, nb, par)
            cache[k] = float(np.bincount(ranks, weights=flops, minlength=par.pp).max())
        return cache[k] / par.devices_per_rank

    return work


def _pool(graph: Graph, topology: Topology, settings: ExecutionSettings, *,
          global_batch: int, counts: Sequence[int], space: SearchSpace,
          old: Sequence[LLMCandidate]) -> list[tuple[ParallelConfig, ExecutionSettings]]:
    """Every layout of :func:`~shardplan.planner._llm.candidates` at each of ``counts``,
    in the order of :func:`_estimate`. O(layouts log layouts)."""
    refs: dict[tuple[Any, ...], LLMCandidate] = {}
    for c in old:
        if c.fits and math.isfinite(c.iteration_seconds):
            refs.setdefault(_shape(c.parallel, c.settings), c)
    best = next((c for c in old if c.fits and math.isfinite(c.iteration_seconds)), None)
    pool = [c for w in counts for c in candidates(graph, topology, settings,
                                                  global_batch=global_batch, devices=w,
                                                  space=space)]
    work = _work_of(graph)
    return sorted(pool, key=lambda c: _estimate(c[0], c[1], refs, best, work))


# ---------------------------------------------------------------------------------- search
@dataclass(frozen=True)
class ReplanSearch:
    """What :func:`replan_search` found: the layouts, best first (those that fit first),
    and how many were offered, reused (their old times kept), priced and simulated."""

    ranked: tuple[LLMCandidate, ...]
    seconds: float
    timed_out: bool
    offered: int
    reused: int
    priced: int
    simulated: int
    counts: tuple[int, ...] = ()

    @property
    def best(self) -> LLMCandidate | None:
        return next((c for c in self.ranked if c.fits), None)


def replan_search(graph: Graph, topology: Topology, *,
                  pool: Iterable[tuple[ParallelConfig, ExecutionSettings]],
                  include: Sequence[tuple[ParallelConfig, ExecutionSettings]] = (),
                  reused: Sequence[LLMCandidate] = (), time_limit: float = 10.0,
                  offered: int = 0, counts: Sequence[int] = ()) -> ReplanSearch:
    """The fastest layout of ``include``, ``reused`` and ``pool`` that fits, by the LLM
    search's branch and bound (:func:`~shardplan.planner._llm.llm_search`, its static and
    full-recompute memory prunes too): the included layouts are priced and simulated
    whatever the time; ``reused`` ones keep their times
    (they bound the rest from the start); ``pool`` is priced in its order for
    :data:`~shardplan.planner._llm.PRICING_SHARE` of ``time_limit``, then simulated in the
    order of the bounds until a bound reaches the best time or the time runs out.
    O(priced x (n + pp vp)) plus one simulation per layout whose bound is below the best.
    """
    from shardplan.simulate._llm import simulate_llm

    start = time.monotonic()
    capacity = float(topology.device_memory.min())
    params, experts = model_parameters(graph)
    frugal_seen: dict[tuple[Any, ...], bool] = {}
    mine = set(include)
    ranked = list(reused)
    seen = {(c.parallel, c.settings) for c in reused}
    priced: list[tuple[float, ParallelConfig, ExecutionSettings, Any, float]] = []
    timed_out = False
    for par, st in itertools.chain(include, pool):
        if (par, st) in seen:
            continue
        seen.add((par, st))
        if time.monotonic() - start > PRICING_SHARE * time_limit and (par, st) not in mine:
            timed_out = True
            break
        out, fit = price_candidate(graph, topology, par, st, (params, experts, capacity),
                                   frugal_seen, must=(par, st) in mine)
        if out is not None:
            ranked.append(out)
        if fit is not None:
            priced.append(fit)
    priced.sort(key=lambda x: ((x[1], x[2]) not in mine, x[0]))
    best = min((c.iteration_seconds for c in reused if c.fits), default=math.inf)
    simulated = 0
    for bound, par, st, costs, mem in priced:
        own = (par, st) in mine
        if not own and (bound >= best or time.monotonic() - start > time_limit):
            timed_out = timed_out or bound < best
            break
        plan = layout_plan(graph, topology, par, st)
        res = simulate_llm(plan, graph, topology, plan.settings, timeline=False, costs=costs)
        simulated += 1
        best = min(best, res.iteration_seconds)
        ranked.append(LLMCandidate(par, st, res.iteration_seconds, mem, True))
    ranked.sort(key=lambda c: (not c.fits, c.iteration_seconds, c.peak_memory_bytes))
    return ReplanSearch(tuple(ranked), time.monotonic() - start, timed_out, offered,
                        len(reused), len(priced), simulated, tuple(counts))


# ---------------------------------------------------------------------------------- result
@dataclass(frozen=True, eq=False)
class ReplanOption:
    """One answer of :func:`replan`: a layout on chosen surviving devices, its plan and
    topology (device i of it runs rank i), its simulated time and what it takes to get
    there."""

    kind: str
    plan: Plan
    topology: Topology
    iteration_seconds: float
    reshard: Reshard
    devices: np.ndarray
    moved: tuple[str, ...]
    blocks: tuple[dict[str, Any], ...]
    kinds: tuple[str, ...] = ()

    @property
    def parallel(self) -> ParallelConfig:
        assert self.plan.parallel is not None
        return self.plan.parallel

    def to_dict(self) -> dict[str, Any]:
        st = self.plan.settings
        return {"kind": self.kind, "also": list(self.kinds), "layout": self.parallel.label(),
                "parallel": self.parallel.to_dict(), "gpus": self.parallel.world_size,
                "microbatch_size": st.microbatch_size, "microbatches": st.microbatches,
                "schedule": st.schedule, "recompute": st.recompute,
                "gradient_sync": st.gradient_sync,
                "iteration_seconds": self.iteration_seconds, "moved": list(self.moved),
                "reshard": self.reshard.to_dict(), "blocks": list(self.blocks),
                "topology": self.topology.name}


@dataclass(frozen=True, eq=False)
class ReplanResult:
    """What :func:`replan` found: the best plan, the cheapest change, every minimal change
    priced, the search and what it reused."""

    old_seconds: float
    old_parallel: ParallelConfig
    old_settings: ExecutionSettings
    change: ClusterChange
    best: ReplanOption
    cheapest: ReplanOption | None
    changes: tuple[ReplanOption, ...]
    search: ReplanSearch
    reused: dict[str, Any] = field(default_factory=dict)
    idle: int = 0
    unfit: tuple[dict[str, Any], ...] = ()
    usable: int = 0

    def to_dict(self) -> dict[str, Any]:
        ch = self.change
        out: dict[str, Any] = {
            "cluster": {"before": {"name": ch.old.name, "devices": ch.old.num_devices},
                        "after": {"devices": ch.num_alive, "usable": self.usable},
                        "removed": list(ch.removed), "added": list(ch.added)},
            "old_iteration_seconds": self.old_seconds,
            "old_layout": self.old_parallel.label(), "old_gpus": self.old_parallel.world_size,
            "best": self.best.to_dict(),
            "cheapest": None if self.cheapest is None else self.cheapest.to_dict(),
            "changes": [c.to_dict() for c in self.changes],
            "changes_that_do_not_fit": list(self.unfit),
            "search": {"seconds": self.search.seconds, "timed_out": self.search.timed_out,
                       "offered": self.search.offered, "reused": self.search.reused,
                       "priced": self.search.priced, "simulated": self.search.simulated,
                       "device_counts": list(self.search.counts[:12])},
            "reused": self.reused}
        if self.cheapest is not None:
            saved = self.cheapest.iteration_seconds - self.best.iteration_seconds
            extra = self.best.reshard.seconds - self.cheapest.reshard.seconds
            out["best_vs_cheapest"] = {
                "seconds_saved_per_step": saved, "extra_reshard_seconds": extra,
                "break_even_steps": (extra / saved if saved > 0 and extra > 0 else 0.0)}
        return out


def _same_pricing(a: Topology, b: Topology) -> bool:
    """Whether a layout on the first devices of ``a`` and of ``b`` prices the same: both
    two-level pair models of the same node size and figures, the same devices."""
    from shardplan.ir._pairs import LevelPairs

    ma, mb = a.pair_model, b.pair_model
    if not (isinstance(ma, LevelPairs) and isinstance(mb, LevelPairs)) or \
            len(ma.shape) != 2 or len(mb.shape) != 2 or ma.shape[1] != mb.shape[1]:
        return False
    for which in ("bandwidth", "latency"):
        (la, ia), (lb, ib) = ma.tables[which], mb.tables[which]
        if not np.array_equal(la, lb):
            return False
        if ia is None or ib is None:
            if ia is not ib:
                return False
        elif not np.array_equal(ia, ib):
            return False
    kinds = {(d.memory_bytes, d.flops, tuple(sorted(d.extra.items())))
             for d in (*a.devices, *b.devices)}
    return len(kinds) == 1 and dict(a.meta.get("generator") or {}).get("kind") == \
        dict(b.meta.get("generator") or {}).get("kind")


def replan(graph: Graph, old_plan: Plan, change: ClusterChange, context: ReplanContext, *,
           time_limit: float = 10.0, storage_bandwidth: float | None = None,
           warm: bool = True, min_use: float = MIN_USE, search: bool = True
           ) -> ReplanResult:
    """The best plan for the cluster after ``change``, the cheapest change that keeps
    training, and what each changes (module docstring). ``warm`` False searches without
    the first search's layouts and prices (a fresh search, for comparison); ``search``
    False prices the minimal changes (and the old layouts that stand) only. The whole call
    keeps within ``time_limit`` seconds (+ the reshard of the answers, O(W g) each).

    Raises
    ------
    ShardplanError
        ``old_plan`` is not an LLM plan; no layout fits on the surviving devices.
    """
    from shardplan.errors import InfeasibleError

    t0 = time.monotonic()
    old_par = old_plan.parallel
    if old_par is None:
        raise ShardplanError("replan needs an LLM plan (a plan with a 'parallel' layout, as "
                             "'shardplan plan' writes for a transformer)")
    old_st = old_plan.settings.resolve(graph)
    nodes = change.usable_nodes()
    search_topo = change.topology_of(nodes.reshape(-1))
    n, node = search_topo.num_devices, node_size(search_topo)
    batch = context.global_batch
    space = wide_space(context.settings)
    counts = usable_counts(graph, context.settings, global_batch=batch, devices=n,
                           node=node, space=space, min_use=min_use)
    minimal = minimal_changes(graph, old_par, old_st, global_batch=batch, devices=n,
                              node=node)
    old = context.candidates if warm else ()
    same = bool(old) and _same_pricing(change.old, search_topo)
    reused = [c for c in old if c.fits and c.parallel.world_size <= n and same
              and math.isfinite(c.iteration_seconds)]
    pool = _pool(graph, search_topo, context.settings, global_batch=batch, counts=counts,
                 space=space, old=old) if search else []
    left = max(time_limit * (1 - AFTER_SHARE) - (time.monotonic() - t0), 0.5)
    found = replan_search(graph, search_topo, pool=pool,
                          include=[(p, s) for _, p, s in minimal], reused=reused,
                          time_limit=left, offered=len(pool) + len(minimal), counts=counts)
    best = found.best
    if best is None:
        raise InfeasibleError(f"no layout of {old_plan.graph} fits on the {n} surviving "
                              f"devices")
    fabric = fabric_of(change.base, change.alive, storage_bandwidth=storage_bandwidth)
    old_place = Placement(old_par, old_st, change.old_devices[:old_par.world_size])
    args = (graph, change, fabric, old_place, nodes, search_topo, found.seconds)
    best_opt = _option("best", best, *args)
    built = {(best.parallel, best.settings): best_opt}
    fitting = {(c.parallel, c.settings): c for c in found.ranked if c.fits}
    changes = []
    for kind, p, s in minimal:
        if (p, s) not in fitting:
            continue
        known = built.get((p, s))
        opt = _option(kind, fitting[(p, s)], *args) if known is None else \
            replace(known, kind=kind, kinds=())
        built[(p, s)] = opt
        changes.append(opt)
        if (p, s) == (best.parallel, best.settings):
            best_opt = replace(best_opt, kinds=(*best_opt.kinds, kind))
    cheapest = min(changes, key=lambda o: (o.reshard.seconds, o.iteration_seconds),
                   default=None)
    info = {"first_search_layouts": len(context.candidates),
            "times_kept": found.reused,
            "ordered_by_old_prices": bool(old),
            "settings": "the first search's training settings and global batch"}
    old_seconds = old_plan.objective.value
    return ReplanResult(old_seconds=float(old_seconds), old_parallel=old_par,
                        old_settings=old_st, change=change,
                        best=best_opt,
                        cheapest=cheapest, changes=tuple(changes), search=found,
                        reused=info, idle=change.num_alive - best_opt.parallel.world_size,
                        unfit=_unfit(minimal, found, float(search_topo.device_memory.min())),
                        usable=n)


def reshard_back(graph: Graph, result: ReplanResult, option: ReplanOption) -> Reshard:
    """The reshard from ``option`` back to the old plan once the removed devices return
    (every old device alive again; added devices keep nothing of the old plan). O(W g)."""
    ch = result.change
    alive = ch.alive.copy()
    back = ch.old_devices[ch.old_devices >= 0]
    alive[back] = True
    fabric = fabric_of(ch.base, alive)
    old = result.old_parallel
    devices = ch.old_devices[:old.world_size]
    if (devices < 0).any():
        raise ShardplanError("the old plan's devices are not all in the cluster now")
    st = option.plan.settings
    return reshard(graph, Placement(option.parallel, st, option.devices),
                   Placement(old, result.old_settings, devices), fabric)


def _unfit(minimal: Sequence[tuple[str, ParallelConfig, ExecutionSettings]],
           found: ReplanSearch, capacity: float) -> tuple[dict[str, Any], ...]:
    """The minimal changes that do not fit in memory, with what they would need."""
    by_key = {(c.parallel, c.settings): c for c in found.ranked}
    out = []
    for kind, p, s in minimal:
        c = by_key.get((p, s))
        if c is not None and c.fits:
            continue
        need = c.peak_memory_bytes if c is not None else math.nan
        out.append({"kind": kind, "layout": p.label(), "gpus": p.world_size,
                    "memory_bytes": need, "capacity_bytes": capacity})
    return tuple(out)


def _option(kind: str, c: LLMCandidate, graph: Graph, change: ClusterChange, fabric: Any,
            old_place: Placement, nodes: np.ndarray, search_topo: Topology,
            search_seconds: float) -> ReplanOption:
    """A layout of the search placed on surviving devices (:func:`~._reshard.assign_nodes`),
    its plan and topology, and its reshard from the old placement."""
    from shardplan.planner._llm import llm_plan

    devices = assign_nodes(graph, old_place, c.parallel, c.settings, fabric, nodes)
    topo = change.topology_of(devices)
    seconds = c.iteration_seconds
    if not _same_pricing(search_topo, topo):  # another part of a mixed cluster
        _, res = llm_plan(graph, topo, c.parallel, c.settings)
        seconds = res.iteration_seconds
    plan = layout_plan(graph, topo, c.parallel, c.settings, algorithm="replan",
                       objective=Objective(OBJECTIVE, seconds), search_seconds=search_seconds)
    cost = reshard(graph, old_place, Placement(c.parallel, c.settings, devices), fabric)
    old = (old_place.parallel, old_place.settings)
    return ReplanOption(kind=kind, plan=plan, topology=topo, iteration_seconds=seconds,
                        reshard=cost, devices=devices,
                        moved=tuple(moved_knobs(old, (c.parallel, c.settings))),
                        blocks=tuple(block_moves(graph, old_place.parallel, c.parallel)))


def context_of_search(ranked: Iterable[Any], *, global_batch: int, settings: ExecutionSettings,
                      topology: Topology, **where: Any) -> ReplanContext:
    """The :class:`ReplanContext` of a ``plan`` search: its LLM rows that fit (ranked rows
    with a ``plan`` dict holding ``parallel``), at most :data:`CONTEXT_CANDIDATES`, and
    ``where`` (the model and cluster it was given). O(rows)."""
    cands: list[LLMCandidate] = []
    for row in ranked:
        plan = getattr(row, "plan", None)
        if not isinstance(plan, Mapping) or plan.get("parallel") is None or not row.fits:
            continue
        cands.append(LLMCandidate(ParallelConfig.from_dict(plan["parallel"]),
                                  ExecutionSettings.from_dict(plan["execution"]),
                                  float(row.iteration_seconds), float(row.peak_memory_bytes),
                                  True))
        if len(cands) >= CONTEXT_CANDIDATES:
            break
    return ReplanContext(global_batch=global_batch, settings=settings,
                         candidates=tuple(cands), topology=topology.name, **where)
