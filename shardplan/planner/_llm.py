"""The LLM plan kind: price a layout in the simulator, and search the layouts of a cluster.

:func:`llm_plan` lays out a :class:`~shardplan.ir.ParallelConfig` (:func:`shardplan.strategy.
llm.layout_plan`) and records the simulator's iteration time as its objective, so an imported
configuration and a searched one are priced alike. :func:`llm_search` enumerates what a
Megatron-LM or torchtitan user chooses -- tensor parallelism inside a node (dividing the
heads), pipeline ranks (dividing the blocks), the data-parallel rest, the micro-batch, virtual
stages, recompute, sequence parallelism -- keeps the layouts predicted to fit in memory, and
simulates each (every candidate in the one price of :func:`shardplan.cost.llm_costs`).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from shardplan.cost._formulas import OPTIMIZER_STATE
from shardplan.cost._llm import block_layout, llm_costs, precision_bytes
from shardplan.cost._llm_moe import expert_shard
from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, Objective, ParallelConfig, Plan, Topology
from shardplan.ir.parallel import pipeline_split
from shardplan.ir.settings import RECOMPUTES
from shardplan.simulate import SimulationResult, simulate
from shardplan.strategy.llm import OBJECTIVE, check_layout, layout_plan

__all__ = ["LLM_ROWS", "WIDE", "LLMCandidate", "LLMSearch", "SearchSpace",
           "baseline_comparison", "candidates", "family_rows", "has_blocks", "knobs",
           "llm_plan", "llm_search", "moved_knobs", "node_size", "wide_space"]


def llm_plan(graph: Graph, topology: Topology, parallel: ParallelConfig,
             settings: ExecutionSettings, *, algorithm: str = "llm",
             search_seconds: float = 0.0) -> tuple[Plan, SimulationResult]:
    """The plan of ``parallel`` with the simulated iteration as its objective."""
    plan = layout_plan(graph, topology, parallel, settings, algorithm=algorithm,
                       search_seconds=search_seconds)
    result = simulate(plan, graph, topology, timeline=False)
    return replace(plan, objective=Objective(OBJECTIVE, result.iteration_seconds)), result


def node_size(topology: Topology) -> int:
    """Devices per node: the smallest group of the topology's first level (its boxes), or
    all devices when it has no levels."""
    if topology.levels:
        return min(len(g) for g in topology.levels[0].groups)
    return topology.num_devices


@dataclass(frozen=True)
class LLMCandidate:
    """One layout the search simulated."""

    parallel: ParallelConfig
    settings: ExecutionSettings
    iteration_seconds: float
    peak_memory_bytes: float
    fits: bool

    def row(self) -> dict[str, Any]:
        s = self.settings
        return {"parallel": self.parallel.label(), "layout": self.parallel.to_dict(),
                "microbatch_size": s.microbatch_size, "microbatches": s.microbatches,
                "schedule": s.schedule, "recompute": s.recompute,
                "sequence_parallel": s.sequence_parallel,
                "iteration_seconds": self.iteration_seconds,
                "peak_memory_gib": self.peak_memory_bytes / 2**30, "fits": self.fits}


@dataclass(frozen=True)
class LLMSearch:
    """What :func:`llm_search` found: candidates best first (those that fit first)."""

    ranked: tuple[LLMCandidate, ...]
    seconds: float
    timed_out: bool
    considered: int
    offered: int = 0

    @property
    def best(self) -> LLMCandidate | None:
        return next((c for c in self.ranked if c.fits), None)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class SearchSpace:
    """The knobs :func:`candidates` varies beyond TP, PP, DP, the micro-batch, virtual
    stages, recompute and sequence parallelism.

    Attributes
    ----------
    shardings : tuple of str
        How the data-parallel ranks hold parameters, gradients and optimizer state:
        ``settings`` (the settings' ``gradient_sync`` as given), ``ddp`` (replicas, DDP's
        overlapped buckets), ``zero1`` (the distributed optimizer), ``fsdp`` (every rank a
        shard: FSDP2 / ZeRO-3), ``hsdp`` (shards of 8 or 64 ranks, replicated between).
    context : bool
        Also context parallelism of 2, 4 and 8 where the sequence allows (2 cp chunks of at
        least 1,024 tokens).
    uneven : bool
        Also pipelines whose blocks do not divide over the stages, split as
        :func:`~shardplan.ir.parallel.pipeline_split` allows.
    recomputes : tuple of str
        Recompute levels tried.
    sequence_parallel : tuple of bool
        Sequence parallelism with TP > 1 (off without TP).
    microbatches : int or None
        The micro-batches per iteration the user fixed (``plan --microbatches``): only
        layouts that run that many, each replica's micro-batch whatever it takes (None: a
        micro-batch of 1, 2, 4, 8 or 16 sequences, up to the search's largest).
    """

    shardings: tuple[str, ...] = ("settings",)
    context: bool = False
    uneven: bool = False
    recomputes: tuple[str, ...] = RECOMPUTES
    sequence_parallel: tuple[bool, ...] = (False, True)
    microbatches: int | None = None


#: What ``shardplan plan`` searches (issue 45): every sharding, context parallelism, uneven
#: pipelines; sequence parallelism always with TP (it only removes work and memory in the
#: price), per-op recompute only where torchtitan runs (its stack).
WIDE = SearchSpace(shardings=("ddp", "zero1", "fsdp", "hsdp"), context=True, uneven=True,
                   recomputes=("none", "selective", "full"), sequence_parallel=(True,))


def wide_space(settings: ExecutionSettings) -> SearchSpace:
    """:data:`WIDE`, keeping a gradient sync the user set (any but the default ``end``) and
    adding per-op recompute under torchtitan."""
    space = WIDE
    if settings.gradient_sync != "end":
        space = replace(space, shardings=("settings",))
    if settings.stack == "torchtitan":
        space = replace(space, recomputes=(*space.recomputes, "op"))
    return space


def _shardings(space: SearchSpace, dp: int, settings: ExecutionSettings
               ) -> Iterator[tuple[int, int, str]]:
    """``(replicas, shard degree, gradient sync)`` of each sharding for ``dp`` data-parallel
    ranks."""
    seen: set[tuple[int, int, str]] = set()
    for kind in space.shardings:
        if kind == "settings":
            out = [(dp, 1, settings.gradient_sync)]
        elif kind == "ddp":
            out = [(dp, 1, "bucketed" if dp > 1 else "end")]
        elif kind == "zero1":
            out = [(dp, 1, "zero1")] if dp > 1 else []
        elif kind == "fsdp":
            out = [(1, dp, "sharded")] if dp > 1 else []
        else:  # hsdp
            out = [(dp // sh, sh, "sharded") for sh in (8, 64) if dp % sh == 0 and dp > sh]
        for item in out:
            if item not in seen:
                seen.add(item)
                yield item


def candidates(graph: Graph, topology: Topology, settings: ExecutionSettings, *,
               global_batch: int, devices: int | None = None,
               max_microbatch: int = 8, space: SearchSpace = SearchSpace()
               ) -> Iterator[tuple[ParallelConfig, ExecutionSettings]]:
    """Every layout of ``devices`` (default: all) for ``global_batch`` sequences: TP a
    divisor of the node size and of the heads, PP a divisor of the blocks (or, with
    ``space.uneven``, of the rest, split by :func:`~shardplan.ir.parallel.pipeline_split`),
    CP where ``space.context`` allows, DP the rest (which must divide the batch) held as
    each of ``space.shardings``, per-replica micro-batches of 1 to ``max_microbatch``, 1 to
    4 virtual stages when the blocks allow, each recompute level, sequence parallelism with
    TP. O(product of the choices)."""
    n = devices or topology.num_devices
    layout = block_layout(graph)
    dims = graph.meta.get("transformer") if isinstance(graph.meta, dict) else None
    heads = dims.get("heads") if isinstance(dims, dict) else None
    kv = dims.get("kv_heads") if isinstance(dims, dict) else None
    seq = dims.get("seq") if isinstance(dims, dict) else None
    node = node_size(topology)
    blocks = layout.num_blocks
    for tp in _divisors(min(node, n)):
        if any(isinstance(h, int) and h % tp for h in (heads, kv)):
            continue
        for pp in _divisors(n // tp):
            if pp > blocks or (blocks % pp and not space.uneven):
                continue
            for cp in _contexts(space, seq, n // (tp * pp)):
                dp = n // (tp * pp * cp)
                if global_batch % dp:
                    continue
                yield from _batching(layout, settings, space, tp, pp, cp, dp,
                                     global_batch // dp, max_microbatch,
                                     _expert_grids(dims, layout.has_experts, tp, cp * dp))


def _expert_grids(dims: Any, has_experts: bool, tp: int, rest: int
                  ) -> list[tuple[int, int | None]]:
    """``(ep, etp)`` choices of a mixture of experts on a pipeline rank of ``tp x rest``
    devices: EP a power of two dividing the experts, expert TP 1 or the dense layers' TP
    (None), ``ep x etp`` dividing the rank's devices; ``[(1, None)]`` for a dense model."""
    if not has_experts or not isinstance(dims, dict) or not isinstance(
            dims.get("experts"), int):
        return [(1, None)]
    experts, ffn = int(dims["experts"]), dims.get("moe_ffn")
    out: list[tuple[int, int | None]] = []
    ep = 1
    while ep <= experts:
        if experts % ep == 0:
            for etp in ((None, 1) if tp > 1 else (None,)):
                width = tp if etp is None else etp
                if (tp * rest) % (ep * width) == 0 and not (
                        isinstance(ffn, int) and ffn % width):
                    out.append((ep, etp))
        ep *= 2
    return out or [(1, None)]


def _contexts(space: SearchSpace, seq: Any, rest: int) -> list[int]:
    if not space.context or not isinstance(seq, int):
        return [1]
    return [c for c in (1, 2, 4, 8) if rest % c == 0 and seq % (2 * c) == 0
            and (c == 1 or seq // (2 * c) >= 1024)]


def _batching(layout: Any, settings: ExecutionSettings, space: SearchSpace, tp: int,
              pp: int, cp: int, dp: int, per_replica: int, max_microbatch: int,
              experts: Sequence[tuple[int, int | None]] = ((1, None),)
              ) -> Iterator[tuple[ParallelConfig, ExecutionSettings]]:
    """The micro-batch, virtual-stage, recompute, sequence-parallel and sharding choices of
    one TP x PP x CP x DP grid (:func:`candidates`)."""
    fixed = space.microbatches
    sizes = (1, 2, 4, 8, 16) if fixed is None else (
        (per_replica // fixed,) if per_replica % fixed == 0 else ())
    for mb in sizes:
        if (fixed is None and mb > max_microbatch) or per_replica % mb:
            continue
        m = per_replica // mb
        if pp > 1 and m < pp:
            continue
        for vp in (1, 2, 3, 4):
            if vp > 1 and (pp == 1 or m % pp):
                continue
            ok, split = pipeline_split(layout.num_blocks, pp, vp)
            if not ok or (split is not None and not space.uneven):
                continue
            for rc in space.recomputes:
                for sp in (space.sequence_parallel if tp > 1 else (False,)):
                    for (rep, shard, sync), (ep, etp) in itertools.product(
                            _shardings(space, dp, settings), experts):
                        yield (ParallelConfig(tp=tp, pp=pp, dp=rep, dp_shard=shard, cp=cp,
                                              vp=vp, stage_layers=split, ep=ep, etp=etp),
                               replace(settings, microbatch_size=mb * dp,
                                       microbatches=m, recompute=rc, gradient_sync=sync,
                                       schedule="interleaved-1f1b" if vp > 1 else "1f1b",
                                       virtual_stages=vp if vp > 1
                                       else settings.virtual_stages,
                                       sequence_parallel=sp))


#: The share of :func:`llm_search`'s time limit spent pricing candidates (the rest simulates
#: them in the order of their bounds).
PRICING_SHARE = 0.6


def llm_search(graph: Graph, topology: Topology, settings: ExecutionSettings, *,
               global_batch: int, time_limit: float = 60.0, devices: int | None = None,
               max_microbatch: int = 8,
               include: Sequence[tuple[ParallelConfig, ExecutionSettings]] = (),
               space: SearchSpace = SearchSpace()) -> LLMSearch:
    """The fastest layout of :func:`candidates` (and of ``include``: a user's own
    configuration, so the winner is never slower than it) that fits, by branch and bound in the
    simulator's price, within ``time_limit`` seconds (the best so far when it runs out).

    Every candidate is priced once (:func:`~shardplan.cost.llm_costs`: its memory, and a
    lower bound on its iteration, the busiest rank's compute and step); those that fit are
    simulated in the order of their bounds, and the search stops when the next bound is no
    better than the best simulated iteration: no candidate left can beat it, so the winner is
    the simulator's best of them all. O(candidates * (n + pp * vp)) plus one simulation
    per candidate whose bound is below the winner's time.

    Candidates are priced in the order of :func:`_promise` (a rough guess, never a price:
    it only decides what is priced first when the time runs out) and a candidate whose
    parameters, gradients and optimizer state alone exceed the devices' memory
    (:func:`_static_bytes`, a lower bound on what it holds) is recorded as not fitting
    without pricing. ``space`` (:class:`SearchSpace`) widens the knobs; the result says how
    many candidates there were and how many were priced."""
    from shardplan.simulate._llm import simulate_llm

    start = time.monotonic()
    capacity = float(topology.device_memory.min())
    priced: list[tuple[float, ParallelConfig, ExecutionSettings, Any, float]] = []
    ranked: list[LLMCandidate] = []
    considered = 0
    timed_out = False
    offered = sorted(candidates(graph, topology, settings, global_batch=global_batch,
                                devices=devices, max_microbatch=max_microbatch, space=space),
                     key=promise_key(graph, topology, global_batch))
    pool = itertools.chain(include, offered)
    params, experts = model_parameters(graph)
    seen: set[tuple[Any, ...]] = set()
    frugal_seen: dict[tuple[Any, ...], bool] = {}
    included = {(p, s) for p, s in include}
    for par, st in pool:
        key = (par, st)
        if key in seen:
            continue
        seen.add(key)
        if time.monotonic() - start > PRICING_SHARE * time_limit and key not in included:
            timed_out = True  # the rest of the time simulates what was priced
            break
        considered += 1
        out, fit = price_candidate(graph, topology, par, st, (params, experts, capacity),
                                   frugal_seen, must=key in included)
        if out is not None:
            ranked.append(out)
        if fit is not None:
            priced.append(fit)
    # the included layouts first (simulated whatever the time), then by their bounds
    priced.sort(key=lambda x: ((x[1], x[2]) not in included, x[0]))
    best = math.inf
    for bound, par, st, costs, mem in priced:
        mine = (par, st) in included
        if bound >= best and not mine:
            break  # every remaining candidate's bound is at least the winner's time
        if time.monotonic() - start > time_limit and not mine:
            timed_out = True
            break
        plan = layout_plan(graph, topology, par, st)
        res = simulate_llm(plan, graph, topology, plan.settings, timeline=False, costs=costs)
        best = min(best, res.iteration_seconds)
        ranked.append(LLMCandidate(par, st, res.iteration_seconds, mem, True))
    ranked.sort(key=lambda c: (not c.fits, c.iteration_seconds, c.peak_memory_bytes))
    return LLMSearch(tuple(ranked), time.monotonic() - start, timed_out, considered,
                     offered=len(offered) + len(included))


Priced = tuple[float, ParallelConfig, ExecutionSettings, Any, float]


def price_candidate(graph: Graph, topology: Topology, par: ParallelConfig,
                    st: ExecutionSettings, sizes: tuple[float, float, float],
                    frugal_seen: dict[tuple[Any, ...], bool], *, must: bool = False
                    ) -> tuple[LLMCandidate | None, Priced | None]:
    """One candidate of a search (:func:`llm_search`, and re-planning's): a candidate that
    does not fit (by :func:`_static_bytes`, its full-recompute sibling
    :func:`_frugal_fits`, or its priced device memory) as a ranked row, or one that fits as
    ``(lower bound, par, st, costs, memory)``; ``(None, None)`` for a layout that cannot
    run. ``sizes``: the model's parameters, its routed experts' and the devices' capacity;
    ``must``: the user's own layout, priced whatever the bounds say. O(n + pp vp)."""
    from shardplan.simulate._llm import lower_bound_seconds

    params, experts, capacity = sizes
    static = _static_bytes(params, par, st, experts)
    if static > capacity and not must:
        return LLMCandidate(par, st, math.inf, static, False), None
    frugal = _frugal_fits(frugal_seen, graph, topology, par, st, capacity)
    if frugal is not None and not frugal and not must:
        return LLMCandidate(par, st, math.inf, math.inf, False), None
    try:
        check_layout(graph, topology, par, st)
        costs = llm_costs(graph, topology, par, st)
    except ShardplanError:
        return None, None
    mem = float(costs.memory["device"].max())  # what the device holds
    if mem > capacity:
        return LLMCandidate(par, st, math.inf, mem, False), None
    return None, (lower_bound_seconds(costs, par), par, st, costs, mem)


def _frugal_fits(memo: dict[tuple[Any, ...], bool], graph: Graph, topology: Topology,
                 par: ParallelConfig, st: ExecutionSettings, capacity: float) -> bool | None:
    """Whether ``par`` under ``st`` with full recompute fits the devices (memoized per
    layout and settings but the recompute level), or None when ``st`` already recomputes
    fully or the layout cannot be priced. Full recompute keeps the least of any recompute
    level in the cost model (each block's input and one block's activations), so when it
    does not fit, no level does: the search records those siblings as not fitting without
    pricing them. One pricing per layout. O(n + pp vp)."""
    if st.recompute == "full":
        return None
    frugal = replace(st, recompute="full")
    key = (par, replace(frugal, recompute_every=1))
    if key not in memo:
        try:
            check_layout(graph, topology, par, frugal)
            mem = float(llm_costs(graph, topology, par, frugal).memory["device"].max())
        except ShardplanError:
            return None
        memo[key] = mem <= capacity
    return memo[key]


def _static_bytes(params: float, par: ParallelConfig, st: ExecutionSettings,
                  experts: float = 0.0) -> float:
    """A lower bound on what one device holds of parameters, gradients, master weights and
    optimizer state: the model's parameters spread evenly over TP x PP (a stage holds at
    least the mean), each at its bytes, divided as the layout shards them (the cost model's
    rules, :mod:`shardplan.cost._llm_memory`); of them, the routed experts' ``experts``
    spread over EP x ETP x PP and sharded over their own replicas. O(1)."""
    w, g, master = precision_bytes(st.precision)
    if st.grad_reduce == "fp32":
        g = 4
    state = OPTIMIZER_STATE[st.optimizer] * 4.0
    d = par.data_parallel * par.cp
    dense, routed = _per_device(params, experts, par)
    if par.dp_shard > 1 or st.gradient_sync == "sharded":
        shard = par.dp_shard * par.cp if par.dp_shard > 1 else d
        # FSDP2 in mixed precision keeps fp32 gradients and no half shard (4); others more
        per = (4 + master + state) if master else (w + g + state)
        return per * (dense / shard + routed / expert_shard(par, shard))
    opt_div = d if st.gradient_sync == "zero1" else 1
    return dense * (w + g + (master + state) / opt_div) + \
        routed * (w + g + (master + state) / expert_shard(par, opt_div))


def _per_device(params: float, experts: float, par: ParallelConfig) -> tuple[float, float]:
    """A device's share of the model's dense parameters (over TP x PP) and of its routed
    experts' (over PP x EP x ETP), at least the mean of a stage. O(1)."""
    return ((params - experts) / (par.tp * par.pp),
            experts / (par.pp * par.ep * par.expert_tp))


def model_parameters(graph: Graph) -> tuple[float, float]:
    """The graph's parameters and, of them, its routed experts' (elements). O(n)."""
    dtype_bytes = float(graph.meta.get("dtype_bytes", 4) if isinstance(graph.meta, dict)
                        else 4)
    return (float(graph.param_bytes.sum()) / dtype_bytes,
            float(graph.param_bytes[block_layout(graph).expert].sum()) / dtype_bytes)


#: Rough relative costs that order the candidates (:func:`_promise`): what recompute adds to
#: the backward, TP's exposed share per doubling, CP's per doubling.
_RECOMPUTE_COST = {"none": 0.0, "selective": 0.03, "op": 0.15, "full": 0.33}


def _promise(par: ParallelConfig, st: ExecutionSettings) -> float:
    """A rough guess of a layout's time relative to others of the same work, to price the
    likely best first: recompute's extra pass, the pipeline's bubble ``(pp - 1) / (m vp)``,
    tensor and context parallelism's communication, small micro-batches' thin products. It
    is never a price (:func:`llm_search`). O(1)."""
    bubble = (par.pp - 1) / max(1, st.microbatches * par.vp)
    per_replica = (st.microbatch_size or 1) // max(1, par.data_parallel)
    return ((1 + _RECOMPUTE_COST.get(st.recompute, 0.0)) * (1 + bubble)
            * (1 + 0.03 * math.log2(par.tp)) * (1 + 0.03 * math.log2(par.cp))
            * (1 + 0.02 * math.log2(par.ep))
            * (1 + 0.05 / max(1, per_replica)))


def promise_key(graph: Graph, topology: Topology, global_batch: int
                ) -> Callable[[tuple[ParallelConfig, ExecutionSettings]], float]:
    """The order :func:`llm_search` prices candidates in: :func:`_promise`, stretched by
    how long a layout's data-parallel traffic (:func:`_dp_traffic`) would take over one
    device's network link against the iteration's compute at half the device's peak (a
    guess at both, never a price: FSDP that gathers a 671B mixture every micro-batch is
    priced after the layouts that do not). O(1) per candidate."""
    dims = graph.meta.get("transformer") if isinstance(graph.meta, dict) else None
    dims = dims if isinstance(dims, dict) else {}
    params, experts = model_parameters(graph)
    active = float(dims.get("active_parameters") or params)
    tokens = float(global_batch) * float(dims.get("seq") or graph.batch_size or 1)
    n = topology.num_devices
    link = float(topology.bandwidth[0, n - 1]) if n > 1 else math.inf
    rate = 0.5 * float(topology.devices[0].flops)

    def key(c: tuple[ParallelConfig, ExecutionSettings]) -> float:
        par, st = c
        compute = 6.0 * active * tokens / par.world_size / rate
        traffic = _dp_traffic(params, experts, par, st) / link
        return _promise(par, st) * (1.0 + traffic / max(compute, 1e-12))

    return key


def _dp_traffic(params: float, experts: float, par: ParallelConfig,
                st: ExecutionSettings) -> float:
    """Bytes one device sends per iteration for data parallelism, roughly: its parameters
    (the routed experts' over EP x ETP) gathered twice per micro-batch and reduced once
    under FSDP, reduced and gathered once under ZeRO-1, all-reduced once otherwise; none
    without replicas. O(1)."""
    if par.data_parallel * par.cp == 1:
        return 0.0
    per = sum(_per_device(params, experts, par))
    w = float(precision_bytes(st.precision)[0])
    if par.dp_shard > 1 or st.gradient_sync == "sharded":
        return per * w * (2.0 * st.microbatches + 1.0)
    return per * w * 2.0


def knobs(parallel: ParallelConfig, settings: ExecutionSettings) -> dict[str, Any]:
    """What a Megatron-LM or torchtitan user sets, by name: degrees, micro-batch per replica,
    schedule, virtual stages, recompute, sequence parallelism, gradient sync."""
    per_replica = (settings.microbatch_size or 0) // max(1, parallel.data_parallel)
    out = {"TP": parallel.tp, "PP": parallel.pp, "DP": parallel.dp,
           "FSDP": parallel.dp_shard, "CP": parallel.cp, "VP": parallel.vp,
           "micro-batch": per_replica, "micro-batches": settings.microbatches,
           "schedule": settings.schedule if parallel.pp > 1 else "none",
           "recompute": settings.recompute,
           "sequence parallel": settings.sequence_parallel,
           "gradient sync": settings.gradient_sync}
    if parallel.is_expert_parallel:  # a mixture of experts' own grid
        out.update({"EP": parallel.ep, "ETP": parallel.expert_tp})
    return out


def moved_knobs(before: tuple[ParallelConfig, ExecutionSettings],
                after: tuple[ParallelConfig, ExecutionSettings]) -> list[str]:
    """``["TP 8 -> 4", "recompute full -> selective", ...]``: the knobs that differ."""
    a, b = knobs(*before), knobs(*after)
    return [f"{k} {a[k]} -> {b[k]}" for k in a if a[k] != b[k]]


def baseline_comparison(baseline: Plan, graph: Graph, topology: Topology,
                        found: LLMSearch) -> dict[str, Any]:
    """The user's own LLM plan simulated beside the search's winner: both times, the
    speed-up and the knobs the winner moved. Raises when the baseline is not an LLM plan."""
    if baseline.parallel is None:
        raise ShardplanError("--baseline must be an LLM plan (a plan with a 'parallel' "
                             "layout, as 'shardplan import' writes)")
    res = simulate(baseline, graph, topology, timeline=False)
    out: dict[str, Any] = {"baseline": baseline.parallel.label(),
                           "baseline_seconds": res.iteration_seconds,
                           "baseline_fits": res.fits_memory}
    best = found.best
    if best is not None:
        out.update(winner=best.parallel.label(), winner_seconds=best.iteration_seconds,
                   speedup=res.iteration_seconds / best.iteration_seconds
                   if best.iteration_seconds > 0 else math.inf,
                   moved=moved_knobs((baseline.parallel, baseline.settings),
                                     (best.parallel, best.settings)))
    return out


#: Rows of the LLM family handed to ``shardplan plan``'s ranking (the best that fit, and any
#: included configuration).
LLM_ROWS = 20


def has_blocks(graph: Graph) -> bool:
    """Whether the graph is a transformer the LLM plan kind can lay out (``layers.N``
    modules)."""
    try:
        block_layout(graph)
    except ShardplanError:
        return False
    return True


def family_rows(graph: Graph, topology: Topology, settings: ExecutionSettings, *,
                global_batch: int, time_limit: float,
                include: Sequence[tuple[ParallelConfig, ExecutionSettings]] = (),
                microbatches: int | None = None) -> list[dict[str, Any]]:
    """The LLM family of ``shardplan plan``: :func:`llm_search`'s best :data:`LLM_ROWS`
    candidates that fit, and the included configurations, as dicts of the ranking's row
    fields (the planner wraps them), each with its plan. ``microbatches``: the count the
    user fixed (:class:`SearchSpace`)."""
    space = replace(wide_space(settings), microbatches=microbatches)
    found = llm_search(graph, topology, settings, global_batch=global_batch,
                       time_limit=time_limit, include=include, space=space)
    if found.offered == 0:
        fixed = (f", and --microbatches {microbatches} dividing each replica's share"
                 if microbatches else "")
        raise ShardplanError(
            f"no layout uses exactly the {topology.num_devices} GPUs: tp x cp x pp x dp must "
            f"take them all, tp within a node, dp dividing the global batch of "
            f"{global_batch}{fixed} (--gpus N plans on fewer; shardplan replan leaves some "
            f"idle)")
    keep = [c for c in found.ranked if c.fits][:LLM_ROWS]
    mine = {(p, s) for p, s in include}
    keep += [c for c in found.ranked if (c.parallel, c.settings) in mine and c not in keep]
    rows = []
    for c in keep:
        plan = layout_plan(graph, topology, c.parallel, c.settings,
                           objective=Objective(OBJECTIVE, c.iteration_seconds),
                           search_seconds=found.seconds)
        own = (c.parallel, c.settings) in mine
        note = c.parallel.label() + (" (your configuration)" if own else "")
        if found.timed_out:  # say what was not evaluated
            note += f" (priced {found.considered} of {found.offered} layouts in the limit)"
        rows.append({"stages": c.parallel.num_stages, "replicas": c.parallel.devices_per_rank,
                     "schedule": c.settings.schedule, "microbatches": c.settings.microbatches,
                     "mapping": c.parallel.label(), "gradient_sync": c.settings.gradient_sync,
                     "iteration_seconds": c.iteration_seconds,
                     "throughput": global_batch / c.iteration_seconds
                     if c.fits and c.iteration_seconds > 0 else 0.0,
                     "peak_memory_bytes": c.peak_memory_bytes, "fits": c.fits,
                     "search_seconds": found.seconds, "plan": plan.to_dict(), "note": note,
                     "objective_value": c.iteration_seconds, "timed_out": found.timed_out})
    return rows
