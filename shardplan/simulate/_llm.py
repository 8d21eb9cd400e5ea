"""One training iteration of an LLM plan (tensor x pipeline x data / fully sharded).

The devices of an LLM plan's pipeline rank all do the same work at the same time (its
tensor-parallel ranks split each operator, its data-parallel replicas each take their share of
the micro-batch), so the iteration is simulated once per pipeline rank, on the rank's schedule
(:mod:`shardplan.ir.schedule`: GPipe, 1F1B, or interleaved 1F1B with ``vp`` virtual stages on
the same devices), with the per-micro-batch times of :func:`shardplan.cost.llm_costs` (the one
price of this plan kind):

- a forward of (virtual stage j, micro-batch m) starts when its rank is free and the
  activations of (j - 1, m) have arrived (the message of ``send_seconds``; free on the same
  rank); a backward when the gradient of (j + 1, m) has arrived;
- data parallelism: each virtual stage's gradient reduction runs on the rank's communication
  stream, one after the other; with ``gradient_sync`` ``bucketed``, ``zero1`` or ``sharded``
  it starts when the stage's last backward ends (Megatron's ``--overlap-grad-reduce``, FSDP's
  reduce-scatter after each backward), with ``end`` after the rank's last computation;
  under ``zero1`` with ``overlap_grad_reduce`` Megatron-Core's buckets
  (:func:`megatron_bucket`) start during the stage's last backward, as their gradients are
  ready: the reduction starts once the first bucket's share of that backward has run and
  ends no sooner than the last bucket's reduction after it;
- FSDP (``dp_shard > 1`` or ``sharded``): each forward and backward gathers the stage's
  parameters unit by unit (blocks, or modules under ``shard_unit`` ``module``), the next
  unit's gather prefetched under the current unit's compute, so an action takes
  ``max(compute, gather) + gather / units`` (the first unit's gather is never hidden); when
  the stack keeps them gathered between micro-batches (``LLMCosts.gathers_once``:
  torchtitan under a pipeline) only each stage's first forward gathers;
- the step: the optimizer over the rank's (sharded) parameters after the last reduction;
  under ZeRO-1 the updated parameters are then all-gathered, exposed, or with
  ``overlap_param_gather`` (Megatron's ``--overlap-param-gather``) bucket by bucket under
  the next iteration's first forward of each of the rank's stages: only the first bucket's
  gather and what those forwards do not cover stay exposed.

Context parallelism's ring exchange of keys and values is not priced yet (its compute split is).
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache
from typing import Any

import numpy as np

from shardplan.cost._llm import LLMCosts, llm_costs
from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, ParallelConfig, Plan, Topology
from shardplan.ir.schedule import BACKWARD, FORWARD, REDUCE_GRAD, Schedule, make_schedule
from shardplan.simulate.result import Interval, SimulationResult

__all__ = ["llm_schedule", "lower_bound_seconds", "simulate_llm"]


@lru_cache(maxsize=64)
def llm_schedule(pp: int, vp: int, microbatches: int, name: str) -> Schedule:
    """The schedule an LLM plan runs: interleaved 1F1B over ``pp`` ranks when ``vp > 1``,
    else ``name`` (``gpipe`` or ``1f1b``) over ``pp`` stages."""
    if vp > 1:
        return make_schedule("interleaved-1f1b", pp * vp, microbatches, virtual_stages=vp)
    return make_schedule("1f1b" if name == "interleaved-1f1b" else name, pp, microbatches)


#: Megatron-Core's default gradient bucket (``DistributedDataParallelConfig.bucket_size``
#: None): ``max(40,000,000, 1,000,000 x data-parallel size)`` parameters
#: (``megatron/core/distributed/distributed_data_parallel.py``).
MEGATRON_BUCKET_PARAMS = 40_000_000


MEGATRON_BUCKET_PER_RANK = 1_000_000


def megatron_bucket(costs: LLMCosts, par: ParallelConfig, settings: ExecutionSettings
                    ) -> np.ndarray:
    """Per virtual stage, the share of its parameters one Megatron-Core bucket holds under
    ``zero1`` (else 1: one unit). A stage's parameters per device are its gradient bytes
    over the bytes per gradient. O(pp vp)."""
    out = np.ones(par.num_stages)
    if settings.gradient_sync != "zero1":
        return out
    g_bytes = 4.0 if settings.grad_reduce == "fp32" else float(settings.param_dtype_bytes)
    params = np.asarray(costs.grad_bytes, dtype=np.float64) / g_bytes
    size = max(MEGATRON_BUCKET_PARAMS, MEGATRON_BUCKET_PER_RANK * par.data_parallel * par.cp)
    np.divide(size, params, out=out, where=params > size)
    return out


def simulate_llm(plan: Plan, graph: Graph, topology: Topology,
                 settings: ExecutionSettings, *, timeline: bool = True,
                 costs: LLMCosts | None = None) -> SimulationResult:
    """Simulate one iteration of an LLM plan (module docstring). O(pp * vp * M).

    ``costs``: the plan's :func:`~shardplan.cost.llm_costs` when the caller has them already
    (a search that checked memory first); computed here otherwise.

    Raises
    ------
    ShardplanError
        A layout that does not fit the graph or topology, or a schedule that does not fit
        the micro-batches.
    """
    par = plan.parallel
    if par is None:
        raise ShardplanError("not an LLM plan (it has no 'parallel' layout)")
    settings = settings.resolve(graph)
    if costs is None:
        costs = llm_costs(graph, topology, par, settings)
    pp, vp, s_count = par.pp, par.vp, par.num_stages
    m_count = settings.microbatches
    sch = llm_schedule(pp, vp, m_count, settings.schedule)
    gs = settings.gradient_sync
    fsdp = par.dp_shard > 1 or gs == "sharded"
    overlapped = gs in ("bucketed", "zero1", "sharded") or fsdp
    units = costs.gather_units

    def duration(j: int, op: str, m: int = 0, alone: bool = False) -> float:
        compute = float(costs.forward[j] if op == FORWARD else costs.backward[j])
        extra = costs.alone_forward if op == FORWARD else costs.alone_backward
        if alone and extra is not None:
            compute += float(extra[j])
        if not fsdp or par.data_parallel <= 1:
            return compute
        if costs.gathers_once and not (op == FORWARD and m == 0):
            return compute  # the stage's parameters stay gathered after its first forward
        g = float(costs.param_gather_seconds[j])
        return max(compute, g) + g / float(units[j])

    rank_of = [j % pp for j in range(s_count)]
    f_done = np.full((s_count, m_count), np.nan)
    b_done = np.full((s_count, m_count), np.nan)
    clock = np.zeros(pp)
    stream = np.zeros(pp)
    busy = np.zeros(pp)
    reduce_at: list[list[tuple[int, float]]] = [[] for _ in range(pp)]
    heads = [0] * pp
    intervals: list[Interval] = []
    first_dev = [r * par.devices_per_rank for r in range(pp)]

    def ready(r: int, act: Any) -> float | None:
        j, m = act.stage, act.microbatch
        if act.op == FORWARD:
            if j == 0:
                return 0.0
            t = f_done[j - 1, m]
            if math.isnan(t):
                return None
            return float(t) + (float(costs.send_seconds[j - 1]) if rank_of[j - 1] != r
                               else 0.0)
        if act.op == BACKWARD:
            if math.isnan(f_done[j, m]):
                return None
            if j == s_count - 1:
                return float(f_done[j, m])
            t = b_done[j + 1, m]
            if math.isnan(t):
                return None
            return float(t) + (float(costs.send_seconds[j]) if rank_of[j + 1] != r else 0.0)
        return 0.0

    alone = [_unpaired(acts) for acts in sch.ranks]
    remaining = sum(len(a) for a in sch.ranks)
    while remaining:
        progressed = False
        for r in range(pp):
            acts = sch.ranks[r]
            while heads[r] < len(acts):
                act = acts[heads[r]]
                if act.op == REDUCE_GRAD:
                    reduce_at[r].append((act.stage, float(clock[r])))
                    heads[r] += 1
                    remaining -= 1
                    progressed = True
                    continue
                if act.op not in (FORWARD, BACKWARD):
                    raise ShardplanError(f"the LLM simulator runs F and B actions, not "
                                         f"{act.op!r}")
                t = ready(r, act)
                if t is None:
                    break
                start = max(float(clock[r]), t)
                dur = duration(act.stage, act.op, act.microbatch or 0,
                               heads[r] in alone[r])
                end = start + dur
                (f_done if act.op == FORWARD else b_done)[act.stage, act.microbatch] = end
                clock[r] = end
                busy[r] += dur
                if timeline:
                    intervals.append(Interval(first_dev[r], start, end, act.op, act.stage,
                                              act.microbatch))
                heads[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ShardplanError("the LLM plan's schedule deadlocks")

    pipeline = float(clock.max())
    finish = np.zeros(pp)
    ar_seconds = np.zeros(s_count)
    opt = costs.optimizer_seconds
    bucket = megatron_bucket(costs, par, settings)
    for r in range(pp):
        t_stream = 0.0
        for j, t in reduce_at[r]:
            sync = float(costs.grad_sync_seconds[j])
            start = max(t if overlapped else float(clock[r]), t_stream)
            if settings.overlap_grad_reduce and bucket[j] < 1.0:
                # buckets reduce as the last backward makes them ready
                last = duration(j, BACKWARD, m_count - 1)
                start = max(t - last * (1.0 - bucket[j]), t_stream)
                t_stream = max(start + sync, t + bucket[j] * sync)
            else:
                t_stream = start + sync
            ar_seconds[j] = sync
            if timeline and costs.grad_sync_seconds[j] > 0:
                intervals.append(Interval(first_dev[r], start, t_stream, "allreduce", j))
        stream[r] = t_stream
        step_start = max(float(clock[r]), t_stream)
        t_end = step_start + float(opt[r])
        if timeline:
            intervals.append(Interval(first_dev[r], step_start, t_end, "OPT", r))
        if gs == "zero1" and par.data_parallel > 1:
            mine = range(r, s_count, pp)
            gather = sum(float(costs.param_gather_seconds[j]) for j in mine)
            if settings.overlap_param_gather:
                # under the next iteration's first forwards, bucket by bucket: the first
                # bucket's gather and what the forwards do not cover stay exposed
                first = gather * min(1.0, min(float(bucket[j]) for j in mine))
                covered = sum(duration(j, FORWARD, 0) for j in mine)
                gather = first + max(0.0, gather - first - covered)
            t_end += gather
        finish[r] = t_end
    iteration = float(finish.max())

    per_rank_work = np.zeros(pp)
    for j in range(s_count):
        per_rank_work[j % pp] += duration(j, FORWARD) + duration(j, BACKWARD)
    n_dev = par.world_size
    devices = tuple(range(n_dev))
    rank_of_dev = np.arange(n_dev) // par.devices_per_rank
    capacity = topology.device_memory
    samples = int(settings.global_batch or m_count * graph.batch_size)
    bubble = 1.0 - float(busy.sum()) / (pp * pipeline) if pipeline > 0 else 0.0
    opts = settings.to_dict()
    opts.update(num_microbatches=m_count, schedule=sch.name, virtual_stages=vp,
                parallel=par.to_dict())
    return SimulationResult(
        schedule=sch, stage_order=tuple(range(s_count)), num_microbatches=m_count,
        num_replicas=par.devices_per_rank, samples_per_iteration=samples,
        iteration_seconds=iteration, pipeline_seconds=pipeline,
        throughput=samples / iteration if iteration > 0 else math.inf,
        bubble_fraction=float(max(0.0, bubble)), devices=devices,
        # per device by NumPy: 16,384 devices are 80,000 Python floats per simulation
        busy_seconds=tuple(np.asarray(busy, dtype=np.float64)[rank_of_dev].tolist()),
        peak_memory_bytes=tuple(_per_device(costs.memory["total"], rank_of_dev)),
        reserved_memory_bytes=tuple(_per_device(costs.memory["reserved"], rank_of_dev)),
        device_memory_bytes=tuple(_per_device(costs.memory["device"], rank_of_dev)),
        memory_capacity_bytes=tuple(np.asarray(capacity, dtype=np.float64)[:n_dev].tolist()),
        allreduce_seconds=tuple(float(x) for x in ar_seconds),
        optimizer_seconds=float(opt.max()),
        ideal_seconds=float(m_count * per_rank_work.max()),
        intervals=tuple(sorted(intervals, key=lambda iv: (iv.start, iv.device, iv.end)))
        if timeline else (),
        options=opts,
    )


def _unpaired(actions: tuple[Any, ...]) -> frozenset[int]:
    """Indices of a rank's forwards and backwards that run without the other pass beside
    them: a forward not followed by a backward, a backward not preceded by a forward (a
    1F1B pipeline's warm-up and cool-down; Megatron-Core's expert-parallel overlap merges
    each steady-state forward with the backward after it). O(len(actions))."""
    passes = [i for i, a in enumerate(actions) if a.op in (FORWARD, BACKWARD)]
    paired: set[int] = set()
    for i, k in itertools.pairwise(passes):
        if actions[i].op == FORWARD and actions[k].op == BACKWARD:
            paired.update((i, k))
    return frozenset(passes) - paired


def _per_device(per_rank: np.ndarray, rank_of_dev: np.ndarray) -> list[float]:
    """A per pipeline rank quantity for every device (the floats ``float()`` gives)."""
    return np.asarray(per_rank, dtype=np.float64)[rank_of_dev].tolist()


def lower_bound_seconds(costs: LLMCosts, parallel: ParallelConfig) -> float:
    """A lower bound on :func:`simulate_llm`'s iteration: the busiest pipeline rank's compute
    (every micro-batch's forward and backward of its virtual stages, at least what the
    simulator charges) followed by its optimizer step. O(pp * vp)."""
    work = np.zeros(parallel.pp)
    for j in range(parallel.num_stages):
        work[j % parallel.pp] += float(costs.forward[j] + costs.backward[j])
    return float((work * costs.microbatches + costs.optimizer_seconds).max())
