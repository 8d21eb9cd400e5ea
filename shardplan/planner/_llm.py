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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from shardplan.cost._llm import block_layout, llm_costs
from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, Objective, ParallelConfig, Plan, Topology
from shardplan.ir.settings import RECOMPUTES
from shardplan.simulate import SimulationResult, simulate
from shardplan.strategy.llm import OBJECTIVE, check_layout, layout_plan

__all__ = ["LLM_ROWS", "LLMCandidate", "LLMSearch", "baseline_comparison", "candidates",
           "family_rows", "has_blocks", "knobs", "llm_plan", "llm_search", "moved_knobs",
           "node_size"]


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

    @property
    def best(self) -> LLMCandidate | None:
        return next((c for c in self.ranked if c.fits), None)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(graph: Graph, topology: Topology, settings: ExecutionSettings, *,
               global_batch: int, devices: int | None = None,
               max_microbatch: int = 8) -> Iterator[tuple[ParallelConfig, ExecutionSettings]]:
    """Every layout of ``devices`` (default: all) for ``global_batch`` sequences: TP a
    divisor of the node size and of the heads, PP a divisor of the blocks, DP the rest (which
    must divide the batch), per-replica micro-batches of 1 to ``max_microbatch``, 1 to 4
    virtual stages when the blocks allow, each recompute level, sequence parallelism with
    TP. O(product of the choices)."""
    n = devices or topology.num_devices
    layout = block_layout(graph)
    dims = graph.meta.get("transformer") if isinstance(graph.meta, dict) else None
    heads = dims.get("heads") if isinstance(dims, dict) else None
    kv = dims.get("kv_heads") if isinstance(dims, dict) else None
    node = node_size(topology)
    for tp in _divisors(min(node, n)):
        if any(isinstance(h, int) and h % tp for h in (heads, kv)):
            continue
        for pp in _divisors(n // tp):
            if layout.num_blocks % pp:
                continue
            dp = n // (tp * pp)
            if global_batch % dp:
                continue
            per_replica = global_batch // dp
            for mb in (1, 2, 4, 8, 16):
                if mb > max_microbatch or per_replica % mb:
                    continue
                m = per_replica // mb
                if pp > 1 and m < pp:
                    continue
                for vp in (1, 2, 3, 4):
                    if vp > 1 and (pp == 1 or layout.num_blocks % (pp * vp) or m % pp):
                        continue
                    for rc in RECOMPUTES:
                        for sp in ((False, True) if tp > 1 else (False,)):
                            yield (ParallelConfig(tp=tp, pp=pp, dp=dp, vp=vp),
                                   replace(settings, microbatch_size=mb * dp,
                                           microbatches=m, recompute=rc,
                                           schedule="interleaved-1f1b" if vp > 1
                                           else "1f1b",
                                           virtual_stages=vp if vp > 1
                                           else settings.virtual_stages,
                                           sequence_parallel=sp))


#: The share of :func:`llm_search`'s time limit spent pricing candidates (the rest simulates
#: them in the order of their bounds).
PRICING_SHARE = 0.6


def llm_search(graph: Graph, topology: Topology, settings: ExecutionSettings, *,
               global_batch: int, time_limit: float = 60.0, devices: int | None = None,
               max_microbatch: int = 8,
               include: Sequence[tuple[ParallelConfig, ExecutionSettings]] = ()
               ) -> LLMSearch:
    """The fastest layout of :func:`candidates` (and of ``include``: a user's own
    configuration, so the winner is never slower than it) that fits, by branch and bound in the
    simulator's price, within ``time_limit`` seconds (the best so far when it runs out).

    Every candidate is priced once (:func:`~shardplan.cost.llm_costs`: its memory, and a
    lower bound on its iteration, the busiest rank's compute and step); those that fit are
    simulated in the order of their bounds, and the search stops when the next bound is no
    better than the best simulated iteration: no candidate left can beat it, so the winner is
    the simulator's best of them all. O(candidates * (n + pp * vp)) plus one simulation
    per candidate whose bound is below the winner's time."""
    from shardplan.simulate._llm import lower_bound_seconds, simulate_llm

    start = time.monotonic()
    capacity = float(topology.device_memory.min())
    priced: list[tuple[float, ParallelConfig, ExecutionSettings, Any, float]] = []
    ranked: list[LLMCandidate] = []
    considered = 0
    timed_out = False
    pool = itertools.chain(include, candidates(graph, topology, settings,
                                               global_batch=global_batch, devices=devices,
                                               max_microbatch=max_microbatch))
    seen: set[tuple[Any, ...]] = set()
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
        try:
            check_layout(graph, topology, par, st)
            costs = llm_costs(graph, topology, par, st)
        except ShardplanError:
            continue
        mem = float(costs.memory["device"].max())  # what the device holds
        if mem > capacity:
            ranked.append(LLMCandidate(par, st, math.inf, mem, False))
            continue
        priced.append((lower_bound_seconds(costs, par), par, st, costs, mem))
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
    return LLMSearch(tuple(ranked), time.monotonic() - start, timed_out, considered)


def knobs(parallel: ParallelConfig, settings: ExecutionSettings) -> dict[str, Any]:
    """What a Megatron-LM or torchtitan user sets, by name: degrees, micro-batch per replica,
    schedule, virtual stages, recompute, sequence parallelism, gradient sync."""
    per_replica = (settings.microbatch_size or 0) // max(1, parallel.data_parallel)
    return {"TP": parallel.tp, "PP": parallel.pp, "DP": parallel.dp,
            "FSDP": parallel.dp_shard, "CP": parallel.cp, "VP": parallel.vp,
            "micro-batch": per_replica, "micro-batches": settings.microbatches,
            "schedule": settings.schedule if parallel.pp > 1 else "none",
            "recompute": settings.recompute,
            "sequence parallel": settings.sequence_parallel,
            "gradient sync": settings.gradient_sync}


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
                include: Sequence[tuple[ParallelConfig, ExecutionSettings]] = ()
                ) -> list[dict[str, Any]]:
    """The LLM family of ``shardplan plan``: :func:`llm_search`'s best :data:`LLM_ROWS`
    candidates that fit, and the included configurations, as dicts of the ranking's row
    fields (the planner wraps them), each with its plan."""
    found = llm_search(graph, topology, settings, global_batch=global_batch,
                       time_limit=time_limit, include=include)
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
